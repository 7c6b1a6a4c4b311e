"""The single definition of the tool tags and the prompt format (Tool-Star / ARPO style).

A response interleaves the model's own text with tool observations::

    <think>plan</think><python>print(1 + 2)</python><result>\\n3\\n</result>
    <answer>The answer is \\boxed{3}</answer>

The model writes a call inside ``<python>…</python>`` or ``<search>…</search>``; the rollout
engine stops at the closing tag, runs the tool and appends ``<result>…</result>`` as
observation (non-model) tokens (Sec. 3, Eq. 1 of the CBPO paper). Every method, the engine,
the SFT data and the evaluation take the tags and the prompt from here.
"""
from __future__ import annotations

import re

TOOL_TAGS: dict[str, tuple[str, str]] = {
    "python": ("<python>", "</python>"),
    "search": ("<search>", "</search>"),
    "result": ("<result>", "</result>"),
    "answer": ("<answer>", "</answer>"),
    "think": ("<think>", "</think>"),
}
# Tools the model can call: the closing tag of each is a stop point for generation.
TOOL_NAMES: tuple[str, ...] = ("python", "search")

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
# Tokens with a control meaning (never part of visible text): decoding with
# skip_special_tokens=True drops these but keeps the tool tags.
CONTROL_TOKENS: tuple[str, ...] = (IM_START, IM_END, PAD_TOKEN, BOS_TOKEN)

SYSTEM_PROMPT = (
    "You are a helpful assistant that can use tools. Think briefly inside <think></think>. "
    "To run Python, write code inside <python></python>; to search, write a query inside "
    "<search></search>. Tool output is returned inside <result></result>. Give the final "
    "answer inside <answer></answer> as \\boxed{...}."
)

# ChatML, as used by Qwen3 and SmolLM2; also the template written into the tiny tokenizer.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def resolve_system_prompt(name: str | None) -> str | None:
    """Config value -> system prompt: "default" is ``SYSTEM_PROMPT``, "none" (or null) is no
    system message (the tiny scratch model learns the format from SFT alone), anything else is
    the prompt text itself. Every method and the evaluation use the same value."""
    if name is None or name == "none":
        return None
    return SYSTEM_PROMPT if name == "default" else name


def tag_tokens() -> list[str]:
    """All tool tags (opening and closing), in ``TOOL_TAGS`` order."""
    return [tag for pair in TOOL_TAGS.values() for tag in pair]


def special_tokens() -> list[str]:
    """Every string that must be a single token: ChatML markers, pad, bos and the tool tags."""
    return [*CONTROL_TOKENS, *tag_tokens()]


def messages(question: str, system_prompt: str | None = SYSTEM_PROMPT) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*head, {"role": "user", "content": question}]


def chatml(msgs: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Plain-Python rendering of ``CHATML_TEMPLATE`` for tokenizers that carry no template."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in msgs)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def prompt_text(tokenizer, question: str, system_prompt: str | None = SYSTEM_PROMPT) -> str:
    msgs = messages(question, system_prompt)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return chatml(msgs)


def build_prompt(tokenizer, question: str, system_prompt: str | None = SYSTEM_PROMPT) -> list[int]:
    """Token ids of the chat prompt up to and including the assistant header."""
    # Tokenise the rendered text ourselves: apply_chat_template(tokenize=True) changed its
    # return type across transformers versions; the template already holds any bos it wants.
    text = prompt_text(tokenizer, question, system_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def format_observation(output: str) -> str:
    """Wrap tool output as the observation block appended after a tool call. The agent loop
    passes output through ``sanitise_observation`` first, so the block holds no tag of its own."""
    opening, closing = TOOL_TAGS["result"]
    newline = "" if output.endswith("\n") else "\n"
    return f"{opening}\n{output}{newline}{closing}"


# Zero-width space: it breaks a reserved string without changing what a reader of the rollout
# sees, and no tokenizer has an added token containing it.
_BREAK = "\u200b"
# Lone UTF-16 surrogates (half an emoji in a JSON search result, bytes decoded with
# surrogateescape): the tokenizers refuse to encode them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def reserved_pattern(tokenizer) -> re.Pattern:
    """The strings tool output must not carry verbatim: the tags and ChatML markers defined
    here, the tokenizer's special tokens (end of turn, pad, bos/eos) and its added tokens that
    are markup rather than text (Qwen3's ``<think>``, SmolLM2's ``<|im_end|>`` and
    ``<repo_name>``; not the tiny tokenizer's number chunks). In an observation each would
    become a control token id, close the observation early or fake an answer."""
    markup = (s for s in tokenizer.get_added_vocab() if s.strip() and not s.strip().isalnum())
    strings = {*special_tokens(), *tokenizer.all_special_tokens, *markup}
    # A one-character string cannot be broken; the longest first, so overlaps break the longer.
    ordered = sorted((s for s in strings if len(s) > 1), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered)))


def sanitise_observation(output: str, reserved: re.Pattern) -> str:
    """Tool output made safe to tokenise into an observation: lone surrogates become U+FFFD
    and every ``reserved`` string (``reserved_pattern``) is broken by a zero-width space after
    its first character, so it tokenises as plain text."""
    output = _SURROGATE.sub("\ufffd", output)
    # Repeat: breaking one of two overlapping strings can leave the other whole.
    while reserved.search(output):
        output = reserved.sub(lambda m: m[0][0] + _BREAK + m[0][1:], output)
    return output


# An observation cut at the response's token cap has no closing tag: it runs to the end.
_OBSERVATION = re.compile(
    re.escape(TOOL_TAGS["result"][0]) + r".*?(?:" + re.escape(TOOL_TAGS["result"][1]) + r"|\Z)", re.DOTALL
)


def split_observations(response: str) -> list[tuple[str, bool]]:
    """Split a response into ``(text, is_model)`` pieces: ``<result>…</result>`` blocks (and a
    last ``<result>`` left open by the length cap) are observations (no loss in SFT or RL, no
    answer read from them), everything else was written by the model. Reliable on the agent
    loop's responses because a sanitised observation never contains ``</result>``."""
    pieces: list[tuple[str, bool]] = []
    last = 0
    for match in _OBSERVATION.finditer(response):
        if match.start() > last:
            pieces.append((response[last : match.start()], True))
        pieces.append((match.group(0), False))
        last = match.end()
    if last < len(response):
        pieces.append((response[last:], True))
    return pieces


def encode_trace(tokenizer, question: str, trace: str, system_prompt: str | None = SYSTEM_PROMPT) -> tuple[list[int], list[int]]:
    """Prompt + response ids, and a loss mask that is 1 on the model's own tokens only
    (observations ``<result>…</result>`` and the prompt get no loss). The response ends with
    the end-of-turn token, as generation does."""
    ids = build_prompt(tokenizer, question, system_prompt)
    mask = [0] * len(ids)
    for text, is_model in split_observations(trace):
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [int(is_model)] * len(piece)
    ids.append(tokenizer.eos_token_id)
    mask.append(1)
    return ids, mask
