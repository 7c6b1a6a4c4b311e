"""The SLURM profile on a real cluster (`slurm/local-cluster.sh up`: accounting, 8 fake GPUs
per node, the profile's partition on one node, `pair` on two): the smoke study submitted for
real, with one RL job cancelled and one requeued mid-run; what SLURM granted each job, read
back from `sacct`; every way SLURM ends a job seen as ended; a bad setting failing, not retried
forever; Ray started inside an allocation of one node and of two; verl's trainers in them."""
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
KEY = "smoke/tiny/mix/seed0"
TABLE1 = "results/tables/smoke/tiny/mix/table1.csv"
# Table 1 with two of the demo's four RL rows: the two the faults are put on (RL jobs hold all
# 8 GPUs, so they run one after another and each row costs the study its whole RL time).
ROWS = ["methods=[grpo,cbpo]"]
# The states Snakemake's SLURM plugin (2.6.1-2.8.0) reports as a failed job; any other non-
# COMPLETED state it waits on.
PLUGIN_FAILED = {"BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "ERROR"}


# The account a user gives (the cluster's, slurm/local-cluster.sh), the profile's partition; the
# plugin's 40 s default before each first status check would triple the study's time.
SLURM_OPTIONS = ["--default-resources", "slurm_account=cbpo", "slurm_partition=gpu",
                 "--slurm-init-seconds-before-status-checks", "5"]


def _cluster_up() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


if not _cluster_up():
    pytest.skip("no SLURM cluster (sinfo fails): `slurm/local-cluster.sh up` starts one", allow_module_level=True)


def sacct(*args) -> list[list[str]]:
    """The real sacct's rows (not slurm/bin's), parsable."""
    out = subprocess.run(["sacct", "-X", "--parsable2", "-n", *args], capture_output=True, text=True, check=True)
    return [line.split("|") for line in out.stdout.splitlines() if line]


def job_of(workdir: Path, method: str) -> tuple[int, int] | None:
    """(pid, SLURM job id) of the `cbpo.train` process training ``method`` in ``workdir``."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if argv[1:3] == [b"-m", b"cbpo.train"] and f"method={method}".encode() in argv \
                    and Path(proc / "cwd").resolve() == workdir:
                environ = dict(e.split(b"=", 1) for e in (proc / "environ").read_bytes().split(b"\0") if b"=" in e)
                return int(proc.name), int(environ[b"SLURM_JOB_ID"])
        except (OSError, IndexError, KeyError, ValueError):
            continue
    return None


class Study:
    """`snakemake --profile slurm table1 --config preset=smoke methods=[grpo,cbpo]`, as typed from the repository
    root; every output line kept with the time it arrived."""

    def __init__(self, workdir: Path, *args):
        self.workdir, self.lines = workdir, []
        cmd = [str(SNAKEMAKE), "table1", "--profile", "slurm", "-d", str(workdir), "--config", "preset=smoke", *ROWS,
               *SLURM_OPTIONS, *args]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def first_line_after(self, since: float, needle: str) -> float | None:
        return next((t for t, line in self.lines if t >= since and needle in line), None)

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.reader.join(10)
        return rc


def interrupt_after_first_checkpoint(study: Study, actions: dict[str, list[str]], deadline: float) -> dict:
    """Once each method's RL job has written its step-1 checkpoint, stop its trainer there (so
    the interruption lands mid-run, before step 2) and apply its action (`scancel` or
    `scontrol requeue`) to its SLURM job. Both are watched at once: Snakemake picks their order."""
    faults = {}
    while time.monotonic() < deadline and study.proc.poll() is None and len(faults) < len(actions):
        for method, action in actions.items():
            checkpoint = study.workdir / "runs" / KEY / method / "step_000001"
            found = job_of(study.workdir, method) if method not in faults and checkpoint.is_dir() else None
            if found:
                pid, jobid = found
                os.kill(pid, signal.SIGSTOP)
                subprocess.run([*action, str(jobid)], check=True)
                faults[method] = {"jobid": jobid, "at": time.monotonic()}
        time.sleep(0.02)
    missing = set(actions) - set(faults)
    assert not missing, f"{sorted(missing)}: RL job never reached its first checkpoint:\n{study.text()[-4000:]}"
    return faults


@pytest.fixture(scope="module")
def faulted_study(tmp_path_factory):
    """The smoke study through the profile; GRPO's RL job cancelled and CBPO's requeued, each
    right after its first checkpoint. Both RL jobs hold the node's 8 GPUs: one at a time."""
    workdir = tmp_path_factory.mktemp("slurm study").resolve()
    study = Study(workdir)
    deadline = time.monotonic() + 1500
    faults = interrupt_after_first_checkpoint(study, {"grpo": ["scancel"], "cbpo": ["scontrol", "requeue"]}, deadline)
    rc = study.wait(max(deadline - time.monotonic(), 1))
    study.seconds = time.monotonic() - study.t0
    assert rc == 0, study.text()[-6000:]
    print(f"\nsmoke study through --profile slurm, with the two faults: {study.seconds:.0f} s", file=sys.stderr)
    return study, faults


@pytest.fixture(scope="module")
def uninterrupted_table1(faulted_study, tmp_path_factory, dag):
    """Table 1 with GRPO's and CBPO's RL jobs run again locally, uninterrupted, from the same
    SFT checkpoint (a copy of the study without those runs, their evaluations and tables)."""
    study, _ = faulted_study
    workdir = tmp_path_factory.mktemp("uninterrupted") / "work"
    shutil.copytree(study.workdir, workdir, symlinks=True, ignore=shutil.ignore_patterns(".snakemake"))
    for method in ("grpo", "cbpo"):
        shutil.rmtree(workdir / "runs" / KEY / method)
        shutil.rmtree(workdir / "results" / "raw" / KEY / method)
    shutil.rmtree(workdir / "results" / "tables")
    out = dag(workdir, "table1", config=("preset=smoke", *ROWS))
    jobs = out.stdout + out.stderr
    assert "rule sft:" not in jobs and "rule rl:" in jobs, jobs[-4000:]  # the same SFT, RL trained afresh
    return list(csv.DictReader((workdir / TABLE1).open()))


def test_cancelled_rl_job_is_retried_and_resumes_from_its_checkpoint(faulted_study):
    study, faults = faulted_study
    cancelled = faults["grpo"]
    states = {row[0]: row[1] for row in sacct("-j", str(cancelled["jobid"]), "-o", "JobIDRaw,State")}
    assert states[str(cancelled["jobid"])].startswith("CANCELLED")
    # Seen as ended (the plugin's error for that job) within a minute of the scancel...
    seen = study.first_line_after(cancelled["at"], f"SLURM-job '{cancelled['jobid']}' failed")
    assert seen is not None and seen - cancelled["at"] < 60, study.text()[-4000:]
    # ... then retried by the profile (retries: 1), resuming from step 1, not step 0.
    log = (study.workdir / "logs" / KEY / "grpo.log").read_text()
    assert "step_000001 (step 1)" in log and "resuming from" in log, log[-2000:]
    assert (study.workdir / "runs" / KEY / "grpo" / "final" / "DONE.json").is_file()


def test_requeued_rl_job_runs_again_and_resumes_from_its_checkpoint(faulted_study):
    study, faults = faulted_study
    requeued = faults["cbpo"]
    # SLURM ran the same job again (sacct --duplicates lists each run), and it completed.
    runs = [row[1] for row in sacct("--duplicates", "-j", str(requeued["jobid"]), "-o", "JobIDRaw,State")]
    assert runs[-1] == "COMPLETED" and len(runs) >= 2, runs
    log = (study.workdir / "logs" / KEY / "cbpo.log").read_text()
    assert "step_000001 (step 1)" in log and "resuming from" in log, log[-2000:]
    steps = [json.loads(line)["step"] for line in (study.workdir / "runs" / KEY / "cbpo" / "metrics.jsonl").open()
             if "reward" in json.loads(line)]
    assert steps == sorted(set(steps)), steps  # each step recorded once across the two runs


def test_interrupted_study_table1_equals_an_uninterrupted_run(faulted_study, uninterrupted_table1):
    study, _ = faulted_study
    faulted = list(csv.DictReader((study.workdir / TABLE1).open()))

    def reproducible(table):  # not the budget's device-hours (<kind>-h): wall time, never equal twice
        return {(c["row"], c["column"]): c["reproduced"] for c in table if not c["column"].endswith("-h")}

    cells = reproducible(faulted)
    assert cells == reproducible(uninterrupted_table1) and len(cells) >= 18


def test_jobs_get_the_gpus_cpus_memory_time_partition_and_account_they_ask_for(faulted_study):
    study, _ = faulted_study
    uuid_line = next(line for _, line in study.lines if "SLURM run ID:" in line)
    run_id = uuid_line.split("SLURM run ID:", 1)[1].split()[0]
    granted = {}
    for jobid, comment, partition, account, tres, limit, state in sacct(
            "--name", run_id, "-o", "JobIDRaw,Comment,Partition,Account,AllocTRES,Timelimit,State"):
        rule = comment.removeprefix("rule_").split("_wildcards")[0]
        if state == "COMPLETED":
            granted[rule] = (partition, account, dict(kv.split("=", 1) for kv in tres.split(",")), limit)
    assert {"model", "sft", "rl", "evaluate"} <= set(granted), granted
    for rule, (gpus, cpus, mem, limit) in {"sft": ("8", "64", "500G", "12:00:00"), "rl": ("8", "64", "500G", "2-00:00:00"),
                                           "evaluate": ("1", "8", "62.50G", "04:00:00")}.items():
        partition, account, tres, got_limit = granted[rule]
        assert (partition, account) == ("gpu", "cbpo"), granted[rule]
        assert (tres.get("gres/gpu"), tres["cpu"], tres["mem"], got_limit) == (gpus, cpus, mem, limit), granted[rule]


def test_every_way_slurm_ends_a_job_is_seen_as_ended(tmp_path):
    """Cancelled, failed, out of memory, timed out and preempted jobs: through the PATH the
    workflow sets (slurm/bin's sacct first), the plugin's own status query reads each as a
    failed state; the raw sacct shows why that is needed."""
    from snakemake_executor_plugin_slurm.job_status_query import query_job_status, query_job_status_sacct

    name = f"cbpo-faults-{uuid.uuid4().hex[:8]}"

    def submit(*args) -> str:
        cmd = ["sbatch", "--parsable", "-J", name, "-o", str(tmp_path / "%j.out"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]

    jobs = {
        "cancelled": submit("--wrap", "sleep 300"),
        "failed": submit("--wrap", "exit 3"),
        "out of memory": submit("--mem=50", "--wrap", f"{sys.executable} -c 'x = bytearray(400 << 20); import time; time.sleep(60)'"),
        "timed out": submit("-t", "1", "--wrap", "sleep 300"),
        "preempted": submit("--gpus=8", "--mem=100", "--wrap", "sleep 300"),
    }
    deadline = time.monotonic() + 180
    while {s for _, s in sacct("-j", jobs["preempted"], "-o", "JobIDRaw,State")} != {"RUNNING"}:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    subprocess.run(["scancel", jobs["cancelled"]], check=True)
    submit("-p", "urgent", "--gpus=8", "--mem=100", "--wrap", "true")  # needs the GPUs: preempts
    ended = {"CANCELLED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "PREEMPTED"}
    while True:
        raw = {jobid: state for jobid, state in sacct("-j", ",".join(jobs.values()), "-o", "JobIDRaw,State")}
        if all(raw.get(j, "PENDING").split()[0] in ended for j in jobs.values()):
            break
        assert time.monotonic() < deadline, raw
        time.sleep(1)
    assert raw[jobs["cancelled"]].startswith("CANCELLED by ") and raw[jobs["preempted"]] == "PREEMPTED"
    assert not {raw[jobs["cancelled"]], raw[jobs["preempted"]]} & PLUGIN_FAILED  # the plugin alone would wait on

    path = os.pathsep.join([str(ROOT / "slurm" / "bin"), os.environ["PATH"]])
    import asyncio
    import logging
    from unittest import mock

    with mock.patch.dict(os.environ, {"PATH": path}):
        states, _ = asyncio.run(query_job_status(query_job_status_sacct(name), logging.getLogger("test")))
    assert {kind: states[j] in PLUGIN_FAILED for kind, j in jobs.items()} == dict.fromkeys(jobs, True), states


def test_a_bad_setting_fails_with_its_log_not_retried_forever(faulted_study, tmp_path):
    """An RL variant whose override only the job itself can reject: Snakemake stops with the
    job's log path in its error, after the profile's one retry."""
    study, _ = faulted_study
    config = tmp_path / "bad.yaml"
    config.write_text(json.dumps({"variants": {"bad-eta": {"method": "cbpo", "overrides": {"eta": "not-a-number"}}}}))
    target = f"runs/{KEY}/bad-eta/final/DONE.json"
    t0 = time.monotonic()
    cmd = [str(SNAKEMAKE), target, "--profile", "slurm", "-d", str(study.workdir), "--config", "preset=smoke",
           "--configfile", str(config), *SLURM_OPTIONS]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-4000:]
    assert f"logs/{KEY}/bad-eta.log" in text, text[-4000:]
    assert "could not be converted to Float" in (study.workdir / "logs" / KEY / "bad-eta.log").read_text()
    run_id = text.split("SLURM run ID:", 1)[1].split()[0]
    attempts = [state for _, comment, state in sacct("--name", run_id, "-o", "JobIDRaw,Comment,State") if "bad-eta" in comment]
    assert attempts == ["FAILED", "FAILED"], attempts  # the first and the profile's one retry
    assert time.monotonic() - t0 < 600


@pytest.mark.parametrize("partition,nodes", [("gpu", 1), ("pair", 2)])
def test_ray_starts_across_the_allocation_before_the_command(tmp_path, partition, nodes):
    """slurm/ray-on-slurm.sh in an allocation of one node and of two (`pair`: the cluster's two
    slurmd), a trivial command in the trainer's place: the command joins the Ray cluster the
    script started, which holds every node of the allocation and its GPUs."""
    port = free_port()  # other Ray clusters may run here
    probe = tmp_path / "probe.py"
    # a GPU task's environment is what verl's workers see: SLURM sets ROCR_VISIBLE_DEVICES beside
    # CUDA_VISIBLE_DEVICES, and verl's workers refuse to start with both
    probe.write_text("import os, ray\nray.init()\n"
                     "rocr = ray.get(ray.remote(num_gpus=1)(lambda: os.environ.get('ROCR_VISIBLE_DEVICES', '-')).remote())\n"
                     "print('RAY', os.environ['RAY_ADDRESS'], len(ray.nodes()), ray.cluster_resources()['GPU'], rocr)\n")
    cmd = ["sbatch", "--parsable", "--wait", "-p", partition, f"-N{nodes}", "--ntasks-per-node=1", "--gpus-per-node=8",
           "--cpus-per-gpu=1", "--mem=8000", "-t", "10", "-o", str(tmp_path / "ray.out"),
           # no token: a shared machine's ~/.ray/auth_token may be rewritten by others meanwhile
           f"--export=ALL,RAY_PYTHON={sys.executable},RAY_PORT={port},RAY_AUTH_MODE=disabled",
           "--wrap", f"{ROOT}/slurm/ray-on-slurm.sh {sys.executable} {probe}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = (tmp_path / "ray.out").read_text()
    assert out.returncode == 0, log[-4000:]
    (line,) = [line for line in log.splitlines() if line.startswith("RAY ")]
    assert line.split()[2:] == [str(nodes), f"{8.0 * nodes}", "-"] and line.split()[1].endswith(f":{port}"), line


def free_port() -> int:
    """A free ephemeral port (>= 32768, clear of Ray's worker ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENGINES_PY = ROOT / ".venv-engines" / "bin" / "python"


@pytest.mark.skipif(os.environ.get("CBPO_SLOW") != "1" or not ENGINES_PY.exists(),
                    reason="slow (~10 min, set CBPO_SLOW=1) and needs .venv-engines (make engines)")
def test_verl_trains_grpo_through_ray_on_slurm_in_an_allocation(tmp_path, prepare):
    """The rl rule's verl path inside a SLURM allocation: ray-on-slurm.sh starts Ray on the
    allocation, verl's trainer joins it (its workers get the CPU platform through Ray's runtime
    env, not by inheritance) and writes final/ with a metrics line per step."""
    env = {**ENV, "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false"}
    paths = prepare(tmp_path, str(ENGINES_PY), env=env)
    port = free_port()
    train = [str(ROOT / "slurm" / "ray-on-slurm.sh"), str(ENGINES_PY), "-m", "cbpo.train", "stage=rl", "backend=verl",
             "method=grpo", "verl.gpus_per_node=1", "verl.nodes=1", *paths]
    # the job's memory: SLURM sums the RSS of ~15 processes sharing torch's libraries (a 20 GB
    # job was killed here with the machine's memory free); the fake node has 1.1 TB
    cmd = ["sbatch", "--parsable", "--wait", "-N1", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-gpu=8",
           "--mem=60000", "-t", "40", "-o", str(tmp_path / "verl.out"), "-D", str(tmp_path),
           f"--export=ALL,RAY_PYTHON={ENGINES_PY},RAY_PORT={port},RAY_AUTH_MODE=disabled,OMP_NUM_THREADS=2",
           "--wrap", " ".join(train)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=2700)
    log = (tmp_path / "verl.out").read_text()
    assert out.returncode == 0, log[-5000:]
    assert "ray-on-slurm: 1 Ray node(s) up" in log
    run = tmp_path / "runs" / KEY / "grpo"
    assert json.loads((run / "final" / "DONE.json").read_text())["step"] == "final"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2], steps


@pytest.mark.skipif(os.environ.get("CBPO_SLOW") != "1" or not ENGINES_PY.exists(),
                    reason="slow (~5 min, set CBPO_SLOW=1) and needs .venv-engines (make engines)")
def test_verl_sft_trains_across_two_nodes_through_the_profile(tmp_path):
    """`snakemake --profile slurm` with backend=verl verl_nodes=2 on `pair`: the sft rule is one
    allocation of both nodes, its shell starts a torchrun on each (the job-step plugin leaves
    it only the job id: the nodes come from SLURM), and verl's SFT trainer runs across them."""
    resources = tmp_path / "resources.yaml"  # one fake GPU per node: two trainer processes in all
    resources.write_text("resources:\n  sft: {gpu: 1, cpus_per_gpu: 2, mem_mb: 40000}\n")
    cmd = [str(ENGINES_PY.with_name("snakemake")), f"runs/{KEY}/sft/final/DONE.json", "--profile", "slurm",
           "-d", str(tmp_path), "--retries", "0", "--configfile", str(resources), "--config", "preset=smoke",
           "backend=verl", "verl_nodes=2", "preflight=false",
           *(o.replace("slurm_partition=gpu", "slurm_partition=pair") for o in SLURM_OPTIONS)]
    out = subprocess.run(cmd, cwd=ROOT, env={**ENV, "WANDB_MODE": "offline"}, capture_output=True, text=True,
                         timeout=2400)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    run_id = (out.stdout + out.stderr).split("SLURM run ID:", 1)[1].split()[0]
    (job,) = [j for j, comment in sacct("--name", run_id, "-o", "JobIDRaw,Comment") if comment.startswith("rule_sft")]
    steps = subprocess.run(["sacct", "-j", job, "--parsable2", "-n", "-o", "JobID,NNodes,NTasks,State"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert f"{job}.0|2|2|COMPLETED" in steps, steps  # the torchrun step: two nodes, one task each
    run = tmp_path / "runs" / KEY / "sft"
    assert json.loads((run / "final" / "DONE.json").read_text())["step"] == "final"
    assert list((run / "verl").glob("global_step_*/model_world_size_2_rank_1.pt"))  # rank 1 trained with rank 0
