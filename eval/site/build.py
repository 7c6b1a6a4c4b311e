"""The results browser's pages: ``index.html`` (the study's tables and figures) and
``trajectories.html`` (the rollout-dump viewer), static files that need no server.

Tables are read from eval.report's long-form CSV (one line per cell: reproduced, CI, the
paper's value and the difference) with the title and legend of its Markdown twin; any other
CSV (the credit lab's) is shown column by column. Both sort by any column (tablesort, vendored
under ``assets/`` with its licence). Figures are copied beside the pages, so the folder can be
moved or served as it is.
"""
from __future__ import annotations

import csv
import html
import inspect
import shutil
from pathlib import Path
from typing import Sequence

from eval import credit_lab, figures

ASSETS = Path(__file__).with_name("assets")
REPORT_COLUMNS = {"table", "row", "column", "reproduced", "ci95", "paper", "difference", "produced"}
# What each figure shows: the docstring of the function that draws it, so the two cannot drift.
DRAWERS = {"fig2": figures.fig2, "fig4": figures.fig4, "fig5": figures.fig5, "curves": figures.curves,
           "credit_lab": credit_lab}


def caption(name: str) -> str:
    drawer = DRAWERS.get(name)
    return " ".join(inspect.getdoc(drawer).split("\n\n")[0].split()) if drawer else ""


def page(title: str, body: str, scripts: Sequence[str] = ()) -> str:
    tags = "".join(f'<script src="{html.escape(s)}"></script>' for s in scripts)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<link rel="stylesheet" href="assets/site.css"></head><body>'
            f'<nav><a href="index.html">Tables and figures</a> <a href="trajectories.html">Trajectories</a></nav>'
            f"{body}{tags}</body></html>\n")


def number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def markdown_columns(path: Path) -> list[str]:
    """The column headers of a Markdown table's first row (none without the file)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    header = next((line for line in lines if line.startswith("|")), "")
    return [cell.strip().rstrip("*") for cell in header.strip("|").split("|")]


def markdown_heading(path: Path) -> tuple[str, str]:
    """Title and legend of an eval.report Markdown table (its first two paragraphs)."""
    if not path.is_file():
        return path.stem, ""
    parts = path.read_text().split("\n\n")
    return parts[0].removeprefix("# ").strip(), (parts[1].strip() if len(parts) > 2 else "")


def report_cell(cell: dict) -> str:
    """A table cell: reproduced (± CI over seeds), the paper's value and the difference below."""
    if cell["produced"] != "True":
        return '<td data-sort="-1e300" class="missing">—</td>'
    value = cell["reproduced"]
    text = html.escape(value) + (f" ± {html.escape(cell['ci95'])}" if number(cell["ci95"]) else "")
    paper = number(cell["paper"])
    if paper is not None:
        text += f'<span class="paper">paper {paper:g} ({number(cell["difference"]):+.1f})</span>'
    return f'<td data-sort="{html.escape(value)}">{text}</td>'


def report_table(path: Path, cells: list[dict]) -> str:
    """An eval.report table: its rows down, its columns across, in the order of its Markdown twin."""
    rows = list(dict.fromkeys(c["row"] for c in cells))
    columns = list(dict.fromkeys(c["column"] for c in cells))
    shown = markdown_columns(path.with_suffix(".md"))  # the Markdown table's order, where it has every column
    if set(columns) <= set(shown):
        columns.sort(key=shown.index)
    at = {(c["row"], c["column"]): c for c in cells}
    title, legend = markdown_heading(path.with_suffix(".md"))
    head = "".join(f'<th data-sort-method="number">{html.escape(c)}</th>' for c in columns)
    body = "".join(f"<tr><th>{html.escape(r)}</th>" + "".join(report_cell(at[r, c]) if (r, c) in at else "<td></td>"
                                                            for c in columns) + "</tr>" for r in rows)
    return (f'<section class="table" id="{html.escape(path.stem)}"><h2>{html.escape(title)}</h2>'
            f'<p class="legend">{html.escape(legend)}</p><table class="sortable"><thead><tr>'
            f'<th>row</th>{head}</tr></thead><tbody>{body}</tbody></table>'
            f'<p class="files">{html.escape(str(path))} (also .md, .tex)</p></section>')


def plain_table(path: Path, lines: list[dict]) -> str:
    columns = list(lines[0]) if lines else []
    title, legend = markdown_heading(path.with_suffix(".md"))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(line[c])}</td>" for c in columns) + "</tr>" for line in lines)
    return (f'<section class="table" id="{html.escape(path.stem)}"><h2>{html.escape(title)}</h2>'
            f'<p class="legend">{html.escape(legend)}</p><div class="wide"><table class="sortable"><thead><tr>{head}'
            f'</tr></thead><tbody>{body}</tbody></table></div><p class="files">{html.escape(str(path))}</p></section>')


def table_section(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"missing input file {path}")
    with path.open(newline="") as f:
        lines = list(csv.DictReader(f))
    return report_table(path, lines) if lines and REPORT_COLUMNS <= set(lines[0]) else plain_table(path, lines)


def figure_section(path: Path, out: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"missing input file {path}")
    target = out / "figures" / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    pdf = path.with_suffix(".pdf")
    return (f'<figure id="{html.escape(path.stem)}"><img src="figures/{html.escape(path.name)}" alt="{html.escape(path.stem)}">'
            f"<figcaption><b>{html.escape(path.stem)}</b>: {html.escape(caption(path.stem))}"
            f'{f" ({html.escape(str(pdf))})" if pdf.is_file() else ""}</figcaption></figure>')


def write_pages(tables: Sequence[Path], figure_files: Sequence[Path], label: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ASSETS, out / "assets", dirs_exist_ok=True)
    sorting = ["assets/tablesort.min.js", "assets/tablesort.number.min.js", "assets/tables.js"]
    body = (f"<h1>{html.escape(label)}</h1>" + "".join(table_section(t) for t in tables)
            + "<h2>Figures</h2>" + "".join(figure_section(f, out) for f in figure_files))
    (out / "index.html").write_text(page(label, body, sorting))
    viewer = (f"<h1>Trajectories: {html.escape(label)}</h1>"
              '<div id="controls"><label>run <select id="run"></select></label> '
              '<label>step <select id="step"></select></label> '
              '<label>problem <select id="problem"></select></label></div>'
              '<p class="legend">Each rollout of the problem\'s set R_x: tokens coloured by entropy (white: the set\'s lowest, '
              'dark orange: its highest), tool observations in grey boxes, CBPO\'s candidate windows '
              'underlined, chosen branch points marked ▼. A branch repeats its parent\'s prefix (faded) up to '
              'its boundary. Hover a token for its entropy, log-prob, advantage and loss mask.</p>'
              '<svg id="tree"></svg><div id="rollouts"></div><div id="tip" hidden></div>')
    (out / "trajectories.html").write_text(page(f"Trajectories: {label}", viewer,
                                                ["assets/viewer.js", "data/manifest.js"]))
