"""``python -m eval.run ... evaluation.engine=vllm``: the agent loop with tools on the real vLLM
(its CPU build here) scores a slice of a real benchmark file exactly as the transformers engine
does under greedy decoding, and its samples' identity names the engine."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cbpo.data import shared_data_dir

ENV = {**os.environ, "OMP_NUM_THREADS": "2", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
GSM8K = shared_data_dir() / "benchmarks" / "gsm8k" / "test.jsonl"
LIMIT = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny model taught one reply whatever the question: a Python call, then the answer it
    prints, which is the first GSM8K problem's (18), so greedy decoding calls a tool on every
    problem and scores 1 on the first."""
    from cbpo.chat import format_observation
    from cbpo.models import load_model, prepare_model
    from cbpo.stages import SFTConfig
    from cbpo.backends.local.sft import sft
    from cbpo.runlog import MetricsLog, save_checkpoint

    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[:LIMIT]]
    trace = f"<python>print(9 * 2)</python>{format_observation('18')}<answer>\\boxed{{18}}</answer>"
    work = tmp_path_factory.mktemp("eval-vllm")
    prepare_model("tiny", work / "prepared", corpus_texts=[*questions, trace])
    model, tokenizer = load_model(work / "prepared")
    cfg = SFTConfig(steps=80, batch_size=4, lr=1e-2, warmup_steps=1, log_every=80, checkpoint_every=80)
    sft(model, tokenizer, [{"question": q, "trace": trace} for q in questions], cfg, work / "sft",
        MetricsLog(work / "sft" / "metrics.jsonl"), system_prompt=None)
    save_checkpoint(work / "final", model, tokenizer, {"step": "final"})
    return work / "final"


def evaluate(checkpoint: Path, engine: str):
    out = checkpoint.parent / f"eval-{engine}"
    command = [sys.executable, "-m", "eval.run", "preset=smoke", "benchmark=gsm8k", f"evaluation.limit={LIMIT}",
               f"evaluation.engine={engine}", f"data_root={shared_data_dir()}", f"checkpoint={checkpoint}",
               f"eval_out={out}"]
    done = subprocess.run(command, cwd=checkpoint.parent, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return samples, json.loads((out / "summary.json").read_text()), json.loads((out / "identity.json").read_text())


@pytest.mark.engines
@pytest.mark.skipif(not GSM8K.is_file(), reason=f"no GSM8K file at {GSM8K}")
def test_vllm_scores_a_gsm8k_slice_as_transformers_does(checkpoint):
    hf, hf_summary, hf_identity = evaluate(checkpoint, "hf")
    vllm, vllm_summary, vllm_identity = evaluate(checkpoint, "vllm")
    key = lambda r: (r["id"], r["sample"])  # noqa: E731
    hf, vllm = sorted(hf, key=key), sorted(vllm, key=key)
    print(f"\nGSM8K first {LIMIT}, greedy: pass@1 hf {hf_summary['pass@1']} vllm {vllm_summary['pass@1']}; "
          f"tool calls {[r['tool_calls'] for r in vllm]}; scores {[r['score'] for r in vllm]}")
    assert len(vllm) == LIMIT and all(r["tool_calls"] >= 1 for r in vllm)
    assert [(r["trajectory"], r["score"], r["tokens"]) for r in vllm] == [(r["trajectory"], r["score"], r["tokens"]) for r in hf]
    assert vllm_summary["pass@1"] == hf_summary["pass@1"] > 0
    assert (hf_identity["evaluation"]["engine"], vllm_identity["evaluation"]["engine"]) == ("hf", "vllm")
    assert {**vllm_identity, "evaluation": {**vllm_identity["evaluation"], "engine": "hf"}} == hf_identity
