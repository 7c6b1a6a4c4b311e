"""The training entry point resumes only a run of the same configuration."""
from omegaconf import OmegaConf

from cbpo.train import _forget_stale_run


def test_changed_configuration_starts_afresh_same_one_resumes(tmp_path):
    out = tmp_path / "run"
    cfg = OmegaConf.create({"stage": "sft", "init": str(tmp_path / "none"), "sft": {"steps": 10}})
    _forget_stale_run(out, cfg)
    (out / "step_000005").mkdir()
    (out / "metrics.jsonl").write_text('{"step": 5}\n')
    _forget_stale_run(out, cfg)  # same config: checkpoints stay for resuming
    assert (out / "step_000005").is_dir() and (out / "metrics.jsonl").is_file()
    cfg.sft.steps = 20
    _forget_stale_run(out, cfg)  # changed config: nothing of the old run is resumed
    assert not (out / "step_000005").exists() and not (out / "metrics.jsonl").exists()
