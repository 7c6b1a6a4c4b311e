"""The judge is pinned by settings: ``judge.*`` over the benchmark's block, in the samples'
identity, and recorded in the summary by model, endpoint, temperature and prompt hash."""
import hashlib
from pathlib import Path

from hydra import compose, initialize_config_dir

from cbpo import schema
from eval.benchmarks import benchmark_config
from eval.verifiers.judge import LLMJudge
from eval.run import judge_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def cfg(*overrides):
    schema.register()
    with initialize_config_dir(str(CONFIGS), version_base=None):
        return compose("config", ["preset=smoke", *overrides])


def test_judge_settings_override_the_benchmarks_block():
    block = benchmark_config("webwalker")["judge"]
    assert judge_config(cfg("benchmark=webwalker")) == block
    pinned = judge_config(cfg("benchmark=webwalker", "judge.model=judge-7b", "judge.base_url=http://judge:8000/v1",
                              "judge.temperature=0.5"))
    assert pinned == {**block, "model": "judge-7b", "base_url": "http://judge:8000/v1", "temperature": 0.5}
    assert judge_config(cfg("benchmark=hotpotqa", "judge.model=judge-7b")) is None  # F1: no judge


def test_the_summary_names_the_prompt_by_its_hash(tmp_path):
    block = benchmark_config("webwalker")["judge"]
    judge = LLMJudge("http://judge:8000/v1", "judge-7b", block["prompt"], tmp_path / "verdicts.sqlite", temperature=0.0)
    try:
        assert judge.settings() == {"model": "judge-7b", "url": "http://judge:8000/v1/chat/completions", "temperature": 0.0,
                                    "max_tokens": None, "prompt_sha256": hashlib.sha256(block["prompt"].encode()).hexdigest()}
    finally:
        judge.close()
