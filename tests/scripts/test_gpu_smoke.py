"""scripts/gpu_smoke.py on CPU: its arguments, its refusal without a GPU, and its reading of a
finished run (the GPU checks themselves need a GPU)."""
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke.py"


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_train_grpo_and_cbpo_locally_on_both_engines(smoke):
    args = smoke.parse_args([])
    assert (args.methods, args.backends, args.rl_engines, args.steps) == (["grpo", "cbpo"], ["local"], ["hf", "vllm"], 2)
    assert args.model is None and args.max_model_len is None and not args.skip_train
    args = smoke.parse_args(["--methods", "dapo", "--backends", "local,verl", "--rl-engines", "vllm", "--steps", "3"])
    assert (args.methods, args.backends, args.rl_engines, args.steps) == (["dapo"], ["local", "verl"], ["vllm"], 3)


@pytest.mark.parametrize("argv", [["--methods", "grpo,nosuch"], ["--methods", "base"], ["--backends", "gpu"],
                                  ["--rl-engines", "sglang"], ["--steps", "1"]])
def test_bad_choices_are_refused(smoke, argv, capsys):
    with pytest.raises(SystemExit):
        smoke.parse_args(argv)
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_without_a_gpu_it_stops_with_status_2(smoke, capsys):
    assert smoke.main([]) == 2
    assert "gpu_smoke needs a CUDA GPU" in capsys.readouterr().err


def test_run_problems_reads_the_run_layout(smoke, tmp_path):
    run = tmp_path / "smoke" / "arith" / "grpo-local-hf"
    (run / "final").mkdir(parents=True)
    (run / "final" / "DONE.json").write_text("{}")
    records = [{"step": 1, "reward": 0.5, "generated_tokens": 10}, {"step": 2, "reward": math.nan, "generated_tokens": 0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert smoke.run_problems(tmp_path, "grpo-local-hf", 2) == ["step 2: reward nan", "step 2: no generated tokens"]
    assert smoke.run_problems(tmp_path, "grpo-local-hf", 3) == ["metrics steps [1, 2]", "step 2: reward nan",
                                                                 "step 2: no generated tokens"]
    assert "no finished run folder" in smoke.run_problems(tmp_path, "cbpo-local-hf", 2)[0]


def test_cpu_device_computes_in_float32_unless_told(smoke):
    assert (smoke.parse_args([]).device, smoke.parse_args([]).dtype) == ("cuda", "bfloat16")
    assert smoke.parse_args(["--device", "cpu"]).dtype == "float32"
    assert smoke.parse_args(["--device", "cpu", "--dtype", "bfloat16"]).dtype == "bfloat16"


def test_the_summary_is_one_line_per_check(smoke, capsys):
    checks = smoke.Checks()
    checks.add("train grpo-local-hf", True, "12 s, trained and resumed")
    checks.add("engine: vLLM starts", False, "RuntimeError: boom\nTraceback ...")
    assert checks.summary().splitlines() == [
        "PASS  train grpo-local-hf  (12 s, trained and resumed)",
        "FAIL  engine: vLLM starts  (RuntimeError: boom)",
        "SMOKE FAILED (1 of 2 checks)",
    ]


@pytest.mark.engines
def test_cpu_mode_passes_every_engine_check_on_vllm(tmp_path):
    """``--device cpu --skip-train`` on a tiny random checkpoint, through vLLM's CPU build."""
    import os
    import subprocess
    import sys

    from cbpo.data import load_split
    from cbpo.tasks import generate_task
    from cbpo.models import prepare_model

    generate_task("arith", tmp_path / "data", seed=0, n_train=20, n_test=5)
    texts = [x for r in load_split({"tasks": ["arith"]}, tmp_path / "data", "train") for x in (r["question"], r["trace"])]
    model = prepare_model("tiny", tmp_path / "tiny", corpus_texts=texts)
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--skip-train", "--model", str(model), "--samples", "2",
               "--max-new-tokens", "24", "--max-total-tokens", "48"]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = done.stdout[done.stdout.rindex("\nPASS  engine: vLLM starts"):].strip()  # the closing list
    print("\n" + summary)
    assert [line.split("  (")[0] for line in summary.splitlines()] == [
        "PASS  engine: vLLM starts", "PASS  engine: rollouts well-formed", "PASS  engine: prompts served from the prefix cache",
        "PASS  engine: log-probs and entropies equal transformers'", "PASS  engine: pushed weights reach vLLM", "SMOKE OK"]
