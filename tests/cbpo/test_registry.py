"""The method registry: the listing contract of ``python -m cbpo methods`` and the optional
hooks' defaults (what GRPO and CBPO get)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cbpo.registry import (GROUPS, Problems, collect, get_method, method_names, prompt_pool, setup, step_stats,
                           verl_estimator)

ROOT = Path(__file__).resolve().parents[2]
TABLE1 = ["base", "tir", "sft", "opd", "grpo", "reinforce_pp", "dapo", "gspo", "eapo", "oc_grpo", "gigpo", "tree_grpo", "arpo", "cbpo"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "cbpo", "methods", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_methods_json_lists_every_table1_row_and_the_two_branch_methods():
    done = run_cli("--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [m["name"] for m in listed] == TABLE1 + ["aepo", "branpo"]
    for m in listed:
        assert set(m) == {"name", "display_name", "paper", "group", "trains", "knobs"}
        assert m["group"] in GROUPS and m["paper"] and m["display_name"]
        assert m["trains"] == (m["name"] not in ("base", "tir", "sft"))
        if m["trains"]:
            assert m["knobs"]["budget"] == 16  # the shared slots
            assert {"policy_loss", "loss_agg_mode", "clip_eps", "beta", "kl_estimator"} <= set(m["knobs"])
    knobs = {m["name"]: m["knobs"] for m in listed}
    assert (knobs["dapo"]["clip_low"], knobs["dapo"]["clip_high"], knobs["dapo"]["loss_agg_mode"]) == (0.2, 0.28, "token-mean")
    assert (knobs["gspo"]["policy_loss"], knobs["gspo"]["clip_low"], knobs["gspo"]["clip_high"]) == ("gspo", 3e-4, 4e-4)
    assert knobs["base"] == {"weights": "prepared", "system_prompt": "none"}


def test_methods_table_has_a_row_per_method_with_paper_and_own_knobs():
    done = run_cli()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "| name | paper | implemented | knobs |"
    rows = {line.split("|")[1].strip(" `"): line for line in lines[2:]}
    assert list(rows) == method_names()
    assert "arXiv 2503.14476" in rows["dapo"] and "clip_high=0.28" in rows["dapo"]
    assert "clip_eps" not in rows["dapo"]  # the shared default is not repeated


class Plain:
    def collect(self, prompts, sample):
        return [sample([p]) for p in prompts]


class WithProblems(Plain):
    prompt_pool = 3

    def collect(self, prompts, sample, problems):
        return [[problems]]

    def setup(self, model, tokenizer, temperature):
        self.seen = (model, tokenizer, temperature)

    def step_stats(self):
        return {"extra_rollouts": 2}


def test_optional_hooks_default_to_what_grpo_does():
    problems = Problems(rows=[], encode=lambda q: [], score=lambda groups, indices: None)
    plain, rich = Plain(), WithProblems()
    assert collect(plain, [[1], [2]], lambda ts: ts, problems) == [[[1]], [[2]]]
    assert collect(rich, [[1]], lambda ts: ts, problems) == [[problems]]
    assert (prompt_pool(plain), prompt_pool(rich)) == (1, 3)
    assert (step_stats(plain), step_stats(rich)) == ({}, {"extra_rollouts": 2})
    setup(plain, "model", "tok", 0.7)  # no hook: nothing to do
    setup(rich, "model", "tok", 0.7)
    assert rich.seen == ("model", "tok", 0.7)


def test_a_method_without_collect_gets_budget_fresh_rollouts_of_each_prompt():
    class Bare:
        cfg = type("Cfg", (), {"budget": 3})()

    groups = collect(Bare(), [[1], [2]], lambda ts: ts, None)
    assert [[t.prompt_ids for t in g] for g in groups] == [[[1]] * 3, [[2]] * 3]
    assert all(t.kind == "parent" for g in groups for t in g)


def test_backends_read_a_methods_facts_from_its_registration():
    # what the verl backend and cbpo.cost ask instead of a table of method names
    assert get_method("opd").distilled and not get_method("grpo").distilled
    assert get_method("oc_grpo").off_context_credit and not get_method("cbpo").off_context_credit
    assert callable(get_method("oc_grpo").off_context)  # OC-GRPO's own hook, not overwritten by the fact
    rpp = get_method("reinforce_pp")
    assert verl_estimator(rpp, rpp.config()) == "reinforce_plus_plus"
    assert verl_estimator(rpp, rpp.config(baseline=True)) == "reinforce_plus_plus_baseline"
    assert [verl_estimator(get_method(m), get_method(m).config()) for m in ("grpo", "gspo", "dapo", "cbpo", "arpo")] \
        == ["grpo", "grpo", "grpo", None, None]


def test_a_method_is_its_config_and_its_module(tmp_path, monkeypatch):
    # the registry finds baselines/<name>.py from configs/method/<name>.yaml; a config whose
    # module registers nothing under its name is named, as is an unknown method
    import cbpo.registry as registry

    assert set(method_names()) == {p.stem for p in registry.METHOD_CONFIGS.glob("*.yaml")}
    with pytest.raises(KeyError, match="unknown method 'nope'"):
        get_method("nope")
    (tmp_path / "grpo.yaml").write_text("name: grpo\n")
    (tmp_path / "training_free.yaml").write_text("name: training_free\n")
    monkeypatch.setattr(registry, "METHOD_CONFIGS", tmp_path)
    registry._method_names.cache_clear()
    try:
        assert method_names() == ["grpo", "training_free"]
        with pytest.raises(KeyError, match=r"baselines/training_free.py registers no @register_method\('training_free'\)"):
            get_method("training_free")
    finally:
        monkeypatch.undo()
        registry._method_names.cache_clear()
