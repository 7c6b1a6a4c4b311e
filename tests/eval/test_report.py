"""The table writers of eval.report on fake evaluation summaries and training metrics."""
import csv
import json
import math

import pytest

from eval.report import main

CONTRACT = ["table", "row", "run", "column", "reproduced", "ci95", "paper", "difference", "produced", "seeds", "summaries"]
T975 = {1: 12.706204736174698, 2: 4.302652729749462}  # Student t 0.975 quantiles by degrees of freedom


def summaries(root, scores, seed=0, **extra):
    """``{run: {benchmark: pass@1}}`` as the evaluation runner writes them, in ``root/seed<seed>``."""
    folder = root / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    for run, benches in scores.items():
        for bench, value in benches.items():
            path = folder / run / bench / "summary.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"pass@1": value, **extra}))
    return folder


def rows_of(path):
    return {(r["row"], r["column"]): r for r in csv.DictReader(path.read_text().splitlines())}


def table_lines(md, section=0):
    """The body of the Markdown table of a section (0: the table, 1: the paired differences),
    one list of stripped cells per row."""
    part = md.split("\n## ")[section]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in part.splitlines() if line.startswith("| ")][1:]


def test_table2_puts_each_cell_beside_the_paper_and_marks_a_missing_run(tmp_path):
    raw = summaries(tmp_path / "raw", {"cbpo": {"aime24": 0.3, "math500": 0.8}, "cbpo-wo-cbv": {"aime24": 0.1}})
    out = tmp_path / "t" / "table2"
    code = main(["table2", "--summaries", str(raw), "--out", str(out), "--benchmarks", "aime24", "math500",
                 "--rows", "CBPO=cbpo", "w/o CBV=cbpo-wo-cbv", "w/o Path-level=cbpo-wo-path", "--backbone", "Qwen3-4B"])
    assert code == 0
    cells = rows_of(out.with_suffix(".csv"))
    # Qwen3-4B's reported AIME24 of CBPO is 30.0: ours 30.0, difference 0.
    assert cells[("CBPO", "AIME24")]["reproduced"] == "30.0" and cells[("CBPO", "AIME24")]["paper"] == "30.0"
    assert cells[("CBPO", "MATH500")]["difference"] == "-9.5"  # 80.0 vs 89.5
    assert cells[("CBPO", "AIME24")]["run"] == "cbpo"
    # A run not evaluated on one benchmark, and one not run at all: kept, marked, paper beside.
    assert cells[("w/o CBV", "MATH500")]["produced"] == "False" and cells[("w/o CBV", "MATH500")]["paper"] == "89.0"
    assert cells[("w/o CBV", "Math Avg.")]["reproduced"] == ""
    assert all(cells[("w/o Path-level", c)]["produced"] == "False" for c in ("AIME24", "MATH500", "Math Avg."))
    md = out.with_suffix(".md").read_text()
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines[1:]] == ["CBPO", "w/o CBV", "w/o Path-level"]  # as given
    assert "30.0** (30.0, +0.0)" in md and "— (89.0)" in md and "Qwen3-4B" in md
    tex = out.with_suffix(".tex").read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex and "--- (89.0)" in tex


def test_table3_rows_are_the_papers_allocations(tmp_path):
    raw = summaries(tmp_path / "raw", {"cbpo": {"aime24": 0.25}, "cbpo-m4-n1": {"aime24": 0.1}})
    out = tmp_path / "table3"
    assert main(["table3", "--summaries", str(raw), "--out", str(out), "--benchmarks", "aime24",
                 "--rows", "(4, 1, 3)=cbpo-m4-n1", "(16, 6, 10)=cbpo"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("(4, 1, 3)", "AIME24")]["paper"] == "13.3"  # Qwen3-1.7B, the default backbone
    assert cells[("(16, 6, 10)", "AIME24")]["paper"] == "26.7" and cells[("(16, 6, 10)", "AIME24")]["run"] == "cbpo"


def test_boundary_has_no_paper_values_and_says_so(tmp_path):
    raw = summaries(tmp_path / "raw", {"cbpo": {"arith": 0.5}, "cbpo-boundary": {"arith": 0.25}})
    out = tmp_path / "boundary"
    assert main(["boundary", "--summaries", str(raw), "--out", str(out), "--benchmarks", "arith",
                 "--rows", "Full response=cbpo", "Tool boundary only=cbpo-boundary"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("Tool boundary only", "Arith")]["reproduced"] == "25.0" and cells[("Tool boundary only", "Arith")]["paper"] == ""
    assert "reports no values" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("scores", [[0.2, 0.3], [0.2, 0.3, 0.45]])
def test_seeds_give_the_mean_and_the_t_interval_and_the_caption_names_them(tmp_path, scores):
    folders = [summaries(tmp_path / "raw", {"cbpo": {"arith": v}}, seed=s) for s, v in enumerate(scores)]
    out = tmp_path / "table2"
    assert main(["table2", "--summaries", *map(str, folders), "--out", str(out), "--benchmarks", "arith", "--rows", "CBPO=cbpo"]) == 0
    values = [100 * v for v in scores]
    n, mean = len(values), sum(values) / len(values)
    half = T975[n - 1] * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)
    cell = rows_of(out.with_suffix(".csv"))[("CBPO", "Arith")]
    assert float(cell["reproduced"]) == pytest.approx(mean, abs=0.05) and float(cell["ci95"]) == pytest.approx(half, abs=0.05)
    assert cell["seeds"] == " ".join(map(str, range(n)))
    assert cell["summaries"].split(";") == [str(f / "cbpo" / "arith" / "summary.json") for f in folders]
    md = out.with_suffix(".md").read_text()
    assert f"over seeds {', '.join(map(str, range(n)))}" in md and f"{mean:.1f} ± {half:.1f}" in md
    assert "\\pm" in out.with_suffix(".tex").read_text()


def test_seeds_pair_every_trained_row_with_sft_and_cbpo_with_the_others(tmp_path):
    scores = [{"sft": 0.1, "grpo": 0.4, "arpo": 0.45, "cbpo": 0.5}, {"sft": 0.2, "grpo": 0.4, "arpo": 0.5, "cbpo": 0.6},
              {"sft": 0.3, "grpo": 0.7, "arpo": 0.6, "cbpo": 0.7}]
    folders = [summaries(tmp_path / "raw", {run: {"arith": v} for run, v in seed.items()}, seed=n)
               for n, seed in enumerate(scores)]
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", *map(str, folders), "--out", str(out), "--benchmarks", "arith",
                 "--methods", "sft", "grpo", "arpo", "cbpo"]) == 0
    md = out.with_suffix(".md").read_text()
    assert "## Paired by seed" in md
    paired = {r[0]: r[1] for r in table_lines(md, 1)}

    def cell(a, b):
        diffs = [100 * (s[a] - s[b]) for s in scores]
        mean = sum(diffs) / 3
        half = T975[2] * math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2) / math.sqrt(3)
        return f"{mean:+.1f} ± {half:.1f}"

    assert paired == {"GRPO − SFT": cell("grpo", "sft"), "ARPO − SFT": cell("arpo", "sft"), "CBPO − SFT": cell("cbpo", "sft"),
                      "CBPO − GRPO": cell("cbpo", "grpo"), "CBPO − ARPO": cell("cbpo", "arpo")}
    assert paired["CBPO − GRPO"] == "+10.0 ± 24.8"  # differences 10, 20, 0


def test_one_seed_shows_the_value_alone(tmp_path):
    raw = summaries(tmp_path / "raw", {"cbpo": {"arith": 0.5}}, seed=3)
    out = tmp_path / "boundary"
    assert main(["boundary", "--summaries", str(raw), "--out", str(out), "--benchmarks", "arith", "--rows", "Full=cbpo",
                 "--label", "tiny_run & 50%"]) == 0
    md = out.with_suffix(".md").read_text()
    assert "Seed 3." in md and "±" not in md.split("\n\n", 2)[2]
    assert "tiny\\_run \\& 50\\%" in out.with_suffix(".tex").read_text()  # the caption compiles
    assert rows_of(out.with_suffix(".csv"))[("Full", "Arith")]["ci95"] == ""


def test_a_cell_some_seeds_lack_is_the_mean_of_the_others_and_marked(tmp_path):
    folders = [summaries(tmp_path / "raw", {"cbpo": {"arith": 0.2, "twohop": 0.4}}, seed=0),
               summaries(tmp_path / "raw", {"cbpo": {"arith": 0.4}}, seed=1)]
    out = tmp_path / "boundary"
    assert main(["boundary", "--summaries", *map(str, folders), "--out", str(out), "--benchmarks", "arith", "twohop",
                 "--rows", "Full=cbpo"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("Full", "TwoHop")]["reproduced"] == "40.0" and cells[("Full", "TwoHop")]["seeds"] == "0"
    assert cells[("Full", "Arith")]["seeds"] == "0 1"
    (row,) = table_lines(out.with_suffix(".md").read_text())
    assert row[2] == "**40.0**†" and "†" not in row[1]
    assert "$^\\dagger$" in out.with_suffix(".tex").read_text()


def test_best_per_column_is_bold_ties_too_and_an_empty_column_bolds_nothing(tmp_path):
    raw = summaries(tmp_path / "raw", {"a": {"arith": 0.5}, "b": {"arith": 0.5}, "c": {"arith": 0.25}})
    out = tmp_path / "boundary"
    assert main(["boundary", "--summaries", str(raw), "--out", str(out), "--benchmarks", "arith", "twohop",
                 "--rows", "A=a", "B=b", "C=c"]) == 0
    md = out.with_suffix(".md").read_text()
    rows = {r[0]: r for r in table_lines(md)}
    assert rows["A"][1] == rows["B"][1] == "**50.0**" and rows["C"][1] == "25.0"
    assert rows["A"][2] == "—" and md.count("**") == 8  # the ties in Arith and in Math Avg.; none in TwoHop
    tex = out.with_suffix(".tex").read_text()
    assert tex.count("\\textbf{50.0}") == 4 and "\\textbf{25.0}" not in tex


def test_table1_is_beside_the_paper_in_its_groups_and_keeps_a_missing_run(tmp_path):
    raw = summaries(tmp_path / "raw", {"cbpo": {"aime24": 0.3, "arith": 0.6, "twohop": 0.5}, "sft": {"aime24": 0.1},
                                       "aepo": {"aime24": 0.2}})
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw), "--out", str(out), "--benchmarks", "aime24", "arith", "twohop",
                 "--methods", "aepo", "cbpo", "grpo", "sft", "base", "--backbone", "Qwen3-4B"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("CBPO", "AIME24")]["paper"] == "30.0" and cells[("CBPO", "AIME24")]["difference"] == "0.0"
    assert cells[("CBPO", "Arith")]["paper"] == ""  # the paper has no such column: ours alone
    # Issue 24.7: an average over AIME24 and Arith is not the paper's over its five benchmarks
    assert cells[("CBPO", "Math Avg.")]["paper"] == "" and cells[("CBPO", "Search Avg.")]["paper"] == ""
    md = out.with_suffix(".md").read_text()
    rows = {r[1]: r for r in table_lines(md)}
    assert rows["CBPO"][2:5] == ["**30.0** (30.0, +0.0)", "**60.0**", "**50.0**"]
    assert rows["CBPO"][5] == "**45.0**"
    assert "Not compared with the paper (not its benchmarks, or an average over others than its own): Arith, TwoHop, Math Avg., Search Avg." in md
    # Runs with nothing produced are kept and marked; rows follow the paper's groups, the
    # method the paper does not report last.
    assert rows["Base"][2] == "— (13.3)" and rows["GRPO"][2:4] == ["— (16.7)", "—"]
    assert [r[1] for r in table_lines(md)] == ["Base", "SFT", "GRPO", "CBPO", "AEPO"]
    assert [r[0] for r in table_lines(md)] == ["training-free", "supervised", "classic-rl", "agentic-rl", "other"]
    assert "reproduced (paper, Qwen3-4B; difference)" in md and "Table 1 (paper" not in md
    assert "\\textbf{30.0} (30.0, +0.0)" in out.with_suffix(".tex").read_text()


def write_metrics(runs, run, steps):
    metrics = runs / run / "metrics.jsonl"
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text("".join(json.dumps(s) + "\n" for s in steps))


def test_budget_columns_from_the_runs_and_evaluations_records(tmp_path):
    raw, runs = tmp_path / "raw", tmp_path / "runs"
    for seed, tokens in ((0, 100.0), (1, 300.0)):
        summaries(raw, {"cbpo": {"arith": 0.5}}, seed=seed, mean_tokens=tokens, mean_tool_calls=1.0, generation_seconds=1800)
        summaries(raw, {"base": {"arith": 0.1}}, seed=seed, mean_tokens=tokens, mean_tool_calls=1.0, generation_seconds=360)
        # Training seconds are the logged steps' own (a resumed run's records, a rerun that found
        # the run done adds none); the first line is not a step and does not count.
        write_metrics(runs / f"seed{seed}", "cbpo", [
            {"note": "resumed", "wall_seconds": 99999},
            {"step": 1, "reward": 0.1, "problems": 2, "generated_tokens": 1000, "tool_calls": 4, "wall_seconds": 1800 * (seed + 1)},
            {"step": 2, "reward": 0.2, "problems": 2, "generated_tokens": 600, "tool_calls": 2, "extra_generated_tokens": 400,
             "extra_tool_calls": 2, "wall_seconds": 1800 * (seed + 1)}])
        (runs / f"seed{seed}" / "base").mkdir()
    out = tmp_path / "table1"
    seeds = lambda root: [str(root / "seed0"), str(root / "seed1")]  # noqa: E731
    assert main(["table1", "--summaries", *seeds(raw), "--runs", *seeds(runs), "--out", str(out),
                 "--benchmarks", "arith", "--methods", "base", "cbpo", "--device-kind", "GPU", "--devices-per-job", "4"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("CBPO", "Tokens")]["reproduced"] == "200.0" and cells[("CBPO", "Tool calls")]["reproduced"] == "1.0"
    assert cells[("CBPO", "Train tokens")]["reproduced"] == "500.0"  # (1000 + 600 + 400) / 4, extra draws spent too
    assert cells[("CBPO", "Train tool calls")]["reproduced"] == "2.0"
    assert cells[("CBPO", "GPU-h")]["reproduced"] == "8.0"  # mean of (1 + 0.5) and (2 + 0.5) hours, times 4 devices
    assert cells[("Base", "GPU-h")]["reproduced"] == "0.4" and cells[("Base", "GPU-h")]["summaries"] == ""
    assert ("Base", "Train tokens") not in cells  # no training run: blank
    rows = {r[1]: r for r in table_lines(out.with_suffix(".md").read_text())}
    header = [c.strip() for c in out.with_suffix(".md").read_text().split("\n\n")[2].splitlines()[0].split("|")[1:-1]]
    assert header[-5:] == ["Tokens", "Tool calls", "Train tokens", "Train tool calls", "GPU-h"]
    assert rows["Base"][-3:-1] == ["", ""] and "**" not in "".join(rows["CBPO"][-5:])
    assert rows["CBPO"][-1] == "8.00 ± 25.41"  # hours over seeds: 6 and 10; t(1) = 12.706 times sem 2


def test_opd_pays_for_the_teacher_the_dag_trained_and_untimed_records_give_no_hours(tmp_path):
    raw, runs = tmp_path / "raw", tmp_path / "runs" / "seed0"
    summaries(raw, {"opd": {"arith": 0.5}, "sft": {"arith": 0.4}}, generation_seconds=360)
    write_metrics(runs, "opd", [{"step": 1, "reward": 0.5, "problems": 1, "generated_tokens": 1, "tool_calls": 0, "wall_seconds": 1800}])
    write_metrics(runs, "teacher", [{"step": 10, "sft_loss": 1.0, "wall_seconds": 1000}, {"step": 20, "sft_loss": 0.5, "wall_seconds": 440}])
    write_metrics(runs, "sft", [{"step": 10, "sft_loss": 1.0}])  # logged before steps were timed
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw / "seed0"), "--runs", str(runs), "--out", str(out),
                 "--benchmarks", "arith", "--methods", "sft", "opd"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("OPD", "CPU-h")]["reproduced"] == "1.0"  # (1800 + 1000 + 440 + 360) s
    assert cells[("SFT", "CPU-h")]["reproduced"] == ""  # not known: never a partial sum


def test_a_record_that_names_its_devices_counts_them_instead_of_the_jobs_default(tmp_path):
    # a verl run's lines carry the GPUs the step held (OPD: its teacher's too); evaluations do not
    raw, runs = tmp_path / "raw", tmp_path / "runs" / "seed0"
    summaries(raw, {"opd": {"arith": 0.5}}, generation_seconds=360)
    write_metrics(runs, "opd", [{"step": 1, "reward": 0.5, "problems": 1, "generated_tokens": 1, "tool_calls": 0,
                                 "wall_seconds": 1800, "devices": 16}])
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw / "seed0"), "--runs", str(runs), "--out", str(out),
                 "--benchmarks", "arith", "--methods", "opd", "--device-kind", "GPU", "--devices-per-job", "8"]) == 0
    assert rows_of(out.with_suffix(".csv"))[("OPD", "GPU-h")]["reproduced"] == "8.8"  # (1800 x 16 + 360 x 8) s


def test_without_budget_options_their_columns_are_absent(tmp_path):
    raw = summaries(tmp_path / "raw", {"cbpo": {"arith": 0.5}})
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw), "--out", str(out), "--benchmarks", "arith", "--methods", "cbpo"]) == 0
    columns = {column for _, column in rows_of(out.with_suffix(".csv"))}
    assert columns == {"Arith", "Math Avg.", "Tokens", "Tool calls"}


@pytest.mark.parametrize("table,rows", [("table1", ["--methods", "cbpo"]), ("table2", ["--rows", "CBPO=cbpo"]),
                                        ("boundary", ["--rows", "Full=cbpo"])])
def test_every_csv_is_the_long_form_contract(tmp_path, table, rows):
    raw = summaries(tmp_path / "raw", {"cbpo": {"arith": 0.5}})
    out = tmp_path / table
    assert main([table, "--summaries", str(raw), "--out", str(out), "--benchmarks", "arith", *rows]) == 0
    assert out.with_suffix(".csv").read_text().splitlines()[0].split(",") == CONTRACT
    assert {r["table"] for r in rows_of(out.with_suffix(".csv")).values()} == {table}


@pytest.mark.parametrize("args,needle", [
    (["--rows", "cbpo"], "expected LABEL=RUN"),
    (["--rows", "CBPO=cbpo", "--backbone", "gpt9"], "gpt9"),
])
def test_bad_report_arguments_exit_2_naming_them(tmp_path, capsys, args, needle):
    raw = summaries(tmp_path / "raw", {})
    base = ["table2", "--summaries", str(raw), "--out", str(tmp_path / "t"), "--benchmarks", "aime24"]
    try:
        code = main(base + args)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("folders,needle", [
    (["raw/seed1", "raw/seed0", "copy/seed1"], "more than one folder of seed 1"),
    (["raw/all"], "named seed<N>"),
    (["raw/seed7"], "no such folder"),
    (["raw/seed0", "--runs", "runs/seed1"], "--runs: one folder per --summaries folder"),
])
def test_bad_seed_folders_exit_2_naming_them(tmp_path, capsys, folders, needle):
    for folder in ("raw/seed0", "raw/seed1", "copy/seed1", "raw/all", "runs/seed1"):
        (tmp_path / folder).mkdir(parents=True)
    paths = [a if a.startswith("--") else str(tmp_path / a) for a in folders]
    code = main(["table1", "--summaries", *paths, "--out", str(tmp_path / "t"), "--benchmarks", "arith", "--methods", "cbpo"])
    assert code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()


def test_the_tex_table_has_one_header_row_naming_its_row_columns(tmp_path):
    raw = summaries(tmp_path / "raw", {"sft": {"arith": 0.2}, "cbpo": {"arith": 0.5}})
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw), "--out", str(out), "--benchmarks", "arith", "--methods", "sft", "cbpo"]) == 0
    tex = out.with_suffix(".tex").read_text()
    header = tex.split("\\toprule\n", 1)[1].split("\\midrule", 1)[0].strip().splitlines()
    assert len(header) == 1 and header[0].startswith("Group & Method & Arith")
    assert "supervised & SFT" in tex and tex.count("supervised") == 1


def test_the_cpu_tasks_are_never_beside_the_papers_search_average(tmp_path):
    # Issue 24.7: "Search Avg. 45.5 (45.7, -0.2)" put a fork task beside the paper's five search benchmarks.
    raw = summaries(tmp_path / "raw", {"grpo": {"arith_fork": 0.4, "search_fork": 0.455}})
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw), "--out", str(out), "--benchmarks", "arith_fork", "search_fork",
                 "--methods", "grpo"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("GRPO", "Search Avg.")]["reproduced"] == "45.5" and cells[("GRPO", "Search Avg.")]["paper"] == ""
    assert all(cell["paper"] == "" for cell in cells.values())
    md = out.with_suffix(".md").read_text()
    assert "45.7" not in md and "no cell is compared with the paper" in md


def test_the_papers_benchmarks_all_scored_are_compared_with_its_average(tmp_path):
    names = ["aime24", "aime25", "math500", "gsm8k", "math"]
    raw = summaries(tmp_path / "raw", {"cbpo": dict.fromkeys(names, 0.5)})
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw), "--out", str(out), "--benchmarks", *names, "--methods", "cbpo",
                 "--backbone", "Qwen3-4B"]) == 0
    assert rows_of(out.with_suffix(".csv"))[("CBPO", "Math Avg.")]["paper"] == "69.3"


def test_a_subset_evaluation_is_marked_in_every_cell_it_feeds_and_not_beside_the_paper(tmp_path):
    raw = summaries(tmp_path / "raw", {"cbpo": {"aime24": 0.3, "arith": 0.6}, "sft": {"aime24": 0.1, "arith": 0.2}},
                    mean_tokens=10.0, mean_tool_calls=1.0)
    (raw / "cbpo" / "aime24" / "provenance.json").write_text(json.dumps({"config": {"evaluation": {"limit": 6}}}))
    (raw / "sft" / "aime24" / "provenance.json").write_text(json.dumps({"config": {"evaluation": {"limit": None}}}))
    out = tmp_path / "table1"
    assert main(["table1", "--summaries", str(raw), "--out", str(out), "--benchmarks", "aime24", "arith",
                 "--methods", "sft", "cbpo", "--backbone", "Qwen3-4B"]) == 0
    cells = rows_of(out.with_suffix(".csv"))
    assert cells[("CBPO", "AIME24")]["paper"] == "" and cells[("SFT", "AIME24")]["paper"] != ""
    rows = {r[1]: r for r in table_lines(out.with_suffix(".md").read_text())}
    header = ["Group", "Method", "AIME24", "Arith", "Math Avg.", "Tokens", "Tool calls"]
    cbpo, sft = dict(zip(header, rows["CBPO"])), dict(zip(header, rows["SFT"]))
    assert all(cbpo[c].endswith("‡") for c in ("AIME24", "Math Avg.", "Tokens", "Tool calls"))
    assert not cbpo["Arith"].endswith("‡") and "‡" not in "".join(rows["SFT"])
    assert "‡: fed by an evaluation of a subset" in out.with_suffix(".md").read_text()
    assert "$^\\ddagger$" in out.with_suffix(".tex").read_text()
