# `snakemake -n` ends with the plan's GPU-hours by stage (cbpo.cost): the jobs it would run,
# each one's GPUs and runtime from its resources, its steps from the composed preset, and
# the per-step costs of step_cost (workflow/config.yaml). Snakemake runs no hook on a dry run,
# so the table is printed as the process exits, from the DAG it planned.
import atexit

from cbpo.cost import PlannedJob, format_table, gpu_hours, job_gpus, search_line


def step_cost():
    costs = config["step_cost"]
    return costs["assumed"], {**costs["default"], **costs.get(MODEL, {})}


def print_cost():
    if not (workflow.dryrun and workflow.is_main_process) or getattr(workflow, "dag", None) is None:
        return
    dag = workflow.dag
    jobs = []
    for job in {*dag.needrun_jobs(), *dag.finished_jobs}:
        res = dict(job.resources)
        jobs.append(PlannedJob(job.rule.name, job_gpus(res), float(res.get("runtime", 0) or 0)))
    if not any(j.gpus for j in jobs):
        return
    cfg = composed()
    steps = {"sft": cfg.sft.steps, "teacher": cfg.sft.steps * config["teacher_sft_factor"], "rl": cfg.rl.steps}
    assumed, seconds = step_cost()
    print(format_table(gpu_hours(jobs, steps, seconds), STUDY, assumed), flush=True)
    rl_jobs = sum(j.stage == "rl" for j in jobs)
    backend = SEARCH_BACKEND or cfg.tools_cfg.search_backend
    if rl_jobs and "search" in (cfg.data.get("tools") or []):
        print(search_line(rl_jobs, cfg.rl.steps, cfg.rl.problems_per_step, cfg.rollout.budget,
                          cfg.rl.agent.max_tool_calls, backend, config["search_price"]["serper_per_1000"]), flush=True)


atexit.register(print_cost)
