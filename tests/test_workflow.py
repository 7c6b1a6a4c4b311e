"""The bad-input contract of the Hydra entry points and the DAG planned for the paper study, on its
profiles and with hostile settings. The real DAG end to end: tests/workflow/test_smoke_study.py."""
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
def hydra(module, *overrides, cwd):
    return subprocess.run([sys.executable, "-m", module, *overrides], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)


@pytest.mark.parametrize(
    "module,overrides,needle",
    [
        ("cbpo.train", ["method=ppo9"], "ppo9"),
        ("cbpo.train", ["model=gpt9"], "gpt9"),
        ("cbpo.train", ["preset=huge"], "huge"),
        ("cbpo.train", ["rl.lr=fast"], "lr"),
        ("cbpo.train", ["+rl.warp=1", "stage=rl"], "warp"),
        ("cbpo.train", ["stage=sft"], "no task file"),
        ("cbpo.train", ["stage=dance"], "dance"),
        ("eval.run", ["benchmark=nope"], "nope"),
    ],
)
def test_bad_input_stops_with_a_message_naming_it(tmp_path, module, overrides, needle):
    out = hydra(module, *overrides, cwd=tmp_path)
    assert out.returncode != 0
    assert needle in out.stderr + out.stdout
    assert not list(tmp_path.rglob("DONE.json"))


@pytest.mark.parametrize(
    "second_row,needle",
    [
        (b'{"id": "b", "question": ', "not valid JSON"),
        (b'{"id": "b", "question": "q", "answer": "1", "domain": "math"}', "field 'trace' is missing"),
        (b'{"id": "b", "question": "\xff", "answer": "1", "domain": "math", "trace": "t"}', "not UTF-8"),
    ],
    ids=["not JSON", "no trace", "not UTF-8"],
)
def test_malformed_data_row_is_named(tmp_path, second_row, needle):
    task = tmp_path / "data" / "tasks" / "arith"
    task.mkdir(parents=True)
    good = b'{"id": "a", "question": "q", "answer": "1", "domain": "math", "trace": "<answer>1</answer>"}\n'
    (task / "train.jsonl").write_bytes(good + second_row + b"\n")
    out = hydra("cbpo.train", "stage=sft", "data=arith", cwd=tmp_path)
    assert out.returncode != 0 and "train.jsonl:2: " in out.stderr and needle in out.stderr


def spaced_python(tmp_path) -> Path:
    """This interpreter as seen from a venv folder whose path holds a space."""
    venv = tmp_path / "my venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    if sys.prefix != sys.base_prefix:  # a venv is found through the pyvenv.cfg beside bin/
        shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv)
        (venv / "lib").symlink_to(Path(sys.prefix) / "lib")
    return venv / "bin" / "python"


HOSTILE = "it's $(touch PWNED) `touch PWNED` tiny"


def test_every_shell_command_quotes_the_interpreter_and_config_values(tmp_path):
    python = spaced_python(tmp_path)
    config = tmp_path / "hostile.yaml"
    config.write_text(json.dumps({"label": HOSTILE, "benchmarks": ["arith", "webwalker"], "judge": {"model": HOSTILE}}))  # JSON is YAML
    cmd = [str(python), "-m", "snakemake", "-n", "-p", "table1", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "dag"),
           "-c1", "--configfile", str(config)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, "CBPO_SHARED_DATA": str(data_root(tmp_path))}, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    shells = [shlex.split(line.split("Shell command: ", 1)[1]) for line in (out.stdout + out.stderr).splitlines() if "Shell command: " in line]
    assert {words[words.index("-m") + 1] for words in shells} == {"cbpo.prepare", "cbpo.train", "eval.run", "eval.report"}
    for words in shells:
        assert words[words.index("-m") - 1] == str(python)
    evaluate = [words for words in shells if "eval.run" in words]
    assert sum(f"judge.model={HOSTILE}" in words for words in evaluate) == 5  # the judged benchmark's, one per Table 1 row
    (report,) = [words for words in shells if "eval.report" in words]
    assert f"--label={HOSTILE}" in report and report[report.index("--benchmarks") + 2] == "webwalker"


def test_table1_rule_runs_from_a_spaced_venv_with_a_hostile_label(tmp_path):
    dag = tmp_path / "dag"
    for run in ("sft", "grpo", "gigpo", "arpo", "cbpo"):
        for bench in ("arith", "twohop"):
            summary = dag / "results" / "raw" / "tiny" / "tiny" / "mix" / "seed0" / run / bench / "summary.json"
            summary.parent.mkdir(parents=True)
            summary.write_text(json.dumps({"pass@1": 0.5}))
    # Only table1 may run: the fake summaries stand in for the whole DAG above it.
    cmd = [str(spaced_python(tmp_path)), "-m", "snakemake", "table1", "--allowed-rules", "table1", "-s", str(ROOT / "Snakefile"),
           "-d", str(dag), "-c1", "--config", f"label={HOSTILE}"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert f"Pass@1 (%), {HOSTILE}." in (dag / "results" / "tables" / "tiny" / "tiny" / "mix" / "table1.md").read_text()
    assert not list(tmp_path.rglob("PWNED"))


# ---------------------------------------------------------------------------------------------
# The paper study, planned: both backbones and both domains, through the SLURM profile.

MATH = ["aime24", "aime25", "math500", "math", "gsm8k"]
SEARCH = ["webwalker", "hotpotqa", "2wiki", "musique", "bamboogle"]
TRAINING = ["opd", "grpo", "reinforce_pp", "dapo", "gspo", "eapo", "oc_grpo", "gigpo", "tree_grpo", "arpo", "cbpo"]


def data_root(tmp_path) -> Path:
    """A data root holding (empty) copies of every file the paper study reads: planning only
    checks that they exist."""
    root = tmp_path / "data root"
    for name in MATH + SEARCH:
        (root / "benchmarks" / name).mkdir(parents=True, exist_ok=True)
        (root / "benchmarks" / name / "test.jsonl").touch()
    (root / "train").mkdir(parents=True, exist_ok=True)
    for name in ("toolstar_grpo_mix_train.parquet", "toolstar_sft.jsonl"):
        (root / "train" / name).touch()
    return root


SLURM_STUBS = {
    # Records the submission and refuses it: snakemake stops after asking.
    "sbatch": 'printf "%s\\n" "$*" >> "$SBATCH_LOG"; echo "stub: not submitting" >&2; exit 1',
    "sacctmgr": "echo acct",  # the account the plugin validates against
    "sacct": "exit 0",
    "squeue": "exit 0",
    "sinfo": "exit 0",
}


def slurm_env(tmp_path) -> dict:
    bin_dir = tmp_path / "stub bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in SLURM_STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**ENV, "PATH": f"{bin_dir}:{ENV['PATH']}", "SBATCH_LOG": str(tmp_path / "sbatch.log"),
            "CBPO_SHARED_DATA": str(data_root(tmp_path))}


def plan(tmp_path, *args, env=None, cwd=ROOT):
    """`snakemake -n` as typed from the repository root (`--profile slurm`), outputs in tmp."""
    cmd = [str(SNAKEMAKE), *args, "-n", "--profile", "slurm", "-d", str(tmp_path / "work")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env or slurm_env(tmp_path), cwd=cwd, timeout=300)


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1].split("\n\n", 1)[0].splitlines()[3:]
    return {name: int(count) for name, count in (line.split() for line in table)}


@pytest.mark.parametrize("model", ["qwen3-1.7b", "qwen3-4b"])
@pytest.mark.parametrize("data,benchmarks", [("toolstar-math", MATH), ("toolstar-search", SEARCH)])
def test_paper_study_plans_every_row_on_its_domain(tmp_path, model, data, benchmarks):
    out = plan(tmp_path, "table1", "--config", f"model={model}", "preset=paper", f"data={data}")
    assert out.returncode == 0, out.stderr[-4000:]
    text = out.stdout + out.stderr
    # One policy per domain: 11 trained methods, 14 rows (with Base, TIR, SFT) x 5 benchmarks.
    # The backbone and OPD's teacher come from the hub: one fetch job (tests/workflow/test_paper_inputs.py).
    assert job_counts(text) == {"data": 1, "fetch": 1, "sft": 1, "rl": 11, "evaluate": 70, "table1": 1, "total": 85}
    key = f"paper/{model}/{data}/seed0"
    for method in TRAINING:
        assert f"runs/{key}/{method}/final/DONE.json" in text
    for bench in benchmarks:
        assert f"results/raw/{key}/cbpo/{bench}/summary.json" in text
    assert f"results/tables/paper/{model}/{data}/table1.md" in text  # the study's seeds together


def test_paper_study_checks_its_files_while_planning(tmp_path):
    env = slurm_env(tmp_path)
    (Path(env["CBPO_SHARED_DATA"]) / "benchmarks" / "gsm8k" / "test.jsonl").unlink()
    out = plan(tmp_path, "table1", "--config", "model=qwen3-1.7b", "preset=paper", "data=toolstar-math", env=env)
    assert out.returncode != 0
    assert str(Path(env["CBPO_SHARED_DATA"]) / "benchmarks" / "gsm8k" / "test.jsonl") in out.stderr + out.stdout


def test_a_missing_data_config_is_named_not_a_cycle(tmp_path):
    # `(?!sft$)` never excluded sft (the path goes on after the wildcard): rl claimed the SFT
    # run and the DAG reported a cycle instead of the missing config.
    out = plan(tmp_path, "--config", "preset=paper", "data=toolstar", "benchmarks=[aime24]")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "configs/data/toolstar.yaml" in text and "Cyclic" not in text


@pytest.mark.parametrize("override,needle", [("seeds=[-1]", "seeds"), ("seeds=[]", "seeds"), ("backend=gpu", "backend"), ("methods=ppo9", "ppo9")])
def test_bad_dag_config_stops_planning_naming_it(tmp_path, override, needle):
    out = plan(tmp_path, "--config", override)
    assert out.returncode != 0 and needle in out.stdout + out.stderr


def test_tiny_and_paper_runs_never_share_a_folder(tmp_path):
    def outputs(*config):
        out = plan(tmp_path, "table1", "-p", "--config", *config)
        assert out.returncode == 0, out.stderr[-4000:]
        return {line.split()[-1] for line in out.stdout.splitlines() if line.strip().startswith("output:")}

    tiny = outputs("preset=tiny")
    paper = outputs("preset=paper", "data=mix")
    seed1 = outputs("preset=tiny", "seeds=[1]")
    # A study's tables aggregate its configured seeds (one folder per study); runs and their
    # evaluations are the seed's own.
    shared = {p for p in tiny & paper | tiny & seed1 if p.startswith(("runs/", "results/raw/"))}
    assert not shared
    assert any(p.startswith("runs/tiny/tiny/mix/seed0/") for p in tiny)
    assert any(p.startswith("runs/tiny/tiny/mix/seed1/") for p in seed1)


def test_slurm_jobs_ask_for_their_gpus_cpus_memory_and_time(tmp_path):
    """The sbatch lines of an SFT, an RL and an evaluation job, each submitted (to the stub)
    once its inputs exist."""
    env = slurm_env(tmp_path)
    work = tmp_path / "work"
    key = "runs/paper/qwen3-1.7b/toolstar-math/seed0"
    made = [*(f"data/tasks/{t}/{s}.jsonl" for t in ("arith", "twohop") for s in ("train", "test")),
            "models/qwen3-1.7b/cbpo_model.json", "models/qwen3-4b/cbpo_model.json",
            f"{key}/sft/final/DONE.json", f"{key}/cbpo/final/DONE.json"]
    for i, path in enumerate(made):  # each newer than what it was made from
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).touch()
        os.utime(work / path, (time.time() + i, time.time() + i))
    targets = ["runs/paper/qwen3-4b/toolstar-math/seed0/sft/final/DONE.json", f"{key}/grpo/final/DONE.json",
               "results/raw/paper/qwen3-1.7b/toolstar-math/seed0/cbpo/aime24/summary.json"]
    cmd = [str(SNAKEMAKE), *targets, "--profile", "slurm", "-d", str(work), "--keep-going", "--retries", "0",
           # the stubs cannot answer the preflight's questions (tests/cbpo/test_doctor.py asks them)
           "--slurm-init-seconds-before-status-checks", "1", "--config", "preset=paper", "data=toolstar-math", "preflight=false",
           "--default-resources", "slurm_account=acct", "slurm_partition=gpu-a100"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    submitted = {}
    for line in Path(env["SBATCH_LOG"]).read_text().splitlines():
        words = shlex.split(line.split(" --wrap=", 1)[0])
        rule = words[words.index("--comment") + 1].split("_wildcards")[0].removeprefix("rule_")
        submitted[rule] = " ".join(words)
    assert set(submitted) == {"sft", "rl", "evaluate"}, out.stderr[-4000:]
    for rule, (gpus, cpus, mem, minutes) in {"sft": (8, 8, 512000, 720), "rl": (8, 8, 512000, 2880),
                                             "evaluate": (1, 8, 64000, 240)}.items():
        line = submitted[rule]
        assert f"--gpus={gpus}" in line and f"--cpus-per-gpu={cpus}" in line, line
        assert f"--mem {mem}" in line and f"-t {minutes}" in line, line
        assert "-A acct" in line and "-p gpu-a100" in line, line
        assert "--ntasks-per-gpu" not in line, line  # one task per job, whichever plugin version


# ---------------------------------------------------------------------------------------------
# Ablations: Tables 2 and 3 and the boundary-only ablation, each variant a named run.

TABLE2 = {"cbpo", "cbpo-wo-path", "cbpo-wo-node", "cbpo-wo-decay", "cbpo-wo-cbv"}
# At 16 slots and N_0 = 6 (the tiny and paper presets) the (16, 6, 10) row is the CBPO run itself.
TABLE3 = {"cbpo", "cbpo-m4-n1", "cbpo-m4-n2", "cbpo-m8-n2", "cbpo-m8-n4", "cbpo-m16-n4", "cbpo-m16-n8", "cbpo-m16-n12"}
BOUNDARY = {"cbpo", "cbpo-boundary"}
FIGURES = {"gigpo", "arpo", "cbpo", "grpo"}  # Fig. 5's methods and Table 1's reward curves
TARGETS = {"table1": {"grpo", "gigpo", "arpo", "cbpo"}, "table2": TABLE2, "table3": TABLE3, "boundary": BOUNDARY,
           "ablations": TABLE2 | TABLE3, "figures": FIGURES, "all": TABLE2 | TABLE3 | BOUNDARY | FIGURES,
           "index": TABLE2 | TABLE3 | BOUNDARY | FIGURES}


def planned_runs(output: str, key: str) -> list[str]:
    """The run folder of every rl job a `-n -p` plan lists, once per job."""
    prefix, suffix = f"runs/{key}/", "/final/DONE.json"
    return [line.split()[-1].removeprefix(prefix).removesuffix(suffix) for line in output.splitlines()
            if line.strip().startswith("output:") and line.split()[-1].startswith(prefix)
            and line.split()[-1].endswith(suffix) and "/sft/" not in line]


@pytest.mark.parametrize("profile", [False, True], ids=["local", "slurm"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_ablation_targets_train_each_variant_once(tmp_path, target, profile):
    if profile:
        out = plan(tmp_path, target, "-p")
    else:
        cmd = [str(SNAKEMAKE), target, "-n", "-p", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "work"), "-c1"]
        out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    runs = planned_runs(out.stdout, "tiny/tiny/mix/seed0")
    assert sorted(runs) == sorted(TARGETS[target])  # each once; CBPO's run shared, never a copy
    counts = job_counts(out.stdout + out.stderr)
    # Table 1's SFT row evaluates without training; the figures alone evaluate nothing but ARPO's
    # and CBPO's Fig. 4 five-sample evaluations on the math benchmark
    with_table1 = target in ("table1", "all", "index")
    evaluated = 0 if target == "figures" else len(TARGETS[target]) + with_table1
    assert counts["rl"] == len(TARGETS[target]) and counts.get("evaluate", 0) == 2 * evaluated
    assert counts.get("evaluate_passk", 0) == (2 if target in ("figures", "all", "index") else 0)


def test_variant_commands_carry_their_overrides(tmp_path):
    """Smoke's 4 slots and N_0 = 2 make (4, 2, 2) the CBPO run and (16, 6, 10) a variant."""
    cmd = [str(SNAKEMAKE), "ablations", "-n", "-p", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "work"), "-c1",
           "--config", "preset=smoke"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    shells = [shlex.split(line.split("Shell command: ", 1)[1]) for line in (out.stdout + out.stderr).splitlines() if "Shell command: " in line]
    (train,) = [w for w in shells if "variant=cbpo-wo-decay" in w]
    assert {"stage=rl", "method=cbpo", "method.rho_path=0", "method.rho_node=0"} <= set(train)
    (evaluate,) = [w for w in shells if "run_name=cbpo-wo-decay" in w and "benchmark=arith" in w]
    assert {"method=cbpo", "method.rho_path=0", "method.rho_node=0"} <= set(evaluate)
    (table3,) = [w for w in shells if "table3" in w and "eval.report" in w]
    assert "(4, 2, 2)=cbpo" in table3 and "(16, 6, 10)=cbpo-m16-n6" in table3
    assert "cbpo-m4-n2" not in planned_runs(out.stdout, "smoke/tiny/mix/seed0")


def test_a_variant_override_is_one_quoted_word(tmp_path):
    config = tmp_path / "hostile.yaml"
    config.write_text(json.dumps({"variants": {"evil": {"method": "cbpo", "overrides": {"candidates": HOSTILE}}}}))
    cmd = [str(SNAKEMAKE), "runs/tiny/tiny/mix/seed0/evil/final/DONE.json", "-n", "-p", "-s", str(ROOT / "Snakefile"),
           "-d", str(tmp_path / "work"), "-c1", "--configfile", str(config)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    (train,) = [shlex.split(line.split("Shell command: ", 1)[1]) for line in out.stdout.splitlines()
                if "Shell command: " in line and "variant=evil" in line]
    assert f"method.candidates={HOSTILE}" in train
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("variants,needle", [
    ({"grpo": {"method": "cbpo", "overrides": {"eta": 0}}}, "method's name"),
    ({"x": {"method": "sft", "overrides": {"eta": 0}}}, "does not train"),
    ({"cbpo-wo-cbv": {"method": "cbpo", "overrides": {"etta": 0}}}, "etta"),
])
def test_bad_variants_stop_planning_naming_them(tmp_path, variants, needle):
    config = tmp_path / "bad.yaml"
    config.write_text(json.dumps({"variants": variants}))
    cmd = [str(SNAKEMAKE), "table2", "-n", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "work"), "-c1",
           "--configfile", str(config)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode != 0 and needle in out.stdout + out.stderr


def test_opd_trains_against_a_teacher_the_dag_provides(tmp_path):
    # No preset teacher (smoke): the DAG trains one, the SFT recipe at teacher_sft_factor x the
    # steps, and hands its path to OPD without renaming OPD's run. The run goes end to end.
    cmd = [str(SNAKEMAKE), "runs/smoke/tiny/mix/seed0/opd/final/DONE.json", "-p", "-s", str(ROOT / "Snakefile"),
           "-d", str(tmp_path / "work"), "-c2", "--config", "preset=smoke", "methods=[opd]"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    shells = [shlex.split(line.split("Shell command: ", 1)[1]) for line in (out.stdout + out.stderr).splitlines() if "Shell command: " in line]
    (teacher,) = [w for w in shells if "init=runs/smoke/tiny/mix/seed0/teacher/final" in w]
    assert "stage=sft" in teacher and "sft.steps=6" in teacher  # smoke's 3 SFT steps, twice
    (opd,) = [w for w in shells if "method=opd" in w]
    assert {"variant=opd", "method.teacher=runs/smoke/tiny/mix/seed0/teacher/final"} <= set(opd)
    work = tmp_path / "work" / "runs" / "smoke" / "tiny" / "mix" / "seed0"
    assert (work / "teacher" / "final" / "DONE.json").is_file() and (work / "opd" / "final" / "DONE.json").is_file()
