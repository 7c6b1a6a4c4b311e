"""The configuration schema (cbpo/schema.py): every option exists under every preset, a bad
type, range or key stops the entry points naming the key before anything is written, and each
method setting is read from one place."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cbpo import schema
from cbpo.objective import ObjectiveConfig
from cbpo.registry import build_method

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
PRESETS = ("smoke", "tiny", "paper")


def composed(*overrides):
    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        return compose("config", overrides=list(overrides))


def entry(module, *overrides, cwd):
    return subprocess.run([sys.executable, "-m", module, *overrides], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=120)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_option_can_be_overridden_under_every_preset(preset):
    cfg = composed(f"preset={preset}", "rl.dump_rollouts=true", "rl.agent.tool_workers=3", "evaluation.limit=7",
                   "tools_cfg.search_backend=bm25", "wandb.name=x", "method.clip_high=0.28", "method.loss_agg_mode=token-mean")
    schema.validate(cfg)
    assert cfg.rl.dump_rollouts is True and cfg.rl.agent.tool_workers == 3 and cfg.evaluation.limit == 7
    assert schema.settings(cfg, "rl").agent.tool_workers == 3
    assert build_method(cfg, vocab_size=100).cfg.objective() == ObjectiveConfig(
        clip_high=0.28, loss_agg_mode="token-mean", beta=cfg.method.beta)


@pytest.mark.parametrize("preset", ["tiny", "paper"])
def test_dump_rollouts_is_accepted_by_the_entry_point(tmp_path, preset):
    # --cfg job composes and prints the config without running the job.
    out = entry("cbpo.train", "--cfg", "job", f"preset={preset}", "rl.dump_rollouts=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "dump_rollouts: true" in out.stdout


@pytest.mark.parametrize("method", ["cbpo", "grpo"])
def test_method_beta_reaches_the_objective_over_the_preset(method):
    # The tiny preset sets method.beta: 0.0 after the method group; the command line still wins.
    assert build_method(composed("preset=tiny", f"method={method}"), 100).cfg.objective().beta == 0.0
    built = build_method(composed("preset=tiny", f"method={method}", "method.beta=0.5"), 100)
    assert built.name == method and built.cfg.objective().beta == 0.5
    assert build_method(composed("preset=paper", f"method={method}"), 100).cfg.objective() == ObjectiveConfig()


def test_the_engines_top_k_is_cbpos_method_top_k_only():
    cfg = composed("method.top_k=4")
    assert build_method(cfg, 100).cfg.top_k == 4
    assert "top_k" not in cfg.rl and "top_k_entropy" not in cfg.rl


@pytest.mark.parametrize(
    "module,override,key",
    [
        ("cbpo.train", "rl.steps=abc", "rl.steps"),
        ("cbpo.train", "rl.steps=0", "rl.steps"),
        ("cbpo.train", "rl.steps=-5", "rl.steps"),
        ("cbpo.train", "rollout.budget=0", "rollout.budget"),
        ("cbpo.train", "rl.checkpoint_every=0", "rl.checkpoint_every"),
        ("cbpo.train", "rl.micro_batch_size=0", "rl.micro_batch_size"),
        ("cbpo.train", "sft.batch_size=0", "sft.batch_size"),
        ("cbpo.train", "rl.problems_per_step=0", "rl.problems_per_step"),
        ("cbpo.train", "rl.temperature=abc", "rl.temperature"),
        ("eval.run", "evaluation.limit=abc", "evaluation.limit"),
    ],
)
def test_a_bad_setting_stops_the_entry_point_naming_its_key(tmp_path, module, override, key):
    # Range errors are found by the validation the job runs first; zero steps or rollouts never
    # reach training, so no DONE.json is written.
    stage = ["stage=sft"] if override.startswith("sft.") else []
    out = entry(module, override, *stage, cwd=tmp_path)
    assert out.returncode != 0
    assert key in out.stderr
    assert not list(tmp_path.rglob("DONE.json"))


@pytest.mark.parametrize(
    "override,key",
    [
        ("sft.steps=0", "sft.steps"),
        ("sft.micro_batches=0", "sft.micro_batches"),
        ("sft.checkpoint_every=0", "sft.checkpoint_every"),
        ("sft.lr=fast", "sft.lr"),
        ("evaluation.limit=0", "evaluation.limit"),
        ("evaluation.n_samples=0", "evaluation.n_samples"),
        ("evaluation.batch_size=0", "evaluation.batch_size"),
        ("evaluation.temperature=abc", "evaluation.temperature"),
        ("rollout.n0=0", "rollout.n0"),
        ("scan.w=0", "scan.w"),
        ("tools_cfg.search_k=0", "tools_cfg.search_k"),
        ("wandb.mode=loud", "wandb.mode"),
        ("rl.agent.max_tool_calls=-1", "rl.agent.max_tool_calls"),
        ("rl.async_training=fully", "rl.async_training"),
        ("verl.async_rollout_gpus=0", "verl.async_rollout_gpus"),
        ("rl.agent.max_new_tokens=abc", "rl.agent.max_new_tokens"),
        ("+rl.warp=1", "rl.warp"),
        ("method.beta=-1", "method.beta"),
        ("method.eta=5", "method.eta"),
        ("method.loss_agg_mode=sum", "method.loss_agg_mode"),
        ("method.top_k=0", "method.top_k"),
    ],
)
def test_every_section_names_a_bad_key(override, key):
    # What the entry points run before the job (composition, then validate), in-process.
    with pytest.raises(Exception, match=re.escape(key)):
        schema.validate(composed(override))


def test_a_moved_setting_points_at_the_method(tmp_path):
    out = entry("cbpo.train", "rl.beta=0.5", cwd=tmp_path)
    assert out.returncode != 0 and "method.beta" in out.stderr
    for old, new in [("rl.clip_eps", "method.clip_eps"), ("rl.kl_estimator", "method.kl_estimator"),
                     ("+rl.top_k_entropy", "method.top_k")]:
        with pytest.raises(ValueError, match=new):
            schema.refuse_moved([f"{old}=3"])
    schema.refuse_moved(["method.beta=0.5", "rl.steps=3"])


def test_a_range_error_names_the_nested_key():
    with pytest.raises(ValueError, match=r"^rl\.agent\.max_new_tokens must be >= 1, got 0$"):
        schema.build(schema.SECTIONS["rl"], {"steps": 3, "agent": {"max_new_tokens": 0}}, "rl")
    with pytest.raises(ValueError, match=r"^method\.n0 must satisfy"):
        schema.method_config(composed("method.n0=20"))


@pytest.mark.parametrize("preset, expected", [("smoke", "none"), ("tiny", "none"), ("paper", "default")])
def test_a_presets_value_beats_the_root_configs(preset, expected):
    # config.yaml's own values are defaults: a preset that sets system_prompt is what runs.
    schema.register()
    with initialize_config_dir(str(Path(__file__).resolve().parents[2] / "configs"), version_base=None):
        assert compose("config", [f"preset={preset}"]).system_prompt == expected


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("method", ["cbpo", "arpo", "aepo", "tree_grpo"])
def test_the_run_seed_drives_every_random_choice_of_training(preset, method):
    # Two seeds of a study must be two different runs, not one run copied: SFT batches, RL
    # problem order and sampling, and a method's own draws all follow the run's seed.
    cfg = composed(f"preset={preset}", f"method={method}", "seed=3")
    assert cfg.sft.seed == 3 and cfg.rl.seed == 3
    assert cfg.method.get("seed", 3) == 3
    assert composed(f"preset={preset}", "seed=3", "rl.seed=5").rl.seed == 5  # still a setting of its own


def test_backends_register_their_launcher_and_their_own_sections():
    # the core names backend packages only; each registers itself when the schema loads it
    assert schema.sections()["verl"].__module__ == "cbpo.backends.verl.config"
    assert schema.backend_launcher("local").__module__ == "cbpo.backends.local.launch"
    assert schema.backend_launcher("verl").__name__ == "run_verl"
    with pytest.raises(ValueError, match="backend must be 'local' or 'verl', got 'gpu'"):
        schema.backend_launcher("gpu")
