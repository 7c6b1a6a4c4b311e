"""Figures 2, 4, 5 and the reward curves from small result files: a real CBPO rollout dump (one
step of the method on a scripted sampler, written by the trainer's dump writer), metrics of two
seeds and Pass@k summaries."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from cbpo.registry import get_method
from cbpo.backends.local.rl import dump_rollouts
from cbpo.trajectory import Trajectory
from eval.figures import candidates, dump_response, main, mean_ci, seed_band

SEEDS = ("seed0", "seed1")
TRAINED = ("grpo", "gigpo", "arpo", "cbpo")


def sampler(trajs):
    """Completes each trajectory to 40 model tokens, a tool observation after token 10; the
    first problem's entropy peaks at tokens 24-27, the second's at 8-11 and 24-27."""
    out = []
    for t in trajs:
        ids, mask, ent = list(t.response_ids), list(t.model_mask), list(t.entropies)
        peak = {*range(24, 28)} if t.prompt_ids[0] == 1 else {*range(8, 12), *range(24, 28)}
        for pos in range(t.n_model_tokens, 40):
            if pos == 10 and (not mask or mask[-1]):
                ids, mask, ent = ids + [99, 99], mask + [False, False], ent + [0.0, 0.0]
            ids, mask, ent = ids + [5], mask + [True], ent + [3.0 if pos in peak else 0.1]
        out.append(Trajectory(t.prompt_ids, ids, mask, [0.0] * len(ids), ent, finish="answer", kind=t.kind, parent=t.parent, at=t.at))
    return out


def write_cbpo_dump(run: Path) -> None:
    """One CBPO step's rollouts, annotated by the method itself, as rl.dump_rollouts writes them."""
    cbpo = get_method("cbpo")(vocab_size=100, budget=8, n0=2, w=4, d_min=8)
    groups = cbpo.collect([[1, 2], [3]], sampler)
    rng = np.random.default_rng(0)
    for t in (t for g in groups for t in g):
        t.reward = float(rng.integers(0, 2))
    credits = [c for g in cbpo.credit(groups) for c in g]
    extra = [e for g in cbpo.rollout_info(groups) for e in g]
    flat = [t for g in groups for t in g]
    rows = [{"id": f"p{x}"} for x, g in enumerate(groups) for _ in g]
    dump_rollouts(run / "rollouts" / "step_000003.jsonl", flat, ["text"] * len(flat), credits, rows, extra)
    (run / "run_key.json").write_text(json.dumps({"method": dataclasses.asdict(cbpo.cfg), "stage": "rl"}))


@pytest.fixture
def study(tmp_path):
    """runs/<seed>/<method>/metrics.jsonl for two seeds, CBPO's dumps, Pass@k summaries."""
    for s, seed in enumerate(SEEDS):
        for m, method in enumerate(TRAINED):
            run = tmp_path / "runs" / seed / method
            run.mkdir(parents=True)
            steps = [{"step": i, "reward": 0.1 * i + 0.05 * s + 0.01 * m, "tool_calls": 2 * i + m, "rollouts": 8} for i in (1, 2, 3)]
            run.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
            for bench in ("arith", "gsm8k"):
                summary = tmp_path / "raw" / seed / method / bench / "pass5" / "summary.json"
                summary.parent.mkdir(parents=True)
                summary.write_text(json.dumps({"pass@1": 0.4, "pass@k": {"1": 0.4 + 0.1 * s, "3": 0.6, "5": 0.7}, "n": 5}))
        write_cbpo_dump(tmp_path / "runs" / seed / "cbpo")
    # An older dump without annotations: only the newest step is read.
    (tmp_path / "runs" / "seed0" / "cbpo" / "rollouts" / "step_000001.jsonl").write_text('{"problem": "old", "kind": "fill"}\n')
    return tmp_path


def command(study, figure):
    runs = [str(study / "runs" / s) for s in SEEDS]
    return {
        "fig2": ["fig2", "--run", str(study / "runs" / "seed0" / "cbpo")],
        "fig4": ["fig4", "--summaries", *(str(study / "raw" / s) for s in SEEDS), "--summary-file", "pass5/summary.json",
                 "--methods", "arpo", "cbpo", "--benchmarks", "arith", "gsm8k"],
        "fig5": ["fig5", "--runs", *runs, "--methods", "gigpo", "arpo", "cbpo"],
        "curves": ["curves", "--runs", *runs, "--methods", "grpo", "cbpo"],
    }[figure] + ["--out", str(study / "figures" / figure), "--label", "smoke preset, tiny, mix data"]


@pytest.mark.parametrize("figure", ["fig2", "fig4", "fig5", "curves"])
def test_each_figure_is_written_as_png_and_pdf(study, figure):
    assert main(command(study, figure)) == 0
    png, pdf = (study / "figures" / f"{figure}{suffix}" for suffix in (".png", ".pdf"))
    assert pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 1000
    image = imread(png)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    assert image.std() > 0.01  # something was drawn


def test_mean_ci_is_the_student_t_interval_over_seeds():
    # t_{0.975, 2} = 4.302653; the sample std of (1, 2, 3) is 1.
    mean, low, high = mean_ci([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0)
    assert (low, high) == pytest.approx((2.0 - 4.302653 / np.sqrt(3), 2.0 + 4.302653 / np.sqrt(3)), rel=1e-6)
    assert mean_ci([0.7]) == (0.7, 0.7, 0.7)  # one seed: no interval


def test_seed_band_averages_the_seeds_that_logged_each_step():
    steps, mean, low, high = seed_band([{1: 0.0, 2: 1.0}, {1: 1.0, 2: 1.0, 3: 0.5}])
    assert steps.tolist() == [1, 2, 3]
    assert mean.tolist() == pytest.approx([0.5, 1.0, 0.5])
    half = 12.706205 * np.sqrt(0.5) / np.sqrt(2)  # t_{0.975, 1} x std / sqrt(2)
    assert low.tolist() == pytest.approx([0.5 - half, 1.0, 0.5], rel=1e-6)
    assert high.tolist() == pytest.approx([0.5 + half, 1.0, 0.5], rel=1e-6)


def test_the_response_shown_is_the_newest_dumps_parent_with_most_branch_points(study):
    run = study / "runs" / "seed0" / "cbpo"
    path, groups, (x, k) = dump_response(run)
    assert path.name == "step_000003.jsonl"
    parents = [(len(r["chosen"]), y, j) for y, g in enumerate(groups) for j, r in enumerate(g) if r["kind"] == "parent"]
    most = max(n for n, _, _ in parents)
    assert len(groups[x][k]["chosen"]) == most
    assert (x, k) == min((y, j) for n, y, j in parents if n == most)  # the earliest on a tie
    assert dump_response(run)[2] == (x, k)


def test_candidates_carry_window_entropy_and_post_decay_priority(study):
    run = study / "runs" / "seed0" / "cbpo"
    _, groups, (x, _) = dump_response(run)
    cfg = json.loads((run / "run_key.json").read_text())["method"]
    cands = candidates(groups[x], cfg)
    branches = [(r["parent"], r["at"]) for r in groups[x] if r["kind"] == "branch"]
    assert cands and any(c["chosen"] for c in cands)
    for c in cands:
        parent = groups[x][c["parent"]]
        ent = np.asarray(parent["entropy"])[np.asarray(parent["model_mask"], dtype=bool)]
        assert c["entropy"] == pytest.approx(ent[c["at"]:c["at"] + cfg["w"]].mean())
        p_raw = parent["priorities"][parent["candidates"].index(c["at"])]
        path_count = sum(p == c["parent"] for p, _ in branches)
        node_count = branches.count((c["parent"], c["at"]))
        assert c["priority"] == pytest.approx(p_raw / (1 + path_count) ** 0.2 / (1 + node_count) ** 0.2)
        assert c["chosen"] == (node_count > 0)


@pytest.mark.parametrize("figure,missing", [
    ("curves", "runs/seed1/grpo/metrics.jsonl"),
    ("fig5", "runs/seed1/arpo/metrics.jsonl"),
    ("fig5", "runs/seed0/cbpo/run_key.json"),
    ("fig4", "raw/seed1/cbpo/gsm8k/pass5/summary.json"),
    ("fig2", "runs/seed0/cbpo/rollouts"),
])
def test_a_missing_input_is_named(study, figure, missing, capsys):
    target = study / missing
    if target.is_dir():
        for dump in target.iterdir():
            dump.unlink()
    else:
        target.unlink()
    assert main(command(study, figure)) == 2
    assert str(target) in capsys.readouterr().err
    assert not (study / "figures" / f"{figure}.png").exists()


def test_fig4_refuses_summaries_of_too_few_samples(study, capsys):
    greedy = study / "raw" / "seed0" / "arpo" / "arith" / "pass5" / "summary.json"
    greedy.write_text(json.dumps({"pass@1": 0.5, "pass@k": {"1": 0.5}, "n": 1}))
    assert main(command(study, "fig4")) == 2
    err = capsys.readouterr().err
    assert str(greedy) in err and "pass@3" in err and "n=1" in err


def test_fig2_names_a_dump_without_cbpo_annotations(study, capsys):
    dump = study / "runs" / "seed0" / "cbpo" / "rollouts" / "step_000003.jsonl"
    dump.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k not in ("candidates", "chosen")}) + "\n"
                            for line in dump.read_text().splitlines()))
    assert main(command(study, "fig2")) == 2
    assert f"{dump}: the rollout dump has no CBPO annotations" in capsys.readouterr().err


def unchosen_copy(dump: Path, target: Path) -> None:
    """``dump`` as a step where CBPO chose no branch point: its parents, candidates kept."""
    parents = [json.loads(line) for line in dump.read_text().splitlines() if json.loads(line)["kind"] == "parent"]
    target.write_text("".join(json.dumps({**r, "chosen": [], "nodes": []}) + "\n" for r in parents))


def test_fig2_and_fig5_show_the_newest_step_where_a_branch_point_was_chosen(study):
    run = study / "runs" / "seed0" / "cbpo"
    unchosen_copy(run / "rollouts" / "step_000003.jsonl", run / "rollouts" / "step_000005.jsonl")
    path, groups, (x, k) = dump_response(run)
    assert path.name == "step_000003.jsonl" and groups[x][k]["chosen"]
    assert main(command(study, "fig2")) == 0 and main(command(study, "fig5")) == 0


def test_without_any_chosen_branch_point_fig2_shows_the_newest_dump(study):
    run = study / "runs" / "seed0" / "cbpo"
    dump = run / "rollouts" / "step_000003.jsonl"
    unchosen_copy(dump, run / "rollouts" / "step_000005.jsonl")
    unchosen_copy(run / "rollouts" / "step_000005.jsonl", dump)
    path, groups, (x, k) = dump_response(run)
    assert path.name == "step_000005.jsonl" and not groups[x][k]["chosen"]
    assert main(command(study, "fig2")) == 0


def test_a_method_keeps_its_colour_and_a_variant_gets_its_own():
    from eval.figures import color

    assert color("grpo") != color("cbpo")
    assert color("cbpo-alive") == color("cbpo-alive") != color("cbpo-decisions")
    assert {color("cbpo-alive"), color("cbpo-decisions")}.isdisjoint({color("grpo"), color("cbpo")})
