"""``python -m cbpo.train backend=verl`` on a machine without the GPU stack stops at once,
naming what is missing, and writes nothing; ``verl.dry_run=true`` prints the generated,
verl-validated config on any machine; a method whose setup hook verl does not replace is
refused (OPD trains as verl's on-policy distillation, OC-GRPO's rescoring is verl's actor). What the launch writes for
verl's processes is read back by verl's own dataset and agent-loop registration. The launch
past the GPU check (Ray, the task runner, the worker groups) needs a GPU cluster and is not
exercised here."""
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from cbpo import schema
from cbpo.backends.verl import agent_loop, credit
from cbpo.backends.verl.launch import missing_engines, run_verl, unsupported, write_inputs

pytest.importorskip("verl")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def train(tmp_path, *overrides, method="cbpo"):
    return subprocess.run([sys.executable, "-m", "cbpo.train", "stage=rl", f"method={method}", "preset=paper", "backend=verl",
                           *overrides], capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)


@pytest.mark.skipif(not missing_engines(), reason="this environment has vLLM and Ray (the engine tier trains)")
def test_verl_backend_fails_fast_without_the_engines_and_writes_nothing(tmp_path):
    out = train(tmp_path)
    assert out.returncode != 0
    assert "backend=verl needs the engine environment" in out.stderr and "vllm is not installed" in out.stderr
    assert [p.name for p in tmp_path.iterdir()] in ([], ["train.log"])  # Hydra's job log only: no run folder


def test_dry_run_prints_the_validated_verl_config(tmp_path):
    out = train(tmp_path, "verl.dry_run=true", "verl.nodes=2")
    assert out.returncode == 0, out.stderr
    assert "adv_estimator: cbpo_suite_credit" in out.stdout and "nnodes: 2" in out.stdout
    # every Ray worker imports the suite's verl extensions, on any node: a method's own policy
    # loss (AEPO's; CBPO's is verl's vanilla)
    assert "baselines.aepo_loss" not in out.stdout
    aepo = train(tmp_path, "verl.dry_run=true", method="aepo")
    assert aepo.returncode == 0, aepo.stderr
    assert "VERL_USE_EXTERNAL_MODULES: baselines.aepo_loss" in aepo.stdout
    if not torch.cuda.is_available():  # and the CPU platform, in a Ray cluster this process did not start
        assert "VERL_ENGINE_DEVICE: cuda" in out.stdout and "VLLM_CPU_KVCACHE_SPACE: '1'" in out.stdout
    assert [p.name for p in tmp_path.iterdir()] in ([], ["train.log"])  # Hydra's job log only: no run folder


def test_sfts_dry_run_prints_verls_sft_trainer_config_with_the_suites_dataset(tmp_path):
    out = train(tmp_path, "stage=sft", "verl.dry_run=true", "verl.gpus_per_node=4")
    assert out.returncode == 0, out.stderr
    for line in ("name: SuiteSFTDataset", "n_gpus_per_node: 4", "pad_mode: no_padding", "strategy: fsdp2"):
        assert line in out.stdout, line
    if not torch.cuda.is_available():  # cpu.py's SFT settings
        for line in ("device: cpu", "attn_implementation: sdpa", "use_remove_padding: false", "dtype: float32",
                     "use_torch_compile: false"):
            assert line in out.stdout, line
    assert [p.name for p in tmp_path.iterdir()] in ([], ["train.log"])  # Hydra's job log only: no run folder


CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def composed(*overrides):
    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        cfg = compose("config", overrides=["backend=verl", *overrides])
    schema.validate(cfg)
    return cfg


def test_a_method_whose_setup_verl_does_not_replace_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # every Table 1 method with a setup hook (OPD, OC-GRPO) has verl do its work; one without is refused
    from cbpo import registry

    cfg = composed("stage=rl", "method=grpo", "preset=paper")
    grpo = registry.build_method(cfg, vocab_size=None)
    assert unsupported(grpo) is None
    grpo.setup = lambda model, tokenizer, temperature: None
    monkeypatch.setattr(registry, "build_method", lambda cfg, vocab_size: grpo)
    with pytest.raises(ValueError, match="method=grpo needs the policy model in its own steps.*backend=local"):
        run_verl(cfg, tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not missing_engines(), reason="this environment has vLLM and Ray (the engine tier trains)")
def test_oc_grpo_passes_the_method_check_with_a_validated_config(tmp_path):
    # past the config (built and checked by verl) and the method check, the launch stops at the engines
    from cbpo.registry import build_method

    cfg = composed("stage=rl", "method=oc_grpo", "preset=paper")
    assert unsupported(build_method(cfg, vocab_size=None)) is None
    with pytest.raises(RuntimeError, match="backend=verl needs the engine environment"):
        run_verl(cfg, tmp_path / "run")
    assert list(tmp_path.iterdir()) == []
    out = train(tmp_path, "verl.dry_run=true", "method=oc_grpo")
    assert out.returncode == 0, out.stderr
    assert "adv_estimator: cbpo_suite_credit" in out.stdout


def test_opd_trains_on_verl_as_its_distillation(tmp_path):
    from cbpo.registry import build_method

    cfg = composed("stage=rl", "method=opd", "method.teacher=Qwen/Qwen3-32B", "preset=paper")
    assert unsupported(build_method(cfg, vocab_size=None)) is None
    out = train(tmp_path, "verl.dry_run=true", "method=opd", "method.teacher=Qwen/Qwen3-32B")
    assert out.returncode == 0, out.stderr
    distillation = out.stdout[out.stdout.index("\ndistillation:"):].split("\ntransfer_queue:")[0]
    for line in ("enabled: true", "loss_mode: k1", "use_task_rewards: false", "use_policy_gradient: true",
                 "model_path: Qwen/Qwen3-32B", "tensor_model_parallel_size: 4"):
        assert line in distillation, distillation
    # on a machine without a GPU the teacher's vLLM servers run as the rollout's do (cpu.py): verl's
    # default asks them for sleep mode, which vLLM's CPU build refuses ("Sleep mode is not supported")
    teacher = distillation[distillation.index("teacher_models:"):]
    for line in ("enable_sleep_mode: false", "free_cache_engine: false", "dtype: float32", "block_size: 32"):
        assert line in teacher, teacher
    # and the rollout's vLLM gets the local engine's CPU block size beside the suite's max_logprobs
    rollout = out.stdout[out.stdout.index("\n  rollout:"):].split("\n  ref:")[0]
    vllm_kwargs = rollout[rollout.index("engine_kwargs:"):]
    assert "block_size: 32" in vllm_kwargs and "max_logprobs: 20" in vllm_kwargs, rollout


@pytest.mark.skipif(not missing_engines(), reason="this environment has vLLM and Ray (the engine tier trains)")
def test_dapos_dynamic_sampling_is_launched_with_a_validated_config(tmp_path):
    # past the config (built and checked by verl) and the method check, the launch stops at the engines
    cfg = composed("stage=rl", "method=dapo", "preset=paper")
    assert cfg.method.filter_groups and cfg.method.max_num_gen_batches > 1
    with pytest.raises(RuntimeError, match="backend=verl needs the engine environment"):
        run_verl(cfg, tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


class FakeServer:
    """verl's ``LLMServerClient.generate`` under the suite's server contract: every context is
    answered at once, stopped by the answer's closing tag."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.prompts.append(prompt_ids)
        await asyncio.sleep(0)
        ids = self.tokenizer.encode("<answer>3</answer>", add_special_tokens=False)
        # as vLLM: the stop token's id where the closing tag is one token, else the stop string
        stop = ids[-1] if ids[-1] in sampling_params["stop_token_ids"] else "</answer>"
        assert stop in sampling_params["stop_token_ids"] + sampling_params["stop"]
        return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids), extra_fields={
            agent_loop.ENTROPIES: [0.25] * len(ids), agent_loop.FINISH: "stop", agent_loop.STOP: stop})


def agent_loop_outputs(generated, tokenizer, server, item, uid="uid-1", step=1):
    """verl's agent-loop worker on one batch row of its dataset (``item``, with the training
    step and the batch's rows, here the item alone, that SuiteTrainer._get_gen_batch adds): the registered agent loop from the launch's file,
    built as verl's AgentLoopWorker._run_agent_loop builds it, once for each of the uid's
    rollout.n rows."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    rollout = generated.actor_rollout_ref.rollout
    registry = {c.name: c for c in OmegaConf.load(rollout.agent.agent_loop_config_path)}

    def build_loop():
        return hydra.utils.instantiate(
            registry[rollout.agent.default_agent_loop], trainer_config=DictConfigWrap(generated),
            server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
            dataset_cls=RLHFDataset, data_config=DictConfigWrap(generated.data), tools=ToolListWrap([]))

    async def worker():
        return await asyncio.gather(*(build_loop().run({}, uid=uid, **{agent_loop.STEP: step, agent_loop.BATCH_ROWS: [item["extra_info"]["index"]]}, **item)
                                      for _ in range(rollout.n)))

    return asyncio.run(worker())


def one_gpu_run(tmp_path, *overrides):
    """A smoke-preset RL run on one GPU with ``overrides``: its config and the verl config the
    launch generates for it (output in ``tmp_path / "run"``)."""
    from cbpo.backends.verl.config import build

    cfg = composed("stage=rl", *overrides, "preset=smoke", "data=twohop", "verl.gpus_per_node=1", "verl.tensor_parallel=1")
    out = tmp_path / "run"
    return cfg, build(cfg, schema.method_config(cfg), schema.settings(cfg, "rl"), schema.settings(cfg, "verl"),
                      str(out / "verl" / "train.parquet"), out)


def test_verls_dataset_and_agent_loop_worker_read_what_the_launch_writes(tmp_path):
    # What verl's processes do with the launch's files, on CPU: its dataset reads the rows, and
    # its agent-loop worker registers the config's default agent loop from the file and builds
    # it as verl does for each row; the M rows of one uid return the group's M rollouts.
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.trainer.ppo.utils import create_rl_dataset

    from cbpo.chat import build_prompt
    from cbpo.models import train_tokenizer

    cfg, generated = one_gpu_run(tmp_path, "method=grpo")
    rows = [{"id": "q1", "question": "Who founded the city?", "answer": "3", "domain": "search"},
            {"id": "q2", "question": "Where was she born?", "answer": "4", "domain": "search"}]
    write_inputs(cfg, generated, rows)
    tokenizer = train_tokenizer(["<answer>3</answer> Who founded the city? Where was she born?"] * 20, 300)

    dataset = create_rl_dataset(generated.data.train_files, generated.data, tokenizer, None)
    assert [json.loads(dataset[i]["extra_info"]["row"]) for i in range(len(rows))] == rows

    rollout = generated.actor_rollout_ref.rollout
    server = FakeServer(tokenizer)
    outputs = agent_loop_outputs(generated, tokenizer, server, dataset[0])
    assert all(isinstance(o, AgentLoopOutput) for o in outputs)
    assert [o.extra_fields["cbpo_index"] for o in outputs] == list(range(rollout.n)) and rollout.n == 4
    prompt = build_prompt(tokenizer, rows[0]["question"], None)  # the smoke preset has no system prompt
    assert server.prompts == [prompt] * rollout.n and all(o.prompt_ids == prompt for o in outputs)
    for o in outputs:
        assert o.reward_score is not None and o.extra_fields["cbpo_domain"] == "search"
        assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs) > 0
        assert set(credit.FIELDS) <= set(o.extra_fields)
    # the built-in corpus has no cache: calls are counted, hits and misses are not
    assert [o.extra_fields["cbpo_search_calls"] for o in outputs] == [0] * rollout.n  # the replies never search
    assert all(o.extra_fields["cbpo_search_cache_hits"] is None for o in outputs)


def test_dapos_agent_loop_worker_draws_replacements_from_the_rows_the_launch_writes(tmp_path, monkeypatch):
    # Every reply answers 3, so no group is informative: the worker draws the row's problem and
    # both others of the pool the launch wrote, each once, and returns the last one's rollouts.
    from verl.trainer.ppo.utils import create_rl_dataset

    from cbpo.backends.verl import trainer
    from cbpo.chat import build_prompt
    from cbpo.models import train_tokenizer

    cfg, generated = one_gpu_run(tmp_path, "method=dapo", "method.max_num_gen_batches=3")
    rows = [{"id": "q1", "question": "Who founded the city?", "answer": "3", "domain": "search"},
            {"id": "q2", "question": "Where was she born?", "answer": "3", "domain": "search"},
            {"id": "q3", "question": "Who wrote the book?", "answer": "4", "domain": "search"}]
    write_inputs(cfg, generated, rows)
    tokenizer = train_tokenizer(["<answer>3</answer> Who founded the city? Where was she born? Who wrote the book?"] * 20,
                                300)
    dataset = create_rl_dataset(generated.data.train_files, generated.data, tokenizer, None)

    def drawn():  # the outputs, and the problem of every prompt the server was sent, in order
        server = FakeServer(tokenizer)
        outputs = agent_loop_outputs(generated, tokenizer, server, dataset[0])
        return outputs, [next(r for r in rows if build_prompt(tokenizer, r["question"], None) == p)
                         for p in server.prompts]

    n = generated.actor_rollout_ref.rollout.n
    outputs, order = drawn()
    assert [r["id"] for r in order[:n]] == ["q1"] * n and sorted(r["id"] for r in order[n:]) == ["q2"] * n + ["q3"] * n
    last = order[-1]
    assert all(o.prompt_ids == build_prompt(tokenizer, last["question"], None) for o in outputs)
    assert {o.reward_score for o in outputs} == {float(last["answer"] == "3")}  # the last problem's answer
    assert [o.extra_fields["cbpo_extra_rollouts"] for o in outputs] == [2 * n] + [0] * (n - 1)
    assert all(o.extra_fields["cbpo_kept_groups"] == 0 for o in outputs)
    monkeypatch.setattr(trainer, "_GROUPS", {})  # a new worker process
    assert drawn()[1] == order  # a rerun draws the same


def test_oc_grpos_agent_loop_worker_carries_the_privileged_rollouts_hinted_prompts(tmp_path):
    # Every reply answers 3 and the row's answer is 4: the plain half fails, the other half is
    # sampled from the hinted prompt, returned hint-free with the hinted prompt in its fields.
    from baselines.oc_grpo import hint
    from verl.trainer.ppo.utils import create_rl_dataset

    from cbpo.chat import build_prompt
    from cbpo.models import train_tokenizer

    cfg, generated = one_gpu_run(tmp_path, "method=oc_grpo")
    rows = [{"id": "q1", "question": "Who founded the city?", "answer": "4", "domain": "search"}]
    write_inputs(cfg, generated, rows)
    tokenizer = train_tokenizer(["<answer>3</answer> Who founded the city? " + hint(rows[0])] * 20, 300)
    dataset = create_rl_dataset(generated.data.train_files, generated.data, tokenizer, None)
    server = FakeServer(tokenizer)
    outputs = agent_loop_outputs(generated, tokenizer, server, dataset[0])

    n = generated.actor_rollout_ref.rollout.n
    prompt = build_prompt(tokenizer, rows[0]["question"], None)
    hinted = build_prompt(tokenizer, f"{rows[0]['question']}\n\n{hint(rows[0])}", None)
    assert server.prompts == [prompt] * (n // 2) + [hinted] * (n - n // 2)
    assert all(o.prompt_ids == prompt and o.reward_score == 0.0 for o in outputs)  # trained hint-free
    fields = [o.extra_fields for o in outputs]
    assert [f["cbpo_kind"] for f in fields] == ["parent"] * (n // 2) + ["privileged"] * (n - n // 2)
    assert [f["cbpo_hinted_prompt"] for f in fields] == [[]] * (n // 2) + [hinted] * (n - n // 2)
    assert [f["cbpo_leaked"] for f in fields] == [False] * n


def test_the_prompt_block_fits_the_longest_training_prompt_and_a_longer_one_is_refused(tmp_path, monkeypatch):
    # verl's own loops left-truncate a prompt longer than rollout.prompt_length (the smoke preset's
    # is 32, its prompts longer): the launch widens the block to the rows' longest prompt, and
    # the suite's agent loop names a row whose prompt still does not fit instead of cutting it.
    from verl.trainer.ppo.utils import create_rl_dataset

    from cbpo.backends.verl.launch import fit_prompt_length
    from cbpo.chat import build_prompt
    from cbpo.models import train_tokenizer

    cfg, generated = one_gpu_run(tmp_path, "method=grpo")
    rows = [{"id": "q1", "question": "Who founded the city " * 12 + "?", "answer": "3", "domain": "search"},
            {"id": "q2", "question": "Where was she born?", "answer": "4", "domain": "search"}]
    tokenizer = train_tokenizer(["<answer>3</answer> Who founded the city? Where was she born?"] * 20, 300)
    tokenizer.save_pretrained(tmp_path / "init")
    cfg.init = str(tmp_path / "init")
    longest = len(build_prompt(tokenizer, rows[0]["question"], None))
    assert longest > generated.actor_rollout_ref.rollout.prompt_length  # what verl would cut
    fit_prompt_length(generated, cfg, rows)
    assert generated.actor_rollout_ref.rollout.prompt_length == generated.data.max_prompt_length == longest
    write_inputs(cfg, generated, rows)
    dataset = create_rl_dataset(generated.data.train_files, generated.data, tokenizer, None)
    outputs = agent_loop_outputs(generated, tokenizer, FakeServer(tokenizer), dataset[0])
    assert all(len(o.prompt_ids) == longest for o in outputs)  # whole, not truncated

    from cbpo.backends.verl import trainer

    monkeypatch.setattr(trainer, "_GROUPS", {})  # a new worker process
    generated.actor_rollout_ref.rollout.prompt_length = longest - 1
    with pytest.raises(ValueError, match=f"training row 0: its prompt has {longest} tokens, more than "
                                         f"verl's rollout.prompt_length={longest - 1}"):
        agent_loop_outputs(generated, tokenizer, FakeServer(tokenizer), dataset[0], uid="uid-2")
