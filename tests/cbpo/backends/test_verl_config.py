"""The verl config the suite generates (cbpo/backends/verl/config.py) passes verl's own checks
for every training method under the paper preset, and carries the suite's settings."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from cbpo import schema
from cbpo.backends.verl import config as verl_config
from cbpo.registry import get_method

pytest.importorskip("verl")

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
TRAINING = [p.stem for p in sorted((CONFIGS / "method").glob("*.yaml")) if get_method(p.stem).trains]

# the methods whose advantage verl's own estimator computes (each declares it at registration);
# the others run on the suite's credit
VERL_ESTIMATORS = {"grpo": "grpo", "gspo": "grpo", "dapo": "grpo", "reinforce_pp": "reinforce_plus_plus"}


def generated(tmp_path, *overrides):
    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["preset=paper", "backend=verl", *overrides])
    schema.validate(cfg)
    return verl_config.build(cfg, schema.method_config(cfg), schema.settings(cfg, "rl"), schema.settings(cfg, "verl"),
                             str(tmp_path / "train.parquet"), tmp_path)


@pytest.mark.parametrize("method", TRAINING)
def test_paper_preset_validates_against_verls_schema_for_every_method(tmp_path, method):
    extra = ["method.teacher=some/teacher"] if method == "opd" else []
    v = generated(tmp_path, f"method={method}", *extra)
    actor, rollout = v.actor_rollout_ref.actor, v.actor_rollout_ref.rollout
    assert rollout.n == 16 and v.data.train_batch_size == 32  # M slots, problems per step
    assert v.algorithm.adv_estimator == VERL_ESTIMATORS.get(method, verl_config.SUITE_CREDIT)
    assert rollout.agent.default_agent_loop == verl_config.AGENT_LOOP
    assert v.data.train_batch_size % rollout.agent.num_workers == 0  # no problem's group is split over workers
    assert actor.policy_loss.loss_mode == {"gspo": "gspo", "aepo": "aepo_entropy_balanced_clip"}.get(method, "vanilla")
    assert (v.trainer.nnodes, v.trainer.n_gpus_per_node) == (1, 8)
    assert v.distillation.enabled == (method == "opd")  # only OPD's advantage is verl's distillation's


def test_method_objective_reaches_verls_actor(tmp_path):
    actor = generated(tmp_path, "method=dapo").actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert actor.use_kl_loss is False
    actor = generated(tmp_path, "method=cbpo", "method.beta=0.01").actor_rollout_ref.actor
    assert actor.use_kl_loss is True and actor.kl_loss_coef == 0.01 and actor.kl_loss_type == "low_var_kl"
    assert actor.optim.lr == 1e-6


def test_opd_is_verls_on_policy_distillation_from_its_teacher(tmp_path):
    from verl.experimental.teacher_loop.teacher_manager import AsyncTeacherLLMServerManager
    from verl.utils.config import omega_conf_to_dataclass

    v = generated(tmp_path, "method=opd", "method.teacher=Qwen/Qwen3-32B")
    d = v.distillation
    loss = d.distillation_loss
    # A_t = -(log pi_S - log pi_T) in verl's vanilla PPO loss, nothing from the task reward, no clamps
    assert (loss.loss_mode, loss.use_policy_gradient, loss.use_task_rewards) == ("k1", True, False)
    assert loss.loss_max_clamp is None and loss.log_prob_min_clamp is None
    assert (loss.clip_ratio, loss.clip_ratio_low, loss.clip_ratio_high) == (0.2, 0.2, 0.2)  # OPD's clip
    assert v.actor_rollout_ref.actor.loss_agg_mode == "token-mean" and not v.actor_rollout_ref.actor.use_kl_loss
    (teacher,) = d.teacher_models.values()
    assert teacher.model_path == "Qwen/Qwen3-32B" and teacher.inference.tensor_model_parallel_size == 4
    assert (d.n_gpus_per_node, d.nnodes) == (8, 1)  # the teacher's own node, beside the 8 training GPUs
    # the run's metrics lines count both for the tables' device-hours; another method holds its 8 only
    assert verl_config.held_gpus(v) == 16 and verl_config.held_gpus(generated(tmp_path, "method=grpo")) == 8
    # as verl's trainer reads it: two replicas, and every row routed to the one teacher
    checked = omega_conf_to_dataclass(d)
    assert [t.num_replicas for t in checked.teacher_models.values()] == [2]
    manager = AsyncTeacherLLMServerManager(v, {key: None for key in checked.teacher_models})
    assert {manager._resolve_teacher_key(source) for source in ("math", "search", "", None)} == set(checked.teacher_models)


def test_one_step_off_policy_is_verls_trainer_on_a_rollout_pool_of_its_own(tmp_path):
    sync = generated(tmp_path, "method=cbpo")
    assert sync.actor_rollout_ref.hybrid_engine and not sync.algorithm.rollout_correction.bypass_mode  # off: as before
    v = generated(tmp_path, "method=cbpo", "rl.async_training=one_step_off")  # verl.async_rollout_gpus=4
    rollout = v.actor_rollout_ref.rollout
    assert not v.actor_rollout_ref.hybrid_engine
    assert (v.trainer.nnodes, v.trainer.n_gpus_per_node, rollout.nnodes, rollout.n_gpus_per_node) == (1, 4, 1, 4)
    assert verl_config.held_gpus(v) == 8  # the node, split between the actor and the servers
    # as verl's one_step_off_ppo_trainer.yaml: servers keep their cache and return log-probs, which
    # are pi_old (bypass mode), and weights go over the NCCL checkpoint engine
    assert not rollout.free_cache_engine and rollout.calculate_log_probs and rollout.checkpoint_engine.backend == "nccl"
    assert v.algorithm.rollout_correction.bypass_mode
    assert v.data.dataloader_num_workers == 0 and sync.data.dataloader_num_workers == 8  # verl's default kept


@pytest.mark.parametrize("overrides", [["verl.async_rollout_gpus=8"], ["verl.async_rollout_gpus=3", "verl.tensor_parallel=2"]])
def test_one_step_off_policy_leaves_the_actor_gpus(tmp_path, overrides):
    with pytest.raises(ValueError, match="verl.async_rollout_gpus"):
        generated(tmp_path, "rl.async_training=one_step_off", *overrides)


def test_a_local_teacher_is_passed_to_verl_by_its_absolute_path(tmp_path, monkeypatch):
    # the teacher's servers run in other processes, maybe on another node
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "teacher").mkdir(parents=True)
    v = generated(tmp_path, "method=opd", "method.teacher=runs/teacher")
    assert v.distillation.teacher_models.teacher_model.model_path == str(tmp_path / "runs" / "teacher")


def test_opd_without_a_teacher_is_refused(tmp_path):
    with pytest.raises(ValueError, match="opd needs a teacher"):
        generated(tmp_path, "method=opd")


@pytest.mark.parametrize(("overrides", "pool"), [([], (8, 1)), (["verl.teacher_gpus=16"], (8, 2)),
                                                 (["verl.teacher_gpus=4"], (4, 1)),
                                                 (["verl.teacher_gpus=12"], None),
                                                 (["verl.teacher_tensor_parallel=3"], None)])
def test_the_teacher_pool_is_whole_nodes_or_part_of_one(tmp_path, overrides, pool):
    if pool is None:
        with pytest.raises(ValueError, match="verl.teacher_gpus"):
            generated(tmp_path, "method=opd", "method.teacher=t", *overrides)
        return
    d = generated(tmp_path, "method=opd", "method.teacher=t", *overrides).distillation
    assert (d.n_gpus_per_node, d.nnodes) == pool


def test_the_suite_task_runner_gives_the_teacher_its_resource_pool(tmp_path, monkeypatch):
    """What the task runner (trainer.py) hands the trainer: verl's resource pools for the
    generated OPD config, the teacher's beside the actor's."""
    from types import SimpleNamespace

    from verl.trainer.ppo.ray_trainer import Role

    from cbpo.backends.verl import trainer

    class Built(Exception):
        pass

    def trainer_built(**kwargs):
        raise Built(kwargs["resource_pool_manager"])

    v = generated(tmp_path, "method=opd", "method.teacher=t")
    (tmp_path / "verl").mkdir()
    OmegaConf.save(OmegaConf.create({"wandb": {}}), tmp_path / "verl" / trainer.SUITE_CONFIG)
    stub = SimpleNamespace(tokenizer=[], processor=None)
    for name, value in [("omega_conf_to_dataclass", lambda *_: stub), ("create_rl_dataset", lambda *_, **__: None),
                        ("create_rl_sampler", lambda *_: None), ("build_method", lambda *_, **__: None),
                        ("MetricsLog", lambda *_: None), ("SuiteTrainer", trainer_built)]:
        monkeypatch.setattr(trainer, name, value)
    with pytest.raises(Built) as built:
        trainer.SuiteTaskRunner.__ray_actor_class__().run(v)
    pools = built.value.args[0]
    assert pools.resource_pool_spec == {"global_pool": [8], "teacher_pool": [8]}
    assert pools.mapping[Role.TeacherModel] == "teacher_pool"


def test_a_cluster_verl_rejects_is_refused(tmp_path):
    # 32 prompts x 16 slots = 512 sequences do not split over 3 x 8 = 24 GPUs
    with pytest.raises(ValueError, match="divisible") as refused:
        generated(tmp_path, "method=grpo", "verl.nodes=3")
    assert "verl.nodes=3 x verl.gpus_per_node=8" in str(refused.value)
    assert "--config verl_nodes=N verl_gpus_per_node=G" in str(refused.value)  # what fixes it in the DAG


def test_a_key_verl_does_not_have_is_an_error(tmp_path, monkeypatch):
    def with_unknown(*args):
        out = original(*args)
        out["actor_rollout_ref"]["actor"]["no_such_key"] = 1
        return out

    original = verl_config.overrides
    monkeypatch.setattr(verl_config, "overrides", with_unknown)
    with pytest.raises(Exception, match="no_such_key"):
        generated(tmp_path, "method=grpo")


@pytest.mark.parametrize(("key", "message"), [("verl.nodes=0", "verl.nodes must be >= 1"),
                                               ("verl.tensor_parallel=3", "verl.tensor_parallel"),
                                               ("backend=gpu", "backend must be 'local' or 'verl'"),
                                               ("device=tpu", "device must be one of"),
                                               ("dtype=fp8", "dtype must be one of")])
def test_bad_placement_settings_are_named(key, message):
    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=[key])
    with pytest.raises(ValueError, match=message):
        schema.validate(cfg)


@pytest.mark.parametrize("method", ["grpo", "dapo", "gspo", "cbpo", "reinforce_pp", "aepo"])
def test_verls_actor_loss_is_the_local_loss_on_one_batch(tmp_path, method):
    # Issue 24.2: every objective knob means the same on both backends. verl's actor loss
    # (verl/workers/utils/losses.py::ppo_loss: its core_algos policy loss, entropy bonus and KL
    # loss, with the generated actor config) against the local loss, on a batch whose ratios
    # reach past 3 on negative advantages (where verl's default dual-clip c = 3 would bind).
    import torch
    from verl.trainer.ppo import core_algos
    from verl.utils.config import omega_conf_to_dataclass

    import baselines.aepo_loss  # noqa: F401  AEPO's verl policy loss, as verl's processes import it (its policy_loss_module)
    from cbpo.objective import policy_objective

    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["preset=paper", "backend=verl", f"method={method}"])
    objective = schema.method_config(cfg).objective()
    v = generated(tmp_path, f"method={method}")
    actor = omega_conf_to_dataclass(v.actor_rollout_ref.actor)
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=g, dtype=torch.float64) * 3
    log_prob = (old + torch.randn(6, 9, generator=g, dtype=torch.float64)).requires_grad_()
    ref = old + 0.3 * torch.randn(6, 9, generator=g, dtype=torch.float64)
    adv = torch.randn(6, 9, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 9, generator=g) > 0.25).double()
    mask[:, 0] = 1
    assert ((log_prob - old).exp()[adv < 0] > 3).any()

    local, _ = policy_objective(log_prob, old, adv, mask, ref_log_prob=ref, objective=objective)
    info = {"batch_num_tokens": None, "global_batch_size": None, "loss_scale_factor": None}
    actor.global_batch_info.update(info)
    remote, _ = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask.bool(),
        loss_agg_mode=actor.loss_agg_mode, config=actor)
    entropy = torch.rand(6, 9, generator=g, dtype=torch.float64)
    remote = remote - actor.entropy_coeff * core_algos.agg_loss(entropy, mask.bool(), actor.loss_agg_mode, **info)
    if actor.use_kl_loss:
        kld = core_algos.kl_penalty(log_prob, ref, actor.kl_loss_type)
        remote = remote + actor.kl_loss_coef * core_algos.agg_loss(kld, mask.bool(), actor.loss_agg_mode, **info)
    assert remote.item() == pytest.approx(local.item(), rel=1e-7)
    (grad_local,) = torch.autograd.grad(local, log_prob, retain_graph=True)
    (grad_remote,) = torch.autograd.grad(remote, log_prob)
    torch.testing.assert_close(grad_local, grad_remote)


def test_aepos_loss_is_registered_in_a_process_that_imports_verl_with_the_suites_module():
    # verl's workers build their policy loss by name: VERL_USE_EXTERNAL_MODULES (read at
    # `import verl`) registers AEPO's in every process that has it in its environment.
    import os
    import subprocess
    import sys

    code = "import verl; from verl.trainer.ppo.core_algos import get_policy_loss_fn; print(get_policy_loss_fn('aepo_entropy_balanced_clip').__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VERL_USE_EXTERNAL_MODULES": "baselines.aepo_loss"}, cwd=CONFIGS.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "entropy_balanced_clip_loss"


def test_reinforce_pp_puts_its_kl_in_verls_reward_and_its_baseline_variant_in_a_k2_loss(tmp_path):
    # Issue 24.6: Table 1's REINFORCE++ is the plain form (verl's reinforce_plus_plus with the k1
    # KL in the reward, a fixed 1e-3); REINFORCE++-baseline is the workflow's variant.
    v = generated(tmp_path, "method=reinforce_pp")
    algo, actor = v.algorithm, v.actor_rollout_ref.actor
    assert (algo.adv_estimator, algo.use_kl_in_reward, algo.kl_penalty) == ("reinforce_plus_plus", True, "kl")
    assert (algo.kl_ctrl.type, algo.kl_ctrl.kl_coef, actor.use_kl_loss) == ("fixed", 0.001, False)
    b = generated(tmp_path, "method=reinforce_pp", "method.baseline=true", "method.kl_coef=0", "method.beta=0.001")
    assert (b.algorithm.adv_estimator, b.algorithm.use_kl_in_reward) == ("reinforce_plus_plus_baseline", False)
    assert (b.actor_rollout_ref.actor.use_kl_loss, b.actor_rollout_ref.actor.kl_loss_type) == (True, "mse")
