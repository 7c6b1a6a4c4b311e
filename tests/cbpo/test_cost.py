"""GPU-hours by stage from the planned jobs' resources and per-step costs."""
from cbpo.cost import PlannedJob, format_table, gpu_hours, search_line


def test_limit_and_estimate_per_stage():
    jobs = [PlannedJob("rl", 8, 120), PlannedJob("rl", 16, 120), PlannedJob("evaluate", 1, 60),
            PlannedJob("sft", 8, 60), PlannedJob("fetch", 0, 240)]
    rows = gpu_hours(jobs, {"sft": 100, "rl": 10}, {"sft": 36, "rl": 360, "evaluate": 1800})
    assert [r["stage"] for r in rows] == ["sft", "rl", "evaluate"]  # pipeline order; no GPU, no row
    sft, rl, ev = rows
    assert rl["jobs"] == 2 and rl["gpus"] == [8, 16]
    assert rl["limit"] == 8 * 2 + 16 * 2 and rl["estimate"] == (8 + 16) * 10 * 360 / 3600
    assert sft["estimate"] == 8 * 100 * 36 / 3600 and ev["estimate"] == 0.5 and ev["steps"] is None


def test_the_table_says_whether_the_costs_were_measured():
    rows = gpu_hours([PlannedJob("rl", 8, 60), PlannedJob("evaluate", 1, 60)], {"rl": 10}, {"rl": 360})
    text = format_table(rows, "paper/qwen3-1.7b/toolstar-math", assumed=True)
    assert "assumed, not measured on a GPU" in text and "360 s/step x 10 steps (assumed)" in text
    assert "none given" in text  # evaluate has no per-job cost: its estimate is left out, not zero
    total = text.splitlines()[-1].split()
    assert total[0] == "total" and total[-1] == "8.0+" and total[-2] == "9.0"
    assert "(measured)" in format_table(rows, "s", assumed=False)
    assert format_table([], "s", assumed=True) == ""


def test_a_jobs_gpus_are_its_gpu_resource_or_its_gres_per_node_times_its_nodes():
    from cbpo.cost import gres_gpus, job_gpus

    assert [gres_gpus(g) for g in ("gpu:8", "gpu:a100:4", "gpu:8(S:0-1)", "gpu:2,gpu:h100:1", "", "mps:100")] == [8, 4, 8, 3, 0, 0]
    assert job_gpus({"gpu": 8, "runtime": 720}) == 8
    assert job_gpus({"gres": "gpu:8", "nodes": 2, "tasks": 2}) == 16
    assert job_gpus({"mem_mb": 1000}) == 0


def test_the_search_line_bounds_calls_and_prices_them():
    web = search_line(11, 200, 32, 16, 5, "web", 1.0)
    assert "at most 2,560 calls per step" in web and "5,632,000 over 11 job(s)" in web and "at most $5,632" in web
    assert "no node-hours of its own" in search_line(1, 2, 2, 4, 5, "http", 1.0)
    assert "$" not in search_line(1, 2, 2, 4, 5, None, 1.0)

