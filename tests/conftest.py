"""Fixtures shared across the test packages, and the engine tier's skip."""
import importlib.util

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


@pytest.fixture(scope="session")
def tiny_causal_lm():
    """``tiny_causal_lm(tokenizer)``: a seeded one-layer Qwen3 over the tokenizer's vocabulary,
    small enough for trainer and method tests to run RL steps in well under a second."""

    def make(tokenizer):
        torch.manual_seed(0)
        cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                          pad_token_id=tokenizer.pad_token_id)
        return Qwen3ForCausalLM(cfg)

    return make


ENGINES = ("vllm", "verl", "ray")


def pytest_collection_modifyitems(config, items):
    """``engines`` tests run the real vLLM, verl and Ray: in .venv-engines (``make test`` runs
    them there), skipped with one line elsewhere."""
    lacking = [m for m in ENGINES if importlib.util.find_spec(m) is None]
    if not lacking:
        return
    skip = pytest.mark.skip(reason=f"engine tier: {', '.join(lacking)} not importable here (make engines builds .venv-engines)")
    for item in items:
        if "engines" in item.keywords:
            item.add_marker(skip)
