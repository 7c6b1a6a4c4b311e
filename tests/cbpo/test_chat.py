from __future__ import annotations

import jinja2
import pytest

from cbpo import chat
from cbpo.models import train_tokenizer

TRACE = (
    "<think>Add.</think><python>print(12 + 30)</python><result>\n42\n</result>"
    "<answer>The answer is \\boxed{42}</answer>"
)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["What is 12 plus 30?", TRACE] * 20, bpe_vocab=300)


def test_tool_tags_and_special_tokens():
    assert chat.TOOL_TAGS["python"] == ("<python>", "</python>")
    assert chat.TOOL_TAGS["search"] == ("<search>", "</search>")
    assert chat.TOOL_TAGS["result"] == ("<result>", "</result>")
    assert chat.TOOL_TAGS["answer"] == ("<answer>", "</answer>")
    assert chat.TOOL_TAGS["think"] == ("<think>", "</think>")
    specials = chat.special_tokens()
    assert len(specials) == len(set(specials))
    assert {"<|im_start|>", "<|im_end|>", chat.PAD_TOKEN, "<python>", "</result>"} <= set(specials)
    for opening, closing in chat.TOOL_TAGS.values():
        assert opening in chat.SYSTEM_PROMPT and closing in chat.SYSTEM_PROMPT
    assert "\\boxed{" in chat.SYSTEM_PROMPT


def test_fallback_renders_exactly_like_the_template():
    msgs = chat.messages("What is 2 + 2?")
    for add in (True, False):
        template = jinja2.Template(chat.CHATML_TEMPLATE)
        rendered = template.render(messages=msgs, add_generation_prompt=add)
        assert rendered == chat.chatml(msgs, add_generation_prompt=add)
    assert chat.chatml(msgs).endswith("<|im_start|>assistant\n")
    assert chat.chatml(chat.messages("q", system_prompt=None)).startswith("<|im_start|>user\nq")


def test_build_prompt_uses_template_or_fallback(tokenizer):
    question = "What is 12 plus 30?"
    expected = chat.chatml(chat.messages(question))
    ids = chat.build_prompt(tokenizer, question)
    assert tokenizer.decode(ids) == expected
    header = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[-len(header):] == header

    tokenizer.chat_template = None
    try:
        assert chat.build_prompt(tokenizer, question) == ids
    finally:
        tokenizer.chat_template = chat.CHATML_TEMPLATE
    custom = chat.build_prompt(tokenizer, question, system_prompt="Be brief.")
    assert tokenizer.decode(custom).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_format_observation():
    assert chat.format_observation("42\n") == "<result>\n42\n</result>"
    assert chat.format_observation("42") == "<result>\n42\n</result>"
    assert chat.format_observation("") == "<result>\n\n</result>"


def test_split_observations_marks_result_blocks():
    response = TRACE + "<python>print(1)</python><result>\n1\n</result>tail"
    pieces = chat.split_observations(response)
    assert "".join(text for text, _ in pieces) == response
    assert [text for text, is_model in pieces if not is_model] == [
        "<result>\n42\n</result>", "<result>\n1\n</result>"
    ]
    assert pieces[-1] == ("tail", True)
    assert chat.split_observations("no tools") == [("no tools", True)]
    assert chat.split_observations("") == []
