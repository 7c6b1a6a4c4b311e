"""The cost of a planned study before it is launched: GPU-hours by stage.

Two numbers per stage, both from what the DAG would submit: the limit (each job's GPUs times
its ``runtime`` resource, what the cluster reserves at most) and an estimate (its GPUs times its
steps times a per-step cost). A per-step cost is a measurement only where one was made on a
GPU; until then the table says it is assumed.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping


PIPELINE = ("sft", "teacher", "rl", "evaluate", "evaluate_passk")  # the order rows are printed in


def gres_gpus(gres: str) -> int:
    """The GPUs of a SLURM GRES string (``gpu:8``, ``gpu:a100:4``, sinfo's ``gpu:8(S:0-1)``)."""
    return sum(int(n) for n in re.findall(r"gpu(?::[^:,()]+)?:(\d+)", gres or ""))


def job_gpus(resources: Mapping) -> int:
    """The GPUs a job's resources hold: ``gpu``, or on several nodes ``gres``'s per node times
    ``nodes`` (train_resources, workflow/rules/train.smk)."""
    return int(resources.get("gpu", 0) or 0) or gres_gpus(str(resources.get("gres") or "")) * int(resources.get("nodes", 1) or 1)


def rl_job_gpus(per_node: int, nodes: int, method: str, backend: str, teacher_gpus: int) -> int:
    """All GPUs of an rl job (the rl rule's, workflow/rules/train.smk): ``resources.rl.gpu`` on
    each node, and on verl a distilled method's (OPD's) teacher's own ``verl.teacher_gpus``."""
    from cbpo.registry import get_method

    return per_node * nodes + (teacher_gpus if backend == "verl" and get_method(method).distilled else 0)


@functools.cache
def visible_gpus() -> int:
    """The GPUs this machine shows a job: those ``CUDA_VISIBLE_DEVICES`` lists where it is set,
    else ``nvidia-smi -L``'s; 0 without either (a CPU machine). No torch import, and asked once
    per process: the Snakefile asks it for every training job it plans."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() not in ("", "-1")])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def per_node_gpus(gpus: int, nodes: int) -> int:
    """A job's GPUs spread over its nodes, as it asks SLURM for them (``--gres=gpu:G`` per node)."""
    return -(-gpus // nodes)


@dataclass(frozen=True)
class PlannedJob:
    stage: str  # the rule
    gpus: int
    runtime_minutes: float  # the job's time limit


def gpu_hours(jobs: Iterable[PlannedJob], steps: Mapping[str, int], seconds_per_step: Mapping[str, float]) -> list[dict]:
    """One row per stage that holds GPUs: ``stage``, ``jobs``, ``gpus`` (the per-job counts),
    ``limit`` and ``estimate`` GPU-hours, and the ``seconds`` and ``steps`` behind the estimate
    (a stage without a per-step cost has ``estimate`` None). ``steps[stage]`` is a job's step
    count; a stage not in it costs ``seconds_per_step[stage]`` per job."""
    by_stage: dict[str, list[PlannedJob]] = defaultdict(list)
    for job in jobs:
        if job.gpus > 0:
            by_stage[job.stage].append(job)
    rows = []
    for stage, group in by_stage.items():
        seconds = seconds_per_step.get(stage)
        n_steps = steps.get(stage, 1)
        rows.append({
            "stage": stage,
            "jobs": len(group),
            "gpus": sorted({j.gpus for j in group}),
            "limit": sum(j.gpus * j.runtime_minutes / 60 for j in group),
            "estimate": None if seconds is None else sum(j.gpus * n_steps * seconds / 3600 for j in group),
            "seconds": seconds,
            "steps": n_steps if stage in steps else None,
        })
    return sorted(rows, key=lambda r: (PIPELINE.index(r["stage"]) if r["stage"] in PIPELINE else len(PIPELINE), r["stage"]))


def format_table(rows: list[dict], study: str, assumed: bool) -> str:
    """The rows as the text a dry run prints."""
    if not rows:
        return ""
    basis = "assumed, not measured on a GPU" if assumed else "measured"
    lines = [f"GPU-hours of this plan ({study}), by stage: limit = GPUs x runtime resource; "
             f"estimate = GPUs x steps x per-step cost ({basis})",
             f"{'stage':<16}{'jobs':>5}{'GPUs/job':>10}{'limit GPU-h':>13}{'estimate GPU-h':>16}  per-step cost"]
    for r in rows:
        gpus = f"{r['gpus'][0]}-{r['gpus'][-1]}" if len(r["gpus"]) > 1 else str(r["gpus"][0])
        if r["seconds"] is None:
            estimate, cost = "-", "none given"
        else:
            estimate = f"{r['estimate']:.1f}"
            cost = (f"{r['seconds']:g} s/step x {r['steps']} steps" if r["steps"] is not None else f"{r['seconds']:g} s/job")
            cost += f" ({'assumed' if assumed else 'measured'})"
        lines.append(f"{r['stage']:<16}{r['jobs']:>5}{gpus:>10}{r['limit']:>13.1f}{estimate:>16}  {cost}")
    known = [r["estimate"] for r in rows if r["estimate"] is not None]
    total = f"{sum(known):.1f}" + ("" if len(known) == len(rows) else "+")
    lines.append(f"{'total':<16}{sum(r['jobs'] for r in rows):>5}{'':>10}{sum(r['limit'] for r in rows):>13.1f}{total:>16}")
    return "\n".join(lines)


def search_line(jobs: int, steps: int, problems: int, rollouts: int, max_calls: int, backend: str | None,
                usd_per_1000: float) -> str:
    """What the plan's RL jobs may spend on search: at most ``max_calls`` per rollout, before
    the shared cache answers any (an upper bound: the cache and early answers only lower it)."""
    per_step = problems * rollouts * max_calls
    total = jobs * steps * per_step
    line = (f"search (rl jobs): at most {per_step:,} calls per step ({problems} problems x {rollouts} rollouts x "
            f"{max_calls} tool calls), {total:,} over {jobs} job(s) x {steps} steps")
    if backend == "web":
        return line + f"; Serper at ${usd_per_1000:g} per 1,000 (search_price, assumed): at most ${total * usd_per_1000 / 1000:,.0f}"
    if backend == "http":
        return line + ("; the suite's retrieval server runs inside each job on the job's own node (cbpo.retriever.lease): "
                       "no node-hours of its own")
    return line

