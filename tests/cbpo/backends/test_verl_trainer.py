"""The verl trainer subclass (cbpo/backends/verl/trainer.py) on CPU: its advantage step is the
suite's credit on verl's DataProto and verl's estimator never runs; each step verl logs writes
a metrics line with the local trainer's keys; a resumed run's metrics stop at its checkpoint;
the run ends in final/ with DONE.json; OC-GRPO's privileged rows are weighted by a rescoring of
verl's actor (a stand-in worker group) with their hinted prompts. verl's constructor (Ray worker groups) and the body of
its fit (vLLM, FSDP) need GPUs: stand-ins replace them, making only the two calls verl 0.9.1's
fit makes at the points the subclass takes over (``compute_advantage`` and ``Tracking``)."""
import json

import numpy as np
import pytest
import torch

from cbpo.backends.verl import credit
from cbpo.backends.verl.agent_loop import DRAW_STATS, PREFILL_STATS
from cbpo.registry import get_method
from cbpo.runs import DONE, fingerprint
from cbpo.trajectory import Trajectory

pytest.importorskip("verl")
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import ray_trainer  # noqa: E402
from verl.utils import tracking  # noqa: E402

from cbpo.backends.verl.trainer import SuiteOneStepTrainer, SuiteTrainer, group_fields, rollout_stats, search_fields  # noqa: E402
from cbpo.runlog import MetricsLog  # noqa: E402

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


@pytest.fixture()
def verl_batch(verl_batch):
    """``make(groups, counts=None)``: the batch of the backends' conftest with the agent loop's
    statistics fields; ``counts``: each group's search counts and draws, on its rollout 0 as the
    agent loop puts them (none: no search tool, no draws)."""
    def make(groups, counts=None):
        def of(g, k):
            if counts is None:
                return {}
            return counts[g] if k == 0 else {key: None if n is None else 0 for key, n in counts[g].items()}

        return verl_batch(groups, fields=lambda g, k, t: {**rollout_stats(t, {"domain": "math"}), **search_fields(of(g, k)),
                                                          **group_fields(of(g, k))})

    return make


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
        config = OmegaConf.create({"trainer": {"default_local_dir": str(run / "verl"), "nnodes": 2, "n_gpus_per_node": 8},
                                  "actor_rollout_ref": {"hybrid_engine": True}})
        trainer = SuiteTrainer(config=config, tokenizer=tokenizer, method=method, run_dir=run,
                               log=MetricsLog(run / "metrics.jsonl"))
        trainer.batch = batch
        return trainer

    return make


def test_the_advantage_step_is_the_suites_credit_and_verls_estimator_never_runs(suite_trainer, verl_batch, monkeypatch, cbpo_groups):
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


def test_the_one_step_off_trainer_takes_the_suites_credit_in_its_async_loop(tmp_path, monkeypatch, tokenizer, verl_batch,
                                                                             cbpo_groups):
    # verl's one-step-off loop is a coroutine over the separation trainer's module, which imports
    # compute_advantage under its own name: fit runs it with both names swapped
    from omegaconf import OmegaConf
    from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
    from verl.experimental.separation import ray_trainer as separate_trainer

    expected = verl_batch(cbpo_groups)
    credit.assign(expected, cbpo())

    def verl_init(self, config, tokenizer, **_):
        self.config, self.tokenizer, self.global_steps = config, tokenizer, 1

    async def verl_fit(self):
        logger = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["console"], config={})
        self.advantaged = separate_trainer.compute_advantage(self.batch, adv_estimator="grpo", config=None)
        logger.log(data={**VERL_METRICS, "timing_s/generate_async": 1.5}, step=1)

    monkeypatch.setattr(OneStepOffRayTrainer, "__init__", verl_init)
    monkeypatch.setattr(OneStepOffRayTrainer, "fit", verl_fit)
    monkeypatch.setattr(SuiteOneStepTrainer, "finish", lambda self: None)
    config = OmegaConf.create({"trainer": {"nnodes": 1, "n_gpus_per_node": 1},
                               "actor_rollout_ref": {"hybrid_engine": False, "rollout": {"nnodes": 1, "n_gpus_per_node": 1}}})
    trainer = SuiteOneStepTrainer(config=config, tokenizer=tokenizer, method=cbpo(), run_dir=tmp_path,
                                  log=MetricsLog(tmp_path / "metrics.jsonl"))
    trainer.batch = verl_batch(cbpo_groups)
    verls = separate_trainer.compute_advantage
    trainer.fit()
    assert torch.equal(trainer.advantaged.batch["advantages"], expected.batch["advantages"])
    assert separate_trainer.compute_advantage is verls
    (line,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # the wait for the batch and its generation beside the previous step; both pools' GPUs
    assert (line["rollout_seconds"], line["generate_seconds"], line["devices"]) == (2.0, 1.5, 2)


def test_the_one_step_off_trainer_draws_each_steps_batch_a_step_ahead():
    trainer = SuiteOneStepTrainer.__new__(SuiteOneStepTrainer)
    drawn = []
    # verl's loop: step 1's batch, then while step s trains, step s+1's; a resumed run starts at 5
    for global_steps in (1, 1, 2, 3):
        trainer.global_steps = global_steps
        drawn.append(trainer.batch_step())
    resumed = SuiteOneStepTrainer.__new__(SuiteOneStepTrainer)
    resumed.global_steps = 5
    assert drawn == [1, 2, 3, 4] and [resumed.batch_step(), resumed.batch_step()] == [5, 6]


def local_record(tmp_path, tokenizer, tiny_causal_lm, method="grpo", **knobs) -> dict:
    """One step of the local trainer (no search tool; rewards 0, 1 in every group of two): the
    metrics line it writes."""
    from cbpo.rollout.agent import AgentConfig
    from cbpo.stages import RLConfig
    from cbpo.backends.local.rl import rl_train

    rows = [{"id": "a", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}]
    cfg = RLConfig(steps=1, problems_per_step=1, agent=AgentConfig(max_new_tokens=4, max_total_tokens=8))
    rl_train(tiny_causal_lm(tokenizer), tokenizer, get_method(method)(vocab_size=len(tokenizer), budget=2, **knobs), rows,
             {}, lambda texts, rows: [float(i % 2) for i in range(len(texts))], cfg, tmp_path / "local",
             MetricsLog(tmp_path / "local.jsonl"), None)
    (line,) = (tmp_path / "local.jsonl").read_text().splitlines()
    return json.loads(line)


def test_the_metrics_line_has_the_local_trainers_keys(suite_trainer, verl_batch, tmp_path, tokenizer, tiny_causal_lm, cbpo_groups):
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
    assert line["devices"] == 16  # the GPUs the step held (2 nodes x 8), for the tables' device-hours
    assert (line["loss"], line["pg_loss"], line["kl"], line["grad_norm"]) == (0.25, 0.2, 0.05, 1.5)
    assert "search_calls" not in line and "search_calls" not in local  # neither run has a search tool
    assert not set(DRAW_STATS) & set(line)  # CBPO draws no replacement problems


def test_the_metrics_line_sums_a_steps_draws_under_the_local_trainers_keys(suite_trainer, verl_batch, tmp_path, tokenizer,
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


def test_the_metrics_line_sums_the_groups_prefill_counts_under_the_local_vllm_engines_keys(suite_trainer, verl_batch,
                                                                                           tmp_path, cbpo_groups):
    prefill = [{"prefill_tokens": 400, "prefill_cached_tokens": 300, "prefill_computed_tokens": 100},
               {"prefill_tokens": 500, "prefill_cached_tokens": 350, "prefill_computed_tokens": 150}]
    suite_trainer(cbpo(), verl_batch(cbpo_groups, counts=prefill)).fit()

    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {key: line[key] for key in PREFILL_STATS} == {"prefill_tokens": 900, "prefill_cached_tokens": 650,
                                                         "prefill_computed_tokens": 250}


@pytest.mark.parametrize("cached", [True, False])
def test_the_metrics_line_counts_the_steps_searches(suite_trainer, verl_batch, tmp_path, cbpo_groups, cached):
    def counts(calls, hits):
        return {"search_calls": calls, "search_cache_hits": hits if cached else None,
                "search_cache_misses": calls - hits if cached else None}

    suite_trainer(cbpo(), verl_batch(cbpo_groups, counts=[counts(3, 2), counts(5, 1)])).fit()
    (line,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    expected = (8, 3, 5) if cached else (8, None, None)  # as the local trainer's step_search_stats
    assert (line["search_calls"], line["search_cache_hits"], line["search_cache_misses"]) == expected


def test_the_run_ends_in_final_with_done_json(suite_trainer, verl_batch, tmp_path, cbpo_groups):
    from transformers import AutoModelForCausalLM

    suite_trainer(cbpo(), verl_batch(cbpo_groups)).fit()
    final = tmp_path / "run" / "final"
    assert json.loads((final / DONE).read_text()) == {"step": "final", "fingerprint": fingerprint(final)}
    ours = AutoModelForCausalLM.from_pretrained(final).state_dict()
    verls = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "verl" / "global_step_1" / "actor" / "huggingface")
    assert all(torch.equal(ours[k], v) for k, v in verls.state_dict().items())


def test_a_checkpoint_verl_asks_for_is_taken_after_its_steps_metrics_line(suite_trainer, verl_batch, tmp_path, monkeypatch,
                                                                            cbpo_groups):
    # verl 0.9.1 saves a step's checkpoint before it logs the step: killed in between, a run would
    # resume past a step whose metrics line was never written
    metrics = tmp_path / "run" / "metrics.jsonl"
    saved = []

    def verl_fit(self):
        logger = tracking.Tracking(project_name="p", experiment_name="e", default_backend=["console"], config={})
        ray_trainer.compute_advantage(self.batch, adv_estimator="grpo", gamma=1.0, lam=1.0, num_repeat=6,
                                      norm_adv_by_std_in_grpo=True, config=None)
        self._save_checkpoint()  # where verl saves
        assert saved == []
        logger.log(data=VERL_METRICS, step=1)

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "fit", verl_fit)
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_save_checkpoint",
                        lambda self: saved.append(len(metrics.read_text().splitlines())))
    suite_trainer(cbpo(), verl_batch(cbpo_groups)).fit()
    assert saved == [1]  # once, with step 1's line already written


def test_a_resumed_run_keeps_the_metrics_of_its_checkpoints_steps(suite_trainer, tmp_path, monkeypatch):
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 2))
    trainer = suite_trainer(cbpo(), None)
    for step in (1, 2, 3):
        trainer.log.log({"step": step, "reward": 0.0})
    trainer._load_checkpoint()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]


# OC-GRPO on verl: privileged rows rescored by the actor with their hinted prompts.

PAD, PROMPT_WIDTH, RESPONSE_WIDTH, TEMPERATURE = 0, 6, 16, 0.7


def oc_groups():
    """Three problems of M = 4 as OC-GRPO's collect leaves them, each rollout with its hinted
    prompt (none for plain ones) and leak flag: a hinted problem with one leak, a hinted one
    without, and one that was not hinted."""
    rng = np.random.default_rng(3)

    def rollout(prompt, reward, kind="parent"):
        n = int(rng.integers(4, 9))
        ids = rng.integers(3, 50, n).tolist() + [1, 2] + rng.integers(3, 50, 3).tolist()  # an observation run
        mask = [True] * n + [False, False] + [True] * 3
        return Trajectory(prompt_ids=prompt, response_ids=ids, model_mask=mask, entropies=[0.1] * len(ids),
                          finish="answer", kind=kind, reward=reward)

    groups = []
    for x, (prompt, rewards, hinted) in enumerate((([7, 8, 9], [0, 0, 1, 1], True), ([7, 8], [0, 0, 0, 1], True),
                                                   ([9, 9, 9, 9], [0, 1, 1, 0], False))):
        hinted_prompt = prompt + [20 + x] * (9 + 3 * x) if hinted else []  # longer than verl's prompt width, unequal
        groups.append([(rollout(prompt, float(r), "privileged" if hinted and k >= 2 else "parent"),
                        hinted_prompt if hinted and k >= 2 else [], x == 0 and k == 2) for k, r in enumerate(rewards)])
    return groups


def oc_batch(groups) -> DataProto:
    """The groups as verl's batch at its advantage step (agent loop layout, old_log_probs from
    the actor, rows reversed as batch balancing may leave them)."""
    from verl.utils.model import compute_position_id_with_mask

    flat = [(x, k, *r) for x, g in enumerate(groups) for k, r in enumerate(g)][::-1]
    n = len(flat)
    prompts, responses = torch.full((n, PROMPT_WIDTH), PAD), torch.full((n, RESPONSE_WIDTH), PAD)
    prompt_mask, response_attention = torch.zeros((n, PROMPT_WIDTH), dtype=torch.int64), torch.zeros((n, RESPONSE_WIDTH), dtype=torch.int64)
    mask, rewards = torch.zeros((n, RESPONSE_WIDTH), dtype=torch.int64), torch.zeros((n, RESPONSE_WIDTH))
    for row, (_, _, t, _, _) in enumerate(flat):
        p, r = len(t.prompt_ids), len(t.response_ids)
        prompts[row, PROMPT_WIDTH - p :], prompt_mask[row, PROMPT_WIDTH - p :] = torch.tensor(t.prompt_ids), 1
        responses[row, :r], response_attention[row, :r] = torch.tensor(t.response_ids), 1
        mask[row, :r] = torch.tensor(t.model_mask, dtype=torch.int64)
        rewards[row, r - 1] = t.reward
    attention = torch.cat([prompt_mask, response_attention], dim=1)
    fields = [{**credit.rollout_fields(t, k, hinted, leaked), **rollout_stats(t, {"domain": "math"}), **search_fields({})}
              for _, k, t, hinted, leaked in flat]
    non_tensor = {"uid": np.array([f"problem-{x}" for x, *_ in flat], dtype=object)}
    for name in fields[0]:
        non_tensor[name] = np.empty(n, dtype=object)
        non_tensor[name][:] = [f[name] for f in fields]
    old = torch.from_numpy(np.random.default_rng(4).normal(-2.0, 1.0, (n, RESPONSE_WIDTH))).float()
    return DataProto.from_dict(tensors={
        "prompts": prompts, "responses": responses, "response_mask": mask, "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention, "position_ids": compute_position_id_with_mask(attention),
        "token_level_scores": rewards, "old_log_probs": old,
    }, non_tensors=non_tensor, meta_info={"temperature": TEMPERATURE, "global_token_num": attention.sum(-1).tolist()})


class FakeActor:
    """verl's actor worker group at its ``compute_log_prob`` boundary (after verl strips the
    padding): the log-prob of the token after each position is -(sum of the ids up to it)/100,
    a function of the whole context, so a hinted prompt changes every response token's; it
    records what each call was sent. ``dp`` data-parallel ranks."""

    def __init__(self, dp: int):
        self._dispatch_info, self.sent = {"actor": list(range(dp))}, []

    def compute_log_prob(self, data):
        from verl.utils import tensordict_utils as tu

        seqs = [s.tolist() for s in data["input_ids"].unbind()]
        self.sent.append((seqs, tu.get(data, "temperature")))
        values = torch.cat([-torch.cumsum(torch.tensor(s, dtype=torch.float64), 0) / 100 for s in seqs]).float()
        log_probs = torch.nested.nested_tensor_from_jagged(values, offsets=data["input_ids"].offsets())
        return tu.get_tensordict({"log_probs": log_probs, "entropy": log_probs.clone()}, {"metrics": {"mfu": 0.0}})


def oc_trainer(suite_trainer, dp=3):
    from omegaconf import OmegaConf

    from baselines.oc_grpo import OCGRPO

    trainer = suite_trainer(OCGRPO(budget=4, is_cap=2.0), None)
    trainer.config = OmegaConf.merge(trainer.config, {"actor_rollout_ref": {"actor": {}}})
    trainer.actor_rollout_wg = FakeActor(dp)
    return trainer


def test_oc_grpo_weights_privileged_rows_by_the_actors_hinted_rescoring(suite_trainer):
    from cbpo.credit import grpo_advantages

    groups = oc_groups()
    batch = oc_batch(groups)
    trainer = oc_trainer(suite_trainer, dp=3)
    old = batch.batch["old_log_probs"].double().clone()
    mask = batch.batch["response_mask"].bool().clone()
    trainer.suite_credit(batch)

    rows = {(int(x.split("-")[1]), int(k)): row for row, (x, k) in
            enumerate(zip(batch.non_tensor_batch["uid"], batch.non_tensor_batch["cbpo_index"]))}
    adv = batch.batch["advantages"].double()
    weighted = 0
    for x, group in enumerate(groups):
        rewards = np.array([0.0 if leaked else t.reward for t, _, leaked in group])
        expected = grpo_advantages(rewards)
        for k, (t, hinted, _) in enumerate(group):
            row = rows[x, k]
            pos = mask[row]
            weight = torch.ones(int(pos.sum()), dtype=torch.float64)
            if t.kind == "privileged":
                context = hinted + t.response_ids
                behaviour = torch.tensor([-sum(context[: len(hinted) + j]) / 100 for j in range(len(t.response_ids))],
                                         dtype=torch.float64)[torch.tensor(t.model_mask)]
                weight = torch.clamp(torch.exp(old[row][pos] - behaviour), max=2.0)
                weighted += int((weight < 2.0).sum() > 0 and (weight == 2.0).sum() > 0)  # both sides of the cap
            torch.testing.assert_close(adv[row][pos], expected[k] * weight, atol=1e-5, rtol=1e-5)
            assert not adv[row][~pos].any()
    assert weighted > 0 and expected[0] != 0  # the comparison is not vacuous

    ((sent, temperature),) = trainer.actor_rollout_wg.sent
    assert temperature == TEMPERATURE  # the batch's, as verl's old_log_probs call
    assert len(sent) == 6  # 4 privileged rows, padded to a multiple of the actor's 3 ranks
    privileged = [r for r in range(len(batch)) if batch.non_tensor_batch["cbpo_kind"][r] == "privileged"]
    by_row = {rows[x, k]: (hinted, t) for x, g in enumerate(groups) for k, (t, hinted, _) in enumerate(g)}
    assert sent[:4] == [by_row[r][0] + by_row[r][1].response_ids for r in privileged]  # hinted prompt + same response


def test_the_hinted_batch_is_verls_layout_with_the_hinted_prompts(suite_trainer):
    from cbpo.backends.verl.trainer import hinted_batch

    groups = oc_groups()
    batch = oc_batch(groups)
    rows = credit.privileged_rows(batch)
    hinted = hinted_batch(batch, rows, PAD)
    prompts = [list(batch.non_tensor_batch["cbpo_hinted_prompt"][r]) for r in rows]
    width = max(map(len, prompts))
    assert width > PROMPT_WIDTH  # hinted prompts exceed verl's prompt width: the block is theirs
    assert hinted.meta_info["temperature"] == TEMPERATURE
    for i, (r, p) in enumerate(zip(rows, prompts)):
        assert hinted.batch["prompts"][i].tolist() == [PAD] * (width - len(p)) + p  # left-padded
        assert torch.equal(hinted.batch["responses"][i], batch.batch["responses"][r])  # right-padded, as in the batch
        assert torch.equal(hinted.batch["response_mask"][i], batch.batch["response_mask"][r])
        assert torch.equal(hinted.batch["input_ids"][i], torch.cat([hinted.batch["prompts"][i], batch.batch["responses"][r]]))
        n_response = int(batch.batch["attention_mask"][r, PROMPT_WIDTH:].sum())
        attention = [0] * (width - len(p)) + [1] * (len(p) + n_response) + [0] * (RESPONSE_WIDTH - n_response)
        assert hinted.batch["attention_mask"][i].tolist() == attention
        positions = hinted.batch["position_ids"][i].tolist()
        assert positions[width - len(p) : width + n_response] == list(range(len(p) + n_response))


def test_each_generation_row_carries_the_training_step(suite_trainer):
    # verl's agent loop sees only the rows' columns; DAPO's replacement draws are seeded by the step
    from cbpo.backends.verl.agent_loop import BATCH_ROWS, STEP

    trainer = suite_trainer(get_method("dapo")(budget=4), None)
    batch = DataProto.from_dict(tensors={"input_ids": torch.zeros((3, 5), dtype=torch.int64)},
                                non_tensors={"uid": np.array(["a", "b", "c"], dtype=object),
                                             "extra_info": np.array([{"index": i} for i in range(3)], dtype=object)})
    for step in (1, 4):
        trainer.global_steps = step
        gen = trainer._get_gen_batch(batch.slice(0, None))
        assert gen.non_tensor_batch[STEP].tolist() == [step] * 3
        assert gen.non_tensor_batch[BATCH_ROWS].tolist() == [[0, 1, 2]] * 3  # DAPO deals replacements by it
        assert "extra_info" in gen.non_tensor_batch  # verl's own columns still reach the agent loop
