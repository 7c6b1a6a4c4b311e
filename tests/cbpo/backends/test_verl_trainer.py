"""The verl trainer subclass (cbpo/backends/verl/trainer.py) on CPU: its advantage step is the
suite's credit on verl's DataProto and verl's estimator never runs; each step verl logs writes
a metrics line with the local trainer's keys; a resumed run's metrics stop at its checkpoint;
the run ends in final/ with DONE.json. verl's constructor (Ray worker groups) and the body of
its fit (vLLM, FSDP) need GPUs: stand-ins replace them, making only the two calls verl 0.9.1's
fit makes at the points the subclass takes over (``compute_advantage`` and ``Tracking``)."""
import json

import numpy as np
import pytest
import torch

from cbpo.backends.verl import credit
from cbpo.backends.verl.agent_loop import DRAW_STATS
from cbpo.registry import get_method
from cbpo.runs import DONE, fingerprint

pytest.importorskip("verl")
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import ray_trainer  # noqa: E402
from verl.utils import tracking  # noqa: E402

from cbpo.backends.verl.trainer import SuiteTrainer, draw_fields, rollout_stats, search_fields  # noqa: E402
from cbpo.trainer import MetricsLog  # noqa: E402

# What verl 0.9.1's fit passes to its logger each step: the actor's metrics renamed with
# "actor/" (ray_trainer._update_actor), timings (metric_utils.compute_timing_metrics) and more.
VERL_METRICS = {"actor/loss": 0.25, "actor/pg_loss": 0.2, "actor/kl_loss": 0.05, "actor/pg_clipfrac": 0.1,
                "actor/ppo_kl": 0.01, "actor/pg_clipfrac_lower": 0.0, "actor/grad_norm": 1.5, "actor/lr": 1e-6,
                "timing_s/gen": 2.0, "timing_s/step": 5.0, "critic/score/mean": 0.5, "training/global_step": 1}


@pytest.fixture(scope="module")
def tokenizer():
    from cbpo.models import train_tokenizer

    return train_tokenizer(["<python>print(1 + 2)</python><result>\n3\n</result><answer>\\boxed{3}</answer>",
                            "What is 1 plus 2?"] * 20, 300)


def cbpo():
    return get_method("cbpo")(vocab_size=64)


def verl_batch(groups, counts=None) -> DataProto:
    """The rollouts as verl's trainer holds them when it computes advantages: right-padded,
    reward on the last response token, rows in another order than the groups (verl balances
    batches), and the agent loop's extra fields in non_tensor_batch. ``counts``: each group's
    search counts and draws, on its rollout 0 as the agent loop puts them (none: no search
    tool, no draws)."""
    flat = [(g, k, t) for g, group in enumerate(groups) for k, t in enumerate(group)][::-1]
    width = max(len(t.response_ids) for _, _, t in flat) + 3
    mask = torch.zeros((len(flat), width), dtype=torch.int64)
    rewards = torch.zeros((len(flat), width))
    for row, (_, _, t) in enumerate(flat):
        mask[row, : len(t.model_mask)] = torch.tensor(t.model_mask, dtype=torch.int64)
        rewards[row, len(t.response_ids) - 1] = t.reward
    def of(g, k):
        if counts is None:
            return {}
        return counts[g] if k == 0 else {key: None if n is None else 0 for key, n in counts[g].items()}

    fields = [{**credit.rollout_fields(t, k), **rollout_stats(t, {"domain": "math"}), **search_fields(of(g, k)),
               **draw_fields(of(g, k))} for g, k, t in flat]

    def column(name):
        out = np.empty(len(flat), dtype=object)
        out[:] = [f[name] for f in fields]
        return out

    non_tensor = {"uid": np.array([f"problem-{g}" for g, _, _ in flat], dtype=object), **{n: column(n) for n in fields[0]}}
    return DataProto.from_dict(tensors={"response_mask": mask, "token_level_rewards": rewards}, non_tensors=non_tensor)


@pytest.fixture()
def suite_trainer(tmp_path, monkeypatch, tokenizer, tiny_causal_lm):
    """``make(method, batch)``: a SuiteTrainer over a run folder whose verl/ holds one
    checkpoint with plain weights (as verl writes it with hf_model), and the stand-ins."""
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    weights = run / "verl" / "global_step_1" / "actor" / "huggingface"
    tiny_causal_lm(tokenizer).save_pretrained(weights)
    (run / "verl" / "latest_checkpointed_iteration.txt").write_text("1")

    def verl_init(self, config, tokenizer, **_):
        self.config, self.tokenizer = config, tokenizer

    def verl_fit(self):
        logger = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["console"], config={})
        self.advantaged = ray_trainer.compute_advantage(self.batch, adv_estimator="grpo", gamma=1.0, lam=1.0,
                                                        num_repeat=6, norm_adv_by_std_in_grpo=True, config=None)
        logger.log(data=VERL_METRICS, step=1)

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "__init__", verl_init)
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "fit", verl_fit)

    def make(method, batch):
        config = OmegaConf.create({"trainer": {"default_local_dir": str(run / "verl")}})
        trainer = SuiteTrainer(config=config, tokenizer=tokenizer, method=method, run_dir=run,
                               log=MetricsLog(run / "metrics.jsonl"))
        trainer.batch = batch
        return trainer

    return make


def test_the_advantage_step_is_the_suites_credit_and_verls_estimator_never_runs(suite_trainer, monkeypatch, cbpo_groups):
    groups = cbpo_groups
    expected = verl_batch(groups)
    credit.assign(expected, cbpo())
    assert expected.batch["advantages"].abs().sum() > 0  # the comparison is not vacuous

    estimated = []
    monkeypatch.setattr(ray_trainer, "compute_advantage", lambda *args, **kwargs: estimated.append(args))
    verls, tracking_class = ray_trainer.compute_advantage, tracking.Tracking
    trainer = suite_trainer(cbpo(), verl_batch(groups))
    trainer.fit()

    assert estimated == []
    assert torch.equal(trainer.advantaged.batch["advantages"], expected.batch["advantages"])
    assert torch.equal(trainer.advantaged.batch["response_mask"], expected.batch["response_mask"])  # branch prefixes
    assert ray_trainer.compute_advantage is verls and tracking.Tracking is tracking_class  # only for fit's length


def local_record(tmp_path, tokenizer, tiny_causal_lm, method="grpo", **knobs) -> dict:
    """One step of the local trainer (no search tool; rewards 0, 1 in every group of two): the
    metrics line it writes."""
    from cbpo.rollout.agent import AgentConfig
    from cbpo.trainer import RLConfig, rl_train

    rows = [{"id": "a", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}]
    cfg = RLConfig(steps=1, problems_per_step=1, agent=AgentConfig(max_new_tokens=4, max_total_tokens=8))
    rl_train(tiny_causal_lm(tokenizer), tokenizer, get_method(method)(vocab_size=len(tokenizer), budget=2, **knobs), rows,
             {}, lambda texts, rows: [float(i % 2) for i in range(len(texts))], cfg, tmp_path / "local",
             MetricsLog(tmp_path / "local.jsonl"), None)
    (line,) = (tmp_path / "local.jsonl").read_text().splitlines()
    return json.loads(line)


def test_the_metrics_line_has_the_local_trainers_keys(suite_trainer, tmp_path, tokenizer, tiny_causal_lm, cbpo_groups):
    local = local_record(tmp_path, tokenizer, tiny_causal_lm)
    groups = cbpo_groups
    suite_trainer(cbpo(), verl_batch(groups)).fit()

    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert set(local) <= set(line), sorted(set(local) - set(line))
    flat = [t for g in groups for t in g]
    assert (line["step"], line["problems"], line["rollouts"]) == (1, 2, 16)
    assert line["reward"] == pytest.approx(np.mean([t.reward for t in flat])) == line["reward/math"]
    assert line["generated_tokens"] == sum(t.generated_tokens for t in flat)
    assert line["tool_calls"] == sum(t.tool_calls - t.copied_tool_calls for t in flat)
    assert (line["n_parent"], line["n_branch"], line["n_fill"]) == (6, 8, 2)
    assert (line["rollout_seconds"], line["wall_seconds"]) == (2.0, 5.0)  # verl's timings of the step
    assert (line["loss"], line["pg_loss"], line["kl"], line["grad_norm"]) == (0.25, 0.2, 0.05, 1.5)
    assert "search_calls" not in line and "search_calls" not in local  # neither run has a search tool
    assert not set(DRAW_STATS) & set(line)  # CBPO draws no replacement problems


def test_the_metrics_line_sums_a_steps_draws_under_the_local_trainers_keys(suite_trainer, tmp_path, tokenizer,
                                                                            tiny_causal_lm, cbpo_groups):
    local = local_record(tmp_path, tokenizer, tiny_causal_lm, "dapo", max_num_gen_batches=2)
    draws = [{"kept_groups": 1, "extra_rollouts": 8, "extra_generated_tokens": 40, "extra_tool_calls": 3},
             {"kept_groups": 0, "extra_rollouts": 16, "extra_generated_tokens": 70, "extra_tool_calls": 0}]
    suite_trainer(get_method("dapo")(budget=8), verl_batch(cbpo_groups, counts=draws)).fit()

    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert set(DRAW_STATS) <= set(local)  # the keys the local trainer logs for DAPO
    # gen_batches counts the local trainer's batches of the step's size; verl draws per group
    assert set(local) - {"gen_batches"} <= set(line), sorted(set(local) - set(line))
    assert {key: line[key] for key in DRAW_STATS} == {"kept_groups": 1, "extra_rollouts": 24,
                                                      "extra_generated_tokens": 110, "extra_tool_calls": 3}


@pytest.mark.parametrize("cached", [True, False])
def test_the_metrics_line_counts_the_steps_searches(suite_trainer, tmp_path, cbpo_groups, cached):
    def counts(calls, hits):
        return {"search_calls": calls, "search_cache_hits": hits if cached else None,
                "search_cache_misses": calls - hits if cached else None}

    suite_trainer(cbpo(), verl_batch(cbpo_groups, counts=[counts(3, 2), counts(5, 1)])).fit()
    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = (8, 3, 5) if cached else (8, None, None)  # as the local trainer's step_search_stats
    assert (line["search_calls"], line["search_cache_hits"], line["search_cache_misses"]) == expected


def test_the_run_ends_in_final_with_done_json(suite_trainer, tmp_path, cbpo_groups):
    from transformers import AutoModelForCausalLM

    suite_trainer(cbpo(), verl_batch(cbpo_groups)).fit()
    final = tmp_path / "run" / "final"
    assert json.loads((final / DONE).read_text()) == {"step": "final", "fingerprint": fingerprint(final)}
    ours = AutoModelForCausalLM.from_pretrained(final).state_dict()
    verls = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "verl" / "global_step_1" / "actor" / "huggingface")
    assert all(torch.equal(ours[k], v) for k, v in verls.state_dict().items())


def test_a_resumed_run_keeps_the_metrics_of_its_checkpoints_steps(suite_trainer, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 2))
    trainer = suite_trainer(cbpo(), None)
    for step in (1, 2, 3):
        trainer.log.log({"step": step, "reward": 0.0})
    trainer._load_checkpoint()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
