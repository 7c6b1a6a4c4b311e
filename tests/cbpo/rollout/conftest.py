"""Offline fixtures for the rollout tests: a byte-level BPE tokenizer trained on a few strings
(tool tags as single special tokens) and a tiny random Qwen3-style model."""
from __future__ import annotations

import os

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIAL_TOKENS = [
    "<pad>", "<|im_start|>", "<|im_end|>",
    "<python>", "</python>", "<search>", "</search>",
    "<result>", "</result>", "<answer>", "</answer>",
]  # fmt: skip

TRAINING_TEXT = [
    "What is 12 + 7 * 3? Let me compute it with Python.",
    "<python>print(12 + 7 * 3)</python><result>\n33\n</result><answer>\\boxed{33}</answer>",
    "Who wrote the novel? <search>author of the novel</search> The answer is in the passage.",
    "def f(x):\n    return x * 2\nprint(f(21))",
    "xyz <code>x = 1</code> result: 1",
]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>")


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def tiny_model(vocab_size: int, seed: int = 0) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).float().eval()


@pytest.fixture(scope="session")
def model(tokenizer) -> Qwen3ForCausalLM:
    return tiny_model(len(tokenizer))


@pytest.fixture
def boost(model):
    """``boost(token_ids, amount)`` adds ``amount`` to those tokens' logits so the random model
    emits them often; undone after the test."""
    handles = []

    def add(token_ids: list[int], amount: float) -> None:
        bias = torch.zeros(model.config.vocab_size)
        bias[token_ids] = amount
        handles.append(model.lm_head.register_forward_hook(lambda _m, _i, out: out + bias))

    yield add
    for handle in handles:
        handle.remove()
