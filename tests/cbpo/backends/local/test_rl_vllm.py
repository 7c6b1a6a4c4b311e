"""``python -m cbpo.train stage=rl rl.engine=vllm``: the local trainer with rollouts from the real
vLLM (its CPU build here), GRPO and CBPO on the smoke preset from a saved tiny checkpoint.
Weights following each update, log-prob and entropy agreement and branch-prefix caching are
tested on the engine itself (tests/cbpo/rollout/test_vllm_engine.py); here the whole loop."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "2", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
SFT_FINAL = Path("runs/smoke/tiny/mix/seed0/sft/final")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """Small task files and the prepared tiny model (head size 32, which vLLM's CPU attention
    takes) saved as the finished SFT run."""
    from cbpo.data import load_split
    from cbpo.tasks import generate_task
    from cbpo.models import load_model, prepare_model
    from cbpo.runlog import save_checkpoint

    work = tmp_path_factory.mktemp("vllm-runs")
    for task in ("arith", "twohop"):
        generate_task(task, work / "data", seed=0, n_train=20, n_test=5)
    rows = load_split({"tasks": ["arith", "twohop"]}, work / "data", "train")
    prepare_model("tiny", work / "models" / "tiny", corpus_texts=[x for r in rows for x in (r["question"], r["trace"])])
    model, tokenizer = load_model(work / "models" / "tiny")
    save_checkpoint(work / SFT_FINAL, model, tokenizer, {"step": "final"})
    return work


def trainer_logprobs(checkpoint: Path, dump: Path, data_dir: Path):
    """The trainer's log-probs (``token_logprobs``) under ``checkpoint`` of every model token
    of a rollout dump, and the engine's as dumped (rounded to 1e-5)."""
    import numpy as np
    import torch

    from cbpo.chat import build_prompt
    from cbpo.data import load_split
    from cbpo.models import load_model
    from cbpo.logprobs import rollout_tensors, token_logprobs
    from cbpo.trajectory import Trajectory

    model, tokenizer = load_model(checkpoint)
    questions = {r["id"]: r["question"] for r in load_split({"tasks": ["arith", "twohop"]}, data_dir, "train")}
    trajs, engine = [], []
    for r in map(json.loads, dump.read_text().splitlines()):
        # the dump holds the response; the prompt is its problem's (the smoke preset has no system prompt)
        trajs.append(Trajectory(prompt_ids=build_prompt(tokenizer, questions[r["problem"]], None),
                                response_ids=r["response_ids"], model_mask=[bool(m) for m in r["model_mask"]]))
        engine += [lp for lp, m in zip(r["logprob"], r["model_mask"]) if m]
    credits = [(np.zeros(t.n_model_tokens), np.ones(t.n_model_tokens)) for t in trajs]
    batch = rollout_tensors(trajs, credits, tokenizer.pad_token_id)
    with torch.no_grad():
        lp = token_logprobs(model.eval(), batch["input_ids"], batch["attention_mask"], batch["n_resp"])
    return lp[batch["loss_mask"].bool()].numpy(), np.array(engine)


@pytest.mark.engines
@pytest.mark.parametrize("method", ["grpo", "cbpo"])
def test_rl_on_vllm_trains_from_the_updated_policy_and_logs_prefix_cache_use(workdir, method):
    # Every reward of an untrained model is 0: weight decay makes each update move the weights
    # anyway. CBPO's alpha 0.6: such a model's windows are as uncertain as its root, and the
    # default alpha (0.2, under kappa 0.25) would fill every slot instead of branching.
    extra = ["method.alpha=0.6"] if method == "cbpo" else []
    command = [sys.executable, "-m", "cbpo.train", "stage=rl", "preset=smoke", "rl.engine=vllm", f"method={method}",
               "++rl.weight_decay=1.0", "rl.lr=1e-2", "run_name=" + method, *extra]
    done = subprocess.run(command, cwd=workdir, env=ENV, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    run = workdir / "runs/smoke/tiny/mix/seed0" / method
    assert (run / "final" / "DONE.json").is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        print(f"\n{method} step {r['step']}: rollouts {r['rollouts']} (branches {r['n_branch']}), generated "
              f"{r['generated_tokens']}, prompt tokens {r['prefill_tokens']}, from the prefix cache "
              f"{r['prefill_cached_tokens']}, {r['wall_seconds']:.1f} s")
        assert r["generated_tokens"] > 0
        assert 0 < r["prefill_cached_tokens"] < r["prefill_tokens"]
    if method == "cbpo":
        assert sum(r["n_branch"] for r in records) > 0
    # Step 2 sampled from the weights after update 1 (kept as step_000001): vLLM's log-probs are
    # that policy's as the trainer computes them, not the starting checkpoint's.
    dump = run / "rollouts" / "step_000002.jsonl"
    updated, engine = trainer_logprobs(run / "step_000001", dump, workdir / "data")
    start, _ = trainer_logprobs(workdir / SFT_FINAL, dump, workdir / "data")
    gap, moved = abs(updated - engine).max(), abs(start - engine).max()
    print(f"{method}: step-2 rollouts, {len(engine)} model tokens: max |vLLM - trainer after update 1| {gap:.1e} "
          f"(dump rounds to 1e-5), max |vLLM - starting weights| {moved:.1e}")
    assert gap < 2e-5 and moved > 1e-3
