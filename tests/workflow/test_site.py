"""The smoke study's face in a real browser (Debian's chromium, driven by Playwright): the DAG's
results browser (`snakemake site`) and Snakemake's report (`snakemake --report`) load with no
console error and draw something; the trajectory viewer renders a dumped CBPO group with its
branches. The smoke CBPO run rarely branches (its windows' priorities stay near alpha < kappa),
so one more CBPO run with kappa = 0 is trained beside it and shown with `python -m eval.site`."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.is_file():
    pytest.skip("no /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
CONFIG = ["--config", "preset=smoke", "data=forks"]
STUDY = "smoke/tiny/forks"
# Where screenshots go: a folder of the caller's choosing, else the test's own.
SCREENS = os.environ.get("CBPO_SCREENSHOTS")


def snakemake(workdir, *args):
    cmd = [str(SNAKEMAKE), *args, "-s", str(ROOT / "Snakefile"), "-d", str(workdir), "-c2", *CONFIG]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=1800)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    work = tmp_path_factory.mktemp("study")
    snakemake(work, "site")
    snakemake(work, "site", "--report", str(work / "report.html"))
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
