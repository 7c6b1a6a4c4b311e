"""results/index.{md,json}: each table cell traced to the runs, seeds, checkpoints and commits
that made it, from hand-made tables, summaries, identity and provenance files."""
import csv
import json
from pathlib import Path

from eval.index import main
from eval.report import CSV_COLUMNS

STUDY = "smoke/tiny/mix"
EVAL_COMMIT, TRAIN_COMMIT = "e" * 40, "7" * 40


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def evaluation(run: str, bench: str, seed: int, trained: bool = True) -> str:
    """A finished evaluation of ``run`` (a trained run folder, or the prepared model) and its path."""
    folder = Path(f"results/raw/{STUDY}/seed{seed}/{run}/{bench}")
    checkpoint = f"runs/{STUDY}/seed{seed}/{run}/final" if trained else "models/tiny"
    write_json(folder / "summary.json", {"pass@1": 0.5})
    write_json(folder / "identity.json", {"checkpoint": checkpoint, "fingerprint": f"fp-{run}-{seed}", "seed": seed})
    write_json(folder / "provenance.json", {"git": {"commit": EVAL_COMMIT, "dirty": seed == 1}})
    if trained:
        write_json(Path(checkpoint).parent / "provenance.json", {"git": {"commit": TRAIN_COMMIT, "dirty": False}})
    return str(folder / "summary.json")


def table(path: Path, cells) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row, run, column, seeds, summaries in cells:
            writer.writerow({"table": path.stem, "row": row, "run": run, "column": column, "reproduced": "50.0" if summaries else "",
                             "ci95": "", "paper": "40.0", "difference": "10.0" if summaries else "",
                             "produced": bool(summaries), "seeds": " ".join(map(str, seeds)), "summaries": ";".join(summaries)})


def test_index_traces_every_cell_to_its_runs_seeds_and_commits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cbpo = [evaluation("cbpo", "arith", 0), evaluation("cbpo", "arith", 1)]
    sft = evaluation("base", "arith", 0, trained=False)
    gone = evaluation("grpo", "arith", 0)
    Path(gone).unlink()  # the table names it, the file is gone
    table(Path(f"results/tables/{STUDY}/table1.csv"), [
        ("CBPO", "cbpo", "Arith", [0, 1], cbpo),
        ("CBPO", "cbpo", "Math avg", [0, 1], []),  # a domain average: computed, no summary of its own
        ("Base", "base", "Arith", [0], [sft]),
        ("GRPO", "grpo", "Arith", [0], [gone]),
        ("GSPO", "gspo", "Arith", [], []),  # not produced
    ])
    Path(f"results/tables/{STUDY}/budget.csv").write_text("Method,GPU-hours\nCBPO,1.0\n")  # not a table of cells

    main(["--tables", "results/tables", "--out", "results/index"])

    (record,) = json.loads(Path("results/index.json").read_text())["tables"]
    assert record["file"] == f"results/tables/{STUDY}/table1.csv"
    cells = {(c["run"], c["column"]): c for c in record["cells"]}
    arith = cells["cbpo", "Arith"]
    assert arith["seeds"] == [0, 1] and arith["produced"] is True and arith["reproduced"] == 50.0 and arith["ci95"] is None
    assert [(s["path"], s["present"], s["seed"], s["fingerprint"]) for s in arith["summaries"]] == [
        (cbpo[0], True, 0, "fp-cbpo-0"), (cbpo[1], True, 1, "fp-cbpo-1")]
    assert arith["summaries"][1]["checkpoint"] == f"runs/{STUDY}/seed1/cbpo/final"
    assert arith["summaries"][1]["evaluation"] == {"commit": EVAL_COMMIT, "dirty": True}
    assert arith["summaries"][1]["training"] == {"commit": TRAIN_COMMIT, "dirty": False}
    assert cells["cbpo", "Math avg"]["summaries"] == []
    (base,) = cells["base", "Arith"]["summaries"]
    assert base["checkpoint"] == "models/tiny" and base["training"] is None and base["evaluation"]["commit"] == EVAL_COMMIT
    (missing,) = cells["grpo", "Arith"]["summaries"]
    assert missing["present"] is False and missing["path"] == gone
    assert cells["gspo", "Arith"]["produced"] is False

    md = Path("results/index.md").read_text()
    assert f"## `results/tables/{STUDY}/table1.csv`" in md and "budget" not in md
    lines = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert lines["CBPO"].startswith("| CBPO | cbpo | 0 1 |")
    assert f"`{EVAL_COMMIT[:10]}` `{EVAL_COMMIT[:10]}+dirty`" in lines["CBPO"] and f"`{TRAIN_COMMIT[:10]}`" in lines["CBPO"]
    assert f"[Arith seed 1](raw/{STUDY}/seed1/cbpo/arith/summary.json)" in lines["CBPO"]  # relative to the index
    assert "| — |" in lines["Base"]  # no training run behind the prepared model
    assert f"missing `{gone}`" in lines["GRPO"]
    assert lines["GSPO"].endswith("| — | — | — | not produced |")


def test_no_tables_yet_writes_an_empty_index(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["--tables", "results/tables", "--out", "results/index"])
    assert json.loads(Path("results/index.json").read_text()) == {"tables": []}
    assert "No tables yet." in Path("results/index.md").read_text()
