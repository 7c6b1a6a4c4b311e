"""A tokenizer trained on a tool trace and a tiny causal LM over it, for the tests of the pieces
that train (chat encoding, log-probs, run records, the local backend's loops)."""
import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from cbpo.models import train_tokenizer

    texts = ["<think>add</think><python>print(1 + 2)</python><result>\n3\n</result><answer>The answer is \\boxed{3}</answer>", "What is 1 plus 2?"] * 20
    return train_tokenizer(texts, 300)


@pytest.fixture()
def model(tokenizer, tiny_causal_lm):
    return tiny_causal_lm(tokenizer)
