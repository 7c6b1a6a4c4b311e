"""What is reproducible (issue 24.8, docs/reproducibility.md#determinism): on one machine, the same
seed and thread count give bitwise-equal weights. Two things change the bits between machines of
one kind: the thread count where MKL splits a matrix product's reduction over threads (it does on
an AVX-512 Intel Xeon, not on an AVX2 AMD EPYC), and the CPU kernels ATen picks for the host's
instruction set. ``MKL_CBWR=AVX2,STRICT`` removes the first, ``ATEN_CPU_CAPABILITY=avx2`` the second
(both read once at start)."""
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SFT = """
import hashlib, sys, tempfile
from pathlib import Path
import torch
torch.set_num_threads(int(sys.argv[1]))
from cbpo.models import build_scratch_model, model_spec, train_tokenizer
from cbpo.stages import SFTConfig
from cbpo.backends.local.sft import sft
from cbpo.runlog import MetricsLog

rows = [{"question": f"What is {a} plus {b}?",
         "trace": f"<python>print({a} + {b})</python><result>\\n{a + b}\\n</result><answer>\\\\boxed{{{a + b}}}</answer>"}
        for a in range(8) for b in range(4)]
tok = train_tokenizer([r["question"] + r["trace"] for r in rows], 300)
model = build_scratch_model(model_spec("tiny"), tok, seed=0)
with tempfile.TemporaryDirectory() as d:
    sft(model, tok, rows, SFTConfig(steps=5, batch_size=8, lr=6e-3, micro_batches=2, checkpoint_every=100),
        Path(d), MetricsLog(Path(d) / "metrics.jsonl"), system_prompt=None)
digest = hashlib.sha256()
for _, tensor in sorted(model.state_dict().items()):
    digest.update(tensor.contiguous().numpy().tobytes())
print(torch.backends.cpu.get_cpu_capability(), digest.hexdigest())
"""


@functools.cache
def native(threads: int) -> tuple[str, str]:
    return sft_weights(threads)


def sft_weights(threads: int, **env) -> tuple[str, str]:
    """(the CPU capability torch ran with, sha256 of the tiny model's weights after 5 SFT steps)."""
    out = subprocess.run([sys.executable, "-c", SFT, str(threads)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": str(threads), **env}, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    capability, digest = out.stdout.split()[-2:]
    return capability, digest


@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_seed_and_thread_count_on_one_machine_give_bitwise_equal_weights(threads):
    assert sft_weights(threads) == native(threads)


def test_mkls_strict_mode_makes_the_weights_independent_of_the_thread_count():
    # Without it, 1 and 2 threads differ on an AVX-512 Xeon (MKL's GEMM splits the reduction).
    strict = {"MKL_CBWR": "AVX2,STRICT"}
    assert sft_weights(1, **strict) == sft_weights(2, **strict)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512", reason="the host has no AVX-512 kernels to compare")
def test_the_hosts_instruction_set_changes_the_bits_unless_pinned():
    avx2 = sft_weights(1, ATEN_CPU_CAPABILITY="avx2")
    assert native(1)[0] == "AVX512" and avx2[0] == "AVX2"
    assert native(1)[1] != avx2[1]  # why two machines of one kind can disagree
    assert sft_weights(1, ATEN_CPU_CAPABILITY="avx2") == avx2  # pinned, it is reproducible again
