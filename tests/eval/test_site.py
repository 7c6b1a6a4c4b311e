"""eval.site's files without a browser: tables from eval.report's long-form CSV, the viewer's
data scripts from a rollout dump, and a missing input named (the browser itself:
tests/workflow/test_smoke_study.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from eval.site.__main__ import main
from eval.site.trajectories import write_trajectories

CONTRACT = ["table", "row", "run", "column", "reproduced", "ci95", "paper", "difference", "produced", "seeds", "summaries"]
VOCAB = {"<call>": 0, "plan": 1, "x": 2, "obs": 3, "<answer>": 4, "42": 5}


def write_table(folder: Path) -> Path:
    cells = [
        ("SFT", "sft", "Arith", "9.0", "", "", "", "True"),
        ("SFT", "sft", "Math Avg.", "9.0", "", "60.3", "-51.3", "True"),
        ("CBPO", "cbpo", "Arith", "44.0", "3.5", "", "", "True"),
        ("CBPO", "cbpo", "Math Avg.", "", "", "66.0", "", "False"),
    ]
    path = folder / "table1.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CONTRACT)
        for row, run, column, value, ci, paper, diff, produced in cells:
            writer.writerow(["table1", row, run, column, value, ci, paper, diff, produced, "0", ""])
    path.with_suffix(".md").write_text("# Table 1: main results\n\nPass@1 (%), a label.\n\n| table |\n")
    return path


def write_run(run: Path, problems: int = 1) -> None:
    """A CBPO run folder: its tokenizer, run_key.json and one dump of parent + branch per problem."""
    (run / "final").mkdir(parents=True)
    Tokenizer(WordLevel(VOCAB, unk_token="x")).save(str(run / "final" / "tokenizer.json"))
    (run / "run_key.json").write_text(json.dumps({"method": {"w": 2}}))
    ids, mask = [1, 0, 3, 3, 4, 5], [1, 1, 0, 0, 1, 1]  # plan <call> obs obs <answer> 42
    rows = []
    for x in range(problems):
        parent = {"problem": f"p{x}", "kind": "parent", "parent": None, "at": None, "reward": 1.0, "finish": "answer",
                  "tool_calls": 1, "response_ids": ids, "model_mask": mask, "entropy": [0.5, 0.1, 0, 0, 0.9, 0.2],
                  "logprob": [-1.0, -0.1, 0, 0, -2.0, -0.5], "advantage": [0.3, 0.3, 0.6, 0.6], "loss_mask": [1, 1, 1, 1],
                  "candidates": [0, 2], "priorities": [0.2, 0.4], "chosen": [2], "nodes": [{"at": 2, "cbv": 1.0}]}
        branch = {**{k: v for k, v in parent.items() if k not in ("candidates", "priorities", "chosen", "nodes")},
                  "kind": "branch", "parent": 0, "at": 2, "reward": 0.0}
        rows += [parent, branch]
    (run / "rollouts").mkdir()
    (run / "rollouts" / "step_000004.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def script_data(path: Path, call: str) -> dict:
    text = path.read_text().strip()
    assert text.startswith(f"CBPO_SITE.{call}(") and text.endswith(");")
    return json.loads(text[len(f"CBPO_SITE.{call}("):-2])


def test_a_report_table_shows_each_cell_beside_the_paper_in_the_reports_order(tmp_path):
    table = write_table(tmp_path)
    assert main(["--tables", str(table), "--label", "a study", "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "index.html").read_text()
    assert "<h2>Table 1: main results</h2>" in page and "Pass@1 (%), a label." in page
    assert page.index("<th>SFT</th>") < page.index("<th>CBPO</th>")  # rows as the report wrote them
    assert '<td data-sort="9.0">9.0<span class="paper">paper 60.3 (-51.3)</span></td>' in page
    assert '<td data-sort="44.0">44.0 ± 3.5</td>' in page
    assert '<td data-sort="-1e300" class="missing">—</td>' in page  # not produced: sorts last
    assert all((tmp_path / "site" / "assets" / f).is_file() for f in ("tablesort.min.js", "tablesort.LICENCE", "viewer.js"))
    assert "http" not in page  # nothing is fetched when the page is viewed


def test_each_dump_becomes_a_script_of_the_runs_own_token_pieces(tmp_path):
    run = tmp_path / "runs" / "seed0" / "cbpo"
    write_run(run, problems=3)
    manifest = write_trajectories([("seed0/cbpo", run)], tmp_path / "site", max_problems=2)
    (step,) = manifest["runs"][0]["steps"]
    assert step["step"] == 4 and step["file"] == "data/seed0/cbpo/step_000004.js"
    assert step["problems"] == [{"id": "p0", "rollouts": 2, "branches": 1}, {"id": "p1", "rollouts": 2, "branches": 1}]
    assert script_data(tmp_path / "site" / "data" / "manifest.js", "manifest") == manifest
    doc = script_data(tmp_path / "site" / step["file"], "dump")
    assert doc["w"] == 2 and [p["id"] for p in doc["problems"]] == ["p0", "p1"]
    parent, branch = doc["problems"][0]["rollouts"]
    assert parent["tokens"] == ["plan", "<call>", "obs", "obs", "<answer>", "42"]
    assert parent["chosen"] == [2] and parent["candidates"] == [0, 2] and parent["advantage"] == [0.3, 0.3, 0.6, 0.6]
    assert branch["kind"] == "branch" and branch["parent"] == 0 and branch["at"] == 2 and "chosen" not in branch


def test_a_missing_input_is_named(tmp_path, capsys):
    run = tmp_path / "cbpo"
    write_run(run)
    (run / "final" / "tokenizer.json").unlink()
    assert main(["--runs", str(run), "--out", str(tmp_path / "site")]) == 2
    assert str(run / "final" / "tokenizer.json") in capsys.readouterr().err
    assert main(["--figures", str(tmp_path / "fig9.png"), "--out", str(tmp_path / "site")]) == 2
    assert str(tmp_path / "fig9.png") in capsys.readouterr().err
