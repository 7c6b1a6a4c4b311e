import functools
import os
import re
import sys
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from snakemake.utils import validate

from cbpo.data import data_files, shared_data_dir
from cbpo.models import MODELS
from cbpo.registry import get_method, known_methods
from cbpo.schema import register
from cbpo.tasks import TASKS, get_task, has_decisions
from eval.benchmarks import benchmark_config, planned_file

ROOT = workflow.basedir  # the repository: configs live there, outputs go to the workdir
validate(config, os.path.join(ROOT, "workflow", "schemas", "config.schema.yaml"))

MODEL, DATA, PRESET = config["model"], config["data"], config["preset"]


def seed_list(key):
    """A seed list of the config (``seeds``, ``study_seeds``): one integer or a list."""
    value = config[key]
    seeds = [int(s) for s in value] if isinstance(value, list) else [value]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{key}={seeds}: a seed is listed twice")
    return seeds


SEEDS = seed_list("seeds")
for group, name in (("model", MODEL), ("data", DATA), ("preset", PRESET)):
    if not Path(ROOT, "configs", group, f"{name}.yaml").is_file():  # named before anything composes it
        raise ValueError(f"{group}={name}: there is no configs/{group}/{name}.yaml")
ROWS = config["preset_rows"].get(PRESET, config["preset_rows"]["default"])
METHODS = list(ROWS["methods"] if config["methods"] is None else config["methods"])
BASELINES = ROWS["baselines_without_rl"] if config["baselines_without_rl"] is None else config["baselines_without_rl"]
RUNS = list(BASELINES) + METHODS
if config["benchmarks"] is None and DATA not in config["data_benchmarks"]:
    raise ValueError(f"data {DATA!r} has no default benchmarks: give benchmarks=[...] or add it to data_benchmarks")
BENCHMARKS = list(config["benchmarks"] or config["data_benchmarks"][DATA])
# Judge settings given in the DAG config, as Hydra overrides (null ones keep the benchmark's).
JUDGE = [f"judge.{k}={v}" for k, v in config["judge"].items() if v is not None]
if config["judge_fallback"] is not None:
    JUDGE.append(f"judge_fallback={config['judge_fallback']}")
LABEL = config["label"] or f"{PRESET} preset, {MODEL}, {DATA} data"
DATA_ROOT = os.path.abspath(shared_data_dir())  # $CBPO_SHARED_DATA or ../shared/data, passed to every job
# Jobs run offline unless the caller exports HF_HUB_OFFLINE=0 (ENV below): plan the same way.
OFFLINE = os.environ.get("HF_HUB_OFFLINE", "1") != "0"
VARIANTS = config["variants"]
for run in RUNS:
    if run not in VARIANTS:  # a variant may be a Table 1 row (`make credit`); it is checked below
        get_method(run)  # an unknown method fails here, naming it and the known ones
for name, spec in VARIANTS.items():
    if name in known_methods():
        raise ValueError(f"variant {name!r} is a method's name: a variant needs a run folder of its own")
    if not get_method(spec["method"]).trains:
        raise ValueError(f"variant {name!r}: method {spec['method']!r} does not train")
TABLES = config["tables"]
for rows in TABLES.values():
    for run in rows.values():
        if run not in VARIANTS:
            get_method(run)
BACKBONE = config["paper_backbone"].get(MODEL, config["paper_backbone"]["default"])

# Outputs are keyed by what made them, as the Hydra configs key them (configs/config.yaml).
KEY = "{preset}/{model}/{data}/seed{seed}"
STUDY = f"{PRESET}/{MODEL}/{DATA}"  # a table or figure aggregates the configured seeds of one study
TABLES_DIR = f"results/tables/{STUDY}"


def keyed(pattern, seeds=None):
    """``pattern`` (``{key}`` for a run key) for every seed (the configured ones unless
    ``seeds`` says), in seed order."""
    return [pattern.format(key=f"{STUDY}/seed{s}") for s in (SEEDS if seeds is None else seeds)]


SUMMARIES = keyed("results/raw/{key}")  # per seed: <run>/<benchmark>/summary.json
wildcard_constraints:
    preset="[A-Za-z0-9._-]+",
    model="[A-Za-z0-9._-]+",
    data="[A-Za-z0-9._-]+",
    seed="[0-9]+",
    run="[A-Za-z0-9._-]+",
    benchmark="[A-Za-z0-9_-]+",  # never "<benchmark>/pass5": those are Fig. 4's evaluations
    # Only methods that train, and variants, have an rl job; the rest are evaluated from the
    # folder they name.
    trained="|".join(re.escape(r) for r in [*(m for m in known_methods() if get_method(m).trains), *VARIANTS]),


def hydra_configs(w):
    """The Hydra configs a job reads: inputs, so editing one reruns the jobs that read it."""
    return [f"{ROOT}/configs/{c}.yaml" for c in ("config", f"model/{w.model}", f"data/{w.data}", f"preset/{w.preset}")]


def data_config(name):
    """A data config's YAML; a missing one is named by hydra_configs' input instead."""
    path = Path(f"{ROOT}/configs/data/{name}.yaml")
    return yaml.safe_load(path.read_text()) if path.is_file() else {"name": name}


def training_files(split):
    """The data-root files a training stage reads (none for built-in tasks, which the data
    step writes): missing ones fail at planning, naming the path, not inside a GPU job."""
    def files(w):
        return [str(p) for p in data_files({**data_config(w.data), "root": DATA_ROOT}, split)]
    return files


def resources(rule):
    return config["resources"].get(rule, {})


def method_of(run):
    """The method a run trains or evaluates: a variant's, else the run's own name."""
    return VARIANTS[run]["method"] if run in VARIANTS else run


def overrides_of(run):
    """A variant's Hydra overrides (``method.KEY=VALUE``); none for a method's own run."""
    spec = VARIANTS.get(run, {"overrides": {}})
    return [f"method.{k}={v}" for k, v in spec["overrides"].items()]


@functools.cache
def composed(*overrides):
    """The config a job of this DAG composes with ``overrides``; a bad one fails here, naming it."""
    register()
    with initialize_config_dir(config_dir=f"{ROOT}/configs", version_base=None):
        return compose("config", [f"model={MODEL}", f"data={DATA}", f"preset={PRESET}", *overrides])


def composed_method(method, overrides):
    """The method section a training job would compose."""
    return OmegaConf.to_container(composed(f"method={method}", *overrides).method, resolve=True)


def preset_sft_steps():
    """The preset's SFT step count, as the SFT job composes it."""
    return composed().sft.steps


# The sft and rl jobs' backend: the workflow's `backend`, else the preset's own (configs/preset/*.yaml:
# paper trains on verl). A job is told its backend only where it differs from what it composes.
PRESET_BACKEND = composed().backend
BACKEND = config["backend"] or PRESET_BACKEND
if config["async_training"] not in (None, "none") and BACKEND != "verl":
    raise ValueError(f"async_training={config['async_training']} is verl's trainer: it needs backend=verl "
                     f"(this study trains on {BACKEND})")


TEACHER = config["opd_teacher"].get(PRESET)  # None: the DAG trains the tiny teacher
# A teacher named as a model of cbpo.models is fetched into models/ like the backbone (prepare.smk).
TEACHER_MODEL = TEACHER if TEACHER in MODELS else None


def teacher_of(w):
    """OPD's teacher for a run: the preset's (its fetched folder), or the teacher run the DAG
    trains; none for others."""
    if method_of(w.trained) != "opd":
        return []
    if TEACHER_MODEL:
        return [f"models/{TEACHER_MODEL}"]
    return [TEACHER] if TEACHER else [f"runs/{KEY.format(**w)}/teacher/final"]


def run_of(name):
    """The run that serves a table row. A variant the preset's defaults already give is the
    method's own run (trained once, shared); any other variant trains in a folder of its own.
    Composed only when a table is planned (a missing data config is then named by Hydra)."""
    if name not in VARIANTS:
        return name
    method = method_of(name)
    same = composed_method(method, tuple(overrides_of(name))) == composed_method(method, ())
    return method if same else name


def table_summaries(table):
    """Every evaluation summary a table reads: each row's run on each benchmark."""
    def summaries(w):
        return study_summaries(dict.fromkeys(run_of(r) for r in TABLES[table].values()))
    return summaries


def study_summaries(runs, seeds=None):
    """Each run's summary on each benchmark, for every seed (the configured ones unless ``seeds``)."""
    return [f"{d}/{run}/{b}/summary.json" for d in keyed("results/raw/{key}", seeds) for run in runs for b in BENCHMARKS]


def table_rows(table):
    """A table's rows for eval.report: ``LABEL=RUN``, the run that serves each row."""
    return lambda w: [f"{label}={run_of(run)}" for label, run in TABLES[table].items()]


def evaluated_model(w):
    """What an evaluation reads: a trained run's final checkpoint, or for the rows that do not
    train (Base, TIR, SFT) the folder their method config names."""
    row = get_method(method_of(w.run))
    run_root = f"runs/{w.preset}/{w.model}/{w.data}/seed{w.seed}"
    if row.trains:
        return f"{run_root}/{w.run}/final/DONE.json"
    if row.config().weights == "sft":
        return f"{run_root}/sft/final/DONE.json"
    return f"models/{w.model}/cbpo_model.json"


def benchmark_file(w):
    """The benchmark's file (a missing one stops planning, naming it); none when the hub
    serves it (HF_HUB_OFFLINE=0)."""
    path = planned_file(w.benchmark, DATA_ROOT, "data", offline=OFFLINE)
    return [] if path is None else [str(path)]

# Every value that reaches a shell command is quoted (`:q`, shlex.quote): a venv path with a
# space or a label with a quote stays one argument and is never read as shell syntax.
PYTHON = sys.executable
# One BLAS thread per job thread: `-c2` runs two single-threaded jobs side by side.
# PYTHON is the interpreter running snakemake, not a param: a moved environment reruns nothing.
ENV = "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} TOKENIZERS_PARALLELISM=false WANDB_MODE=${{WANDB_MODE:-offline}} HF_HUB_OFFLINE=${{HF_HUB_OFFLINE:-1}} {PYTHON:q}"
# The settings every training and evaluation job shares (data_root from its `params`); the
# rest are in the Hydra configs.
JOB = "model={wildcards.model:q} data={wildcards.data:q} preset={wildcards.preset:q} seed={wildcards.seed:q} data_root={params.data_root:q}"


def command(*words, append=False):
    """A job's shell command: the environment, ``python -m <words>``, its log (added to, not
    replaced, with ``append``: a job's second command)."""
    return " ".join([ENV, "-m", *words, ">>" if append else ">", "{log:q} 2>&1"])


# What every table's eval.report call shares: the seeds' summaries and training runs (budget
# columns), the paper backbone to compare with. Params, so a new seed list or
# caption rewrites the tables.
DEVICE_HOURS = config["device_hours"].get(PRESET, config["device_hours"]["default"])


def report_params(seeds=None):
    return dict(
        summaries=keyed("results/raw/{key}", seeds),
        runs_dirs=keyed("runs/{key}", seeds),
        benchmarks=BENCHMARKS,
        label=LABEL,
        backbone=BACKBONE,
        devices=DEVICE_HOURS["devices_per_job"],
        device_kind=DEVICE_HOURS["kind"],
    )


REPORT_PARAMS = report_params()


def report_command(args):
    """``python -m eval.report <args>`` with the shared REPORT_PARAMS options."""
    return ("{PYTHON:q} -m eval.report " + args + " --summaries {params.summaries:q} --runs {params.runs_dirs:q}"
            " --benchmarks {params.benchmarks:q} --out {params.out:q}"
            " --backbone={params.backbone:q} --label={params.label:q} --devices-per-job={params.devices:q}"
            " --device-kind={params.device_kind:q} > {log:q} 2>&1")
