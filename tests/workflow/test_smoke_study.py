"""The shared smoke study (tests/conftest.py: `snakemake all` on the smoke preset and the fork
tasks, as `make demo` runs them, and `snakemake --report` of it), computed once and read by every
test here: the real DAG end to end (Table 1 beside the paper, every table, figure and the index,
nothing left to do on a second run), and the study's face in a real browser (Debian's chromium,
driven by Playwright): the results browser and Snakemake's report load with no console error and
draw something; the trajectory viewer renders a dumped CBPO group with its branches. The study's
CBPO run rarely branches (its windows' priorities stay near alpha < kappa), so one more CBPO run
with kappa = 0 is trained beside it and shown with `python -m eval.site`. Under xdist the module
runs on one worker and starts first (tests/conftest.py); its old homes: docs/test-suite.md."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
SMOKE = ("preset=smoke", "data=forks")  # the shared study's configuration
STUDY = "smoke/tiny/forks"
TABLE = Path(f"results/tables/{STUDY}/table1")
RUN = Path(f"runs/{STUDY}/seed0")
CHROMIUM = Path("/usr/bin/chromium")
# Where screenshots go: a folder of the caller's choosing, else the test's own.
SCREENS = os.environ.get("CBPO_SCREENSHOTS")


# ---------------------------------------------------------------------------------------------
# The DAG's outputs

def test_dag_writes_table1_beside_the_paper(smoke_study):
    for suffix in (".md", ".csv", ".tex"):
        assert (smoke_study / TABLE.with_suffix(suffix)).stat().st_size > 0
    cells = list(csv.DictReader((smoke_study / TABLE.with_suffix(".csv")).open()))
    assert {c["row"] for c in cells} == {"SFT", "GRPO", "GIGPO", "ARPO", "CBPO"}
    for c in cells:
        if c["column"] in ("ArithFork", "SearchFork"):
            assert 0.0 <= float(c["reproduced"]) <= 100.0 and c["seeds"] == "0" and c["summaries"].endswith("summary.json")
    # The toy benchmarks are not the paper's: no cell, domain averages included, sits beside a paper number.
    (cbpo_math,) = [c for c in cells if c["row"] == "CBPO" and c["column"] == "Math Avg."]
    assert 0.0 <= float(cbpo_math["reproduced"]) <= 100.0
    assert all(c["paper"] == "" and c["difference"] == "" for c in cells)
    # The smoke preset dumps CBPO's rollouts with its annotations.
    dump = [json.loads(line) for line in (smoke_study / RUN / "cbpo" / "rollouts" / "step_000001.jsonl").open()]
    assert {"text", "model_mask", "entropy", "advantage", "loss_mask", "reward"} <= set(dump[0])
    assert all("candidates" in r and "chosen" in r for r in dump if r["kind"] == "parent")
    # Every training step reports its searches (the built-in corpus has no cache to count).
    steps = [json.loads(line) for line in (smoke_study / RUN / "cbpo" / "metrics.jsonl").open()]
    assert all(s["search_calls"] >= 0 and s["search_cache_hits"] is None for s in steps if "reward" in s)
    # Every step's wall time is recorded.
    assert len(list((smoke_study / "results" / "benchmarks").rglob("*.tsv"))) >= 10
    # The caption names what made the table.
    assert "smoke preset, tiny, forks data" in (smoke_study / TABLE.with_suffix(".md")).read_text()


def test_all_writes_every_table_figure_and_the_index(smoke_study):
    tables = smoke_study / "results" / "tables" / STUDY
    for name in ("table1", "table2", "table3", "boundary"):
        assert all((tables / f"{name}{suffix}").stat().st_size > 0 for suffix in (".md", ".csv", ".tex"))
    figures = smoke_study / "results" / "figures" / STUDY
    for name in ("fig2", "fig4", "fig5", "curves", "credit_lab"):
        assert (figures / f"{name}.png").read_bytes()[:4] == b"\x89PNG" and (figures / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    index = json.loads((smoke_study / "results" / "index.json").read_text())
    assert "w/o CBV" in json.dumps(index) and "cbpo-wo-cbv" in json.dumps(index)
    # Every training and evaluation folder says what made it.
    for folder in (smoke_study / RUN / "cbpo", smoke_study / "results" / "raw" / STUDY / "seed0" / "cbpo" / "arith_fork"):
        provenance = json.loads((folder / "provenance.json").read_text())
        assert provenance["config"]["preset_name"] == "smoke" and provenance["versions"]["torch"]


def test_second_run_does_nothing(smoke_study, dag):
    out = dag(smoke_study, "-n", "all", config=SMOKE, check=False)
    assert out.returncode == 0
    assert "Nothing to be done" in out.stdout + out.stderr


# ---------------------------------------------------------------------------------------------
# The study in a browser

@pytest.fixture(scope="module")
def study(smoke_study):
    """The shared smoke study (its results browser and report.html), and beside it one more
    CBPO run with kappa = 0 shown with `python -m eval.site` in branching/."""
    work = smoke_study
    runs = work / "runs" / STUDY / "seed0"
    train = [sys.executable, "-m", "cbpo.train", "stage=rl", "method=cbpo", "preset=smoke", "data=forks", "method.kappa=0",
             "variant=cbpo-kappa0", "rl.dump_rollouts=true"]
    out = subprocess.run(train, capture_output=True, text=True, env=ENV, cwd=work, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    site = [sys.executable, "-m", "eval.site", "--runs", str(runs / "cbpo"), str(runs / "cbpo-kappa0"),
            "--tables", str(work / "results" / "tables" / STUDY / "table1.csv"), "--label", "branching", "--out",
            str(work / "branching")]
    out = subprocess.run(site, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return work


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium under Playwright; the browser tests skip, saying why, without either."""
    if not CHROMIUM.is_file():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


def open_page(browser, url, width=1280, height=1000):
    """A page at ``url`` and the console errors and uncaught exceptions it reports."""
    page = browser.new_page(viewport={"width": width, "height": height})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    return page, errors


def screenshot(page, tmp_path, name):
    """A full-page screenshot (kept under $CBPO_SCREENSHOTS when set) that is not blank."""
    folder = Path(SCREENS) if SCREENS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    image = imread(path)
    assert image.shape[0] > 300 and image.std() > 0.05, f"{path} is blank"
    return path


def test_the_index_shows_sortable_tables_and_every_figure(study, browser, tmp_path):
    site = study / "results" / "site"
    page, errors = open_page(browser, (site / "index.html").as_uri())
    assert page.locator("h2", has_text="Table 1").count() == 1
    table = page.locator("section#table1 table")
    rows = table.locator("tbody tr")
    cells = list(csv.DictReader((study / "results" / "tables" / STUDY / "table1.csv").open()))
    order = list(dict.fromkeys(c["row"] for c in cells))  # the study's rows, as the report wrote them
    assert [rows.nth(i).locator("th").inner_text() for i in range(rows.count())] == order and "CBPO" in order
    # Each cell as the report's CSV has it: the reproduced value, the paper's beside it where there is one.
    header = table.locator("thead th").all_inner_texts()
    for cell in cells:
        row = order.index(cell["row"])
        text = rows.nth(row).locator("td").nth(header.index(cell["column"]) - 1).inner_text()
        assert text.startswith(cell["reproduced"] or "—"), (cell, text)
        assert ("paper" in text) == bool(cell["paper"] and cell["produced"] == "True"), (cell, text)
    labels = lambda: [rows.nth(i).locator("th").inner_text() for i in range(rows.count())]
    table.locator("thead th").first.click()  # tablesort: a click on a header sorts by it, a second reverses
    first = labels()
    assert first in (sorted(first), sorted(first, reverse=True))
    table.locator("thead th").first.click()
    assert labels() == first[::-1]
    figures = {Path(src).stem for src in page.locator("figure img").evaluate_all("els => els.map(e => e.getAttribute('src'))")}
    assert figures == {"fig2", "fig4", "fig5", "curves", "credit_lab"}
    assert page.locator("figure img").evaluate_all("els => els.every(e => e.complete && e.naturalWidth > 300)")
    screenshot(page, tmp_path, "site_index")
    assert errors == []


def test_the_viewer_renders_a_cbpo_group_with_its_branches(study, browser, tmp_path):
    page, errors = open_page(browser, (study / "branching" / "trajectories.html").as_uri())
    page.wait_for_selector("body[data-rendered]")
    # It opens on a run, step and problem that branched (the smoke CBPO run rarely does).
    chosen = page.locator("#problem option:checked").inner_text()  # "<id>: N rollouts, B branches"
    assert int(chosen.rsplit(", ", 1)[1].split()[0]) > 0, chosen
    assert page.locator("#run option:checked").inner_text() in ("seed0/cbpo", "seed0/cbpo-kappa0")
    # The tree: one line per rollout, one edge per branch, a dot per chosen branch point.
    n = page.locator(".response").count()
    assert page.locator("#tree line.rollout").count() == n
    assert page.locator("#tree path.branch").count() == page.locator(".response.branch").count() > 0
    assert page.locator("#tree circle.chosen").count() == page.locator(".tokens .mark").count() > 0
    assert page.locator(".tok.window").count() > 0 and page.locator(".tok.copied").count() > 0
    assert page.locator(".head", has_text="reward").count() == n
    page.locator(".response.parent .tok").first.hover()
    tip = page.locator("#tip")
    assert tip.is_visible() and "entropy" in tip.inner_text() and "advantage" in tip.inner_text()
    screenshot(page, tmp_path, "site_trajectories")
    assert errors == []


def test_the_dags_viewer_loads_every_run_of_the_study(study, browser):
    page, errors = open_page(browser, (study / "results" / "site" / "trajectories.html").as_uri())
    page.wait_for_selector("body[data-rendered]")
    runs = page.locator("#run option").all_inner_texts()
    assert {"seed0/grpo", "seed0/cbpo", "seed0/gigpo", "seed0/arpo"} <= set(runs)
    for i in range(len(runs)):
        page.locator("#run").select_option(str(i))
        page.wait_for_function(f"document.body.dataset.rendered.startsWith({json.dumps(runs[i] + '/')})")
        assert page.locator(".response").count() > 0
    assert errors == []


def test_the_snakemake_report_holds_every_table_and_figure_with_its_caption(study, browser, tmp_path):
    page, errors = open_page(browser, (study / "report.html").as_uri(), height=900)
    page.wait_for_selector("text=Workflow")
    text = page.inner_text("body")
    assert "smoke preset, tiny model, forks data" in text
    screenshot(page, tmp_path, "snakemake_report")
    page.get_by_text("Figures", exact=True).first.click()
    listing = page.inner_text("body")
    assert all(f"{name}.png" in listing for name in ("fig2", "fig4", "fig5", "curves", "credit_lab")), listing[-2000:]
    page.reload()  # back to the menu
    page.get_by_text("Tables", exact=True).first.click()
    assert "table1.md" in page.inner_text("body")
    assert errors == []
