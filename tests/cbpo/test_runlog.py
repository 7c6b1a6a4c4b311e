"""A run's records (cbpo/runlog.py): atomic checkpoints, the newest whole one found; metrics.jsonl on
resume (a write torn by a kill is dropped, other damage is named); the W&B run."""
import json

import pytest

from cbpo.runlog import MetricsLog, latest_checkpoint, save_checkpoint
from cbpo.runs import DONE


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("torn", ['{"step": 3, "rew', '{"step": 3, "reward": 0.5}\n{"st\n'])
def test_torn_last_line_is_dropped_on_resume(tmp_path, torn):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n' + torn)
    MetricsLog(path).truncate_after(2)
    assert _records(path) == [{"step": 1}, {"step": 2}]
    MetricsLog(path).log({"step": 3})
    assert _records(path)[-1] == {"step": 3}


def test_bad_line_before_the_last_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        MetricsLog(path).truncate_after(2)
    assert path.read_text() == '{"step": 1}\nnot json\n{"step": 2}\n'


def test_checkpoints_are_atomic_and_latest_wins(tmp_path, model, tokenizer):
    for step in (2, 10):
        save_checkpoint(tmp_path / f"step_{step:06d}", model, tokenizer, {"step": step})
    (tmp_path / "step_000020").mkdir()  # an interrupted save: no DONE marker
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step_000010" and (latest / DONE).is_file()
    assert not list(tmp_path.glob(".*tmp"))


def test_a_run_named_by_a_long_override_still_opens_its_wandb_run(tmp_path, monkeypatch):
    # Found on real verl: OPD's run named by method.teacher=PATH is an 86-character tag, and W&B
    # refuses any tag over 64 characters, and with it the run.
    import wandb

    from cbpo.runlog import open_wandb, wandb_tag

    seen = {}
    monkeypatch.setattr(wandb, "init", lambda **kwargs: seen.update(kwargs))
    long = "opd-teacher_tmp_pytest-of-root_pytest-14_verl_cpu0_runs_smoke_tiny_mix_seed0_sft_final"
    open_wandb({"enabled": True, "tags": [long, "smoke"]}, tmp_path)
    assert [len(t) for t in seen["tags"]] == [64, 5] and seen["tags"][0].startswith("opd-teacher_tmp")
    assert wandb_tag(long) != wandb_tag(long.replace("14", "15")) and wandb_tag("smoke") == "smoke"
