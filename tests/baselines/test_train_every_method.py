"""Every training method of the registry through the real RL loop (tiny model, real agent loop
and engine): each problem trained on gets exactly the shared M = 16 rollout slots, and what
DAPO's dynamic sampling draws beyond them is accounted in the step's metrics."""
import json
import zlib

import pytest
import torch

from cbpo.registry import get_method, method_names
from cbpo.rollout.agent import AgentConfig
from cbpo.stages import RLConfig
from cbpo.backends.local.rl import rl_train
from cbpo.runlog import MetricsLog, save_checkpoint

TRAINING = [name for name in method_names() if get_method(name).trains]
SLOTS = 16


@pytest.fixture(scope="module")
def tokenizer():
    from cbpo.models import train_tokenizer

    texts = ["<python>print(1 + 2)</python><result>\n3\n</result><answer>\\boxed{3}</answer>", "What is 1 plus 2?"] * 20
    return train_tokenizer(texts, 300)


def varied_reward(texts, rows):
    # Deterministic; mixed within a group except on the even problems, which always fail, so
    # DAPO's filter drops those groups and must draw (and account) more.
    return [0.0 if int(r["id"][1:]) % 2 == 0 else float(zlib.crc32(t.encode()) % 2) for t, r in zip(texts, rows)]


@pytest.mark.parametrize("name", TRAINING)
def test_every_method_trains_with_the_shared_slots(name, tokenizer, tiny_causal_lm, tmp_path):
    model = tiny_causal_lm(tokenizer)
    overrides = {"budget": SLOTS}
    if name == "opd":
        teacher = tmp_path / "teacher"
        save_checkpoint(teacher, tiny_causal_lm(tokenizer), tokenizer, {"step": "final"})
        overrides["teacher"] = str(teacher)
    if name == "dapo":
        overrides["max_num_gen_batches"] = 3
    method = get_method(name)(vocab_size=len(tokenizer), **overrides)
    rows = [{"id": f"p{i}", "question": f"What is {i} plus 2?", "answer": str(i + 2), "domain": "math"} for i in range(4)]
    cfg = RLConfig(steps=2, problems_per_step=2, checkpoint_every=1, temperature=1.0,
                   agent=AgentConfig(max_tool_calls=1, max_new_tokens=6, max_total_tokens=24, max_obs_tokens=6))
    rl_train(model, tokenizer, method, rows, {"python": lambda code: "3"}, varied_reward, cfg, tmp_path,
             MetricsLog(tmp_path / "metrics.jsonl"), None)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        trained = r["problems"]
        assert 0 < trained <= cfg.problems_per_step
        assert r["rollouts"] == SLOTS * trained, r
        assert sum(r[k] for k in r if k.startswith("n_")) == r["rollouts"]
        if name == "dapo":  # every draw beyond the kept groups is counted, never hidden
            # a problem offered twice in a step (4 rows, 6 offered) is drawn once, so a batch may be short
            drawn = r["rollouts"] + r["extra_rollouts"]
            assert drawn % SLOTS == 0 and SLOTS * r["gen_batches"] <= drawn <= SLOTS * cfg.problems_per_step * r["gen_batches"]
        assert r["generated_tokens"] > 0 and r["loss"] == r["loss"]  # finite
    if name == "dapo":
        assert sum(r["extra_rollouts"] for r in records) > 0


@pytest.mark.parametrize("name", ["tree_grpo", "arpo", "aepo"])
def test_a_method_with_its_own_draws_resumes_exactly(name, tokenizer, tiny_causal_lm, tmp_path):
    # These methods draw expansion/branch decisions from their own generator: it is
    # checkpointed with the engine's, so a run that crashed after step 1 and resumed writes
    # what an uninterrupted one does.
    rows = [{"id": f"p{i}", "question": f"What is {i} plus 2?", "answer": str(i + 2), "domain": "math"} for i in range(4)]
    cfg = RLConfig(steps=3, problems_per_step=2, checkpoint_every=1, dump_rollouts=True,
                   agent=AgentConfig(max_tool_calls=2, max_new_tokens=6, max_total_tokens=48, max_obs_tokens=4))
    tools = {"python": lambda code: "3"}

    tags = [tokenizer.convert_tokens_to_ids(t) for t in ("<python>", "</python>")]

    def run(out, rewarder):
        model = tiny_causal_lm(tokenizer)
        bias = torch.zeros(model.config.vocab_size)
        bias[tags] = 4.0  # the random model then calls the tool often: tree nodes and branch points exist
        model.lm_head.register_forward_hook(lambda _m, _i, logits: logits + bias)
        method = get_method(name)(vocab_size=len(tokenizer), budget=SLOTS)
        rl_train(model, tokenizer, method, rows, tools, rewarder, cfg, out, MetricsLog(out / "metrics.jsonl"), None)

    run(tmp_path / "whole", varied_reward)
    calls = []

    def crash_in_step_2(texts, rows):
        calls.append(1)
        if len(calls) > 1 and (tmp_path / "killed" / "step_000001").is_dir():
            raise KeyboardInterrupt
        return varied_reward(texts, rows)

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", crash_in_step_2)
    run(tmp_path / "killed", varied_reward)

    def stripped(out):
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if "seconds" not in k} for r in records]

    assert sum(r["n_branch"] for r in stripped(tmp_path / "whole")) > 0
    assert stripped(tmp_path / "killed") == stripped(tmp_path / "whole")
    for step in (2, 3):
        dump = f"rollouts/step_{step:06d}.jsonl"
        assert (tmp_path / "killed" / dump).read_text() == (tmp_path / "whole" / dump).read_text()
