"""Numbers in the README and the docs state what they were measured with, and go stale when it
changes: each measured section carries a marker
``<!-- measured: commit=C preset=P data=D preset_hash=H -->``, H being :func:`preset_hash` of the
preset and data configs the numbers depend on (issue #36, item 6)."""
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- measured: commit=(?P<commit>[0-9a-f]{7,40}) preset=(?P<preset>[\w-]+) "
                    r"data=(?P<data>[\w-]+) preset_hash=(?P<hash>[0-9a-f]{12}) -->")
MEASURED_PAGES = ["README.md", "docs/cpu-testbed.md"]


def preset_hash(preset: str, data: str) -> str:
    """The settings of the preset and data configs as parsed (comments and layout do not count)."""
    settings = {name: yaml.safe_load((ROOT / "configs" / group / f"{name}.yaml").read_text())
                for group, name in (("preset", preset), ("data", data))}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def markers():
    others = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))]
    pages = [*MEASURED_PAGES, *(p for p in others if p not in MEASURED_PAGES)]
    return [(page, m) for page in pages for m in MARKER.finditer((ROOT / page).read_text())]


def test_every_page_of_measured_results_carries_markers():
    pages = {page for page, _ in markers()}
    assert set(MEASURED_PAGES) <= pages


@pytest.mark.parametrize("page, marker", markers(), ids=lambda v: v if isinstance(v, str) else v.group(0)[14:60])
def test_measured_numbers_match_the_presets_they_were_measured_with(page, marker):
    now = preset_hash(marker["preset"], marker["data"])
    assert marker["hash"] == now, (
        f"{page}: numbers measured at {marker['commit']} with preset={marker['preset']} data={marker['data']}, whose "
        f"settings have changed since (preset_hash {marker['hash']} -> {now}): measure them again and update the marker")
