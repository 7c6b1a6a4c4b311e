"""The stable JSON contracts of ``python -m cbpo allocate`` and ``python -m cbpo credit``."""
import json
import subprocess
import sys

import pytest


def run(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "cbpo", *args], input=stdin, capture_output=True, text=True, timeout=120)


def test_allocate_contract(tmp_path):
    doc = {
        "config": {"w": 4, "d_min": 4},
        "budget": 8,
        "problems": [
            {"id": "p0", "vocab_size": 1000, "parents": [
                {"id": "a", "token_entropy": [0.1] * 4 + [1.0] * 4 + [2.0] * 4 + [0.0] * 4 + [3.0] * 4},
                {"id": "b", "token_entropy": [0.5] * 12},
            ]},
            {"id": "p1", "vocab_size": 1000, "parents": [{"id": "c", "token_entropy": [1.0] * 3}]},
        ],
    }
    path = tmp_path / "in.json"
    path.write_text(json.dumps(doc))
    out = run("allocate", str(path))
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["problems"][0] == {
        "id": "p0",
        "branches": [{"parent": "a", "at": 16}] * 3 + [{"parent": "a", "at": 8}],
        "fill": 2,
    }
    assert res["problems"][1] == {"id": "p1", "branches": [], "fill": 7}


def test_allocate_tool_boundary_candidates(tmp_path):
    doc = {"config": {"w": 2, "candidates": "tool_boundary"}, "budget": 3, "problems": [
        {"id": 0, "vocab_size": 100, "parents": [{"id": 0, "token_entropy": [0.0, 0.0, 0, 0, 0, 3.0, 3.0, 0], "tool_boundaries": [5]}]}]}
    out = run("allocate", "-", stdin=json.dumps(doc))
    assert json.loads(out.stdout)["problems"][0]["branches"] == [{"parent": 0, "at": 5}, {"parent": 0, "at": 5}]


def test_credit_contract(tmp_path):
    rows = [
        {"problem": "x", "id": "a", "kind": "parent", "parent": None, "at": None, "reward": 1.0, "n_tokens": 6},
        {"problem": "y", "id": "a", "kind": "parent", "parent": None, "at": None, "reward": 0.0, "n_tokens": 2},
        {"problem": "x", "id": "b", "kind": "branch", "parent": "a", "at": 2, "reward": 0.0, "n_tokens": 5},
        {"problem": "x", "id": "c", "kind": "fill", "parent": None, "at": None, "reward": 0.0, "n_tokens": 3},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = run("credit", str(path))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["id"] for line in lines] == ["a", "a", "b", "c"]
    a = [2 / 3 / (3**-0.5 + 1e-6)] + [-1 / 3 / (3**-0.5 + 1e-6)] * 2  # (R - mean) / (sample std + eps)
    shared = (a[0] + a[1]) / 2  # a single node: sigma_CBV = 0, so Z = 0 and A_final = A
    assert lines[0]["advantage"] == pytest.approx([shared] * 2 + [a[0]] * 4)
    assert lines[1] == {"id": "a", "advantage": [0.0, 0.0], "loss_mask": [1, 1]}
    assert lines[2]["advantage"] == pytest.approx([0, 0] + [a[1]] * 3)
    assert lines[2]["loss_mask"] == [0, 0, 1, 1, 1]
    assert lines[3]["advantage"] == pytest.approx([a[2]] * 3)
    with_cfg = run("credit", str(path), "--config", '{"eta": 0.0}')
    assert with_cfg.returncode == 0


@pytest.mark.parametrize(
    "args,stdin,needle",
    [
        (["allocate", "/nonexistent.json"], None, "cannot read"),
        (["allocate", "-"], "{not json", "not valid JSON"),
        (["allocate", "-"], json.dumps({"budget": 4, "problems": [{"parents": []}]}), "vocab_size"),
        (["allocate", "-"], json.dumps({"budget": 4, "config": {"zeta": 1}, "problems": []}), "zeta"),
        (["allocate", "-"], json.dumps({"budget": 1, "problems": [{"vocab_size": 9, "parents": [{"token_entropy": []}] * 2}]}), "exceed"),
        (["credit", "-"], '{"problem": 1, "id": 1, "kind": "branch", "parent": 7, "at": 0, "reward": 1, "n_tokens": 2}', "parent"),
        (["credit", "-"], '{"problem": 1, "id": 1}', "kind"),
        (["credit", "-", "--config", '{"etta": 1}'], "", "etta"),
    ],
)
def test_bad_input_names_the_problem(args, stdin, needle):
    out = run(*args, stdin=stdin)
    assert out.returncode == 2
    assert needle in out.stderr
