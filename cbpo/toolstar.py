"""Tool-Star's SFT traces (dongguanting/Tool-Star-SFT-54K) as the suite's SFT rows.

The published file is LLaMA-Factory's default alpaca layout (Tool-Star's ``dataset_info.json``
names ``final_sft_edition9`` by file name only, so no column mapping applies): a JSON list (or
JSON lines) of ``{"instruction", "input", "output"}``. The question is ``input`` when it is
non-blank, else ``instruction`` (alpaca's rule: the instruction is the task when there is no
input). ``output`` is the whole response in the suite's own tag format (``cbpo.chat``):
``<think>``, ``<python>``/``<search>`` calls each answered by ``<result>…</result>`` (the tool
output, which gets no loss), and a final ``<answer>…\\boxed{…}</answer>``.

A row becomes ``{"id", "question", "answer", "domain", "trace"}`` (the task format of
``cbpo.data.read_rows``): ``id`` its position in the upstream file, ``answer`` what the
evaluation's extractor reads from the trace (``eval.verifiers.extract``), ``domain`` ``search`` when the
trace searches, else ``math`` (SFT does not score, the field only keeps the row readable), and
the observations sanitised as the agent loop sanitises tool output. A row that does not fit is
never dropped silently: ``convert`` returns it in ``rejected`` with its id and the reason.

    python -m cbpo.toolstar IN.json OUT.jsonl [--report REPORT.json] [--tokenizer MODEL_DIR]

With ``--tokenizer`` (the backbone's folder, e.g. ``models/qwen3-1.7b``) the report also gives
the converted traces' token lengths as SFT encodes them (``trace_lengths``): the numbers that set
``sft.max_len``, the agent's caps and verl's response length (configs/preset/paper.yaml).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from cbpo.chat import (TOOL_NAMES, TOOL_TAGS, build_prompt, encode_trace, resolve_system_prompt,
                       sanitise_observation, special_tokens, split_observations)
from cbpo.data import write_atomically, write_jsonl

_TAG = re.compile("|".join(re.escape(t) for pair in TOOL_TAGS.values() for t in pair))
_OPENING = {pair[0]: name for name, pair in TOOL_TAGS.items()}
_CLOSING = {pair[1]: name for name, pair in TOOL_TAGS.items()}
# The suite's tags and ChatML markers: tool output holding one would end the observation early
# or fake a turn, as in a rollout (the agent loop adds the tokenizer's own specials as well).
_RESERVED = re.compile("|".join(map(re.escape, sorted(special_tokens(), key=len, reverse=True))))


@dataclass
class Conversion:
    rows: list[dict] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)  # {"id", "reason"}, in file order
    trace_lengths: dict | None = None  # ``trace_lengths(rows, ...)`` where a tokenizer was given

    def report(self, source: str) -> dict:
        """What ``convert`` kept and refused, with every refused row named."""
        return {
            "source": source,
            "converted": len(self.rows),
            "rejected": len(self.rejected),
            "reasons": dict(Counter(r["reason"] for r in self.rejected).most_common()),
            "rejected_rows": self.rejected,
            "domains": dict(Counter(r["domain"] for r in self.rows)),
            **({"trace_lengths": self.trace_lengths} if self.trace_lengths is not None else {}),
        }


class Unconvertible(ValueError):
    """A row the converter refuses; the message is the reason."""


def read_alpaca(path: str | Path) -> Iterator[Any]:
    """The records of an alpaca file: a JSON list, or one JSON object per line."""
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        records = json.loads(text)
        yield from records
        return
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None


def _string(record: dict, key: str) -> str:
    value = record.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Unconvertible(f"field {key!r} is a {type(value).__name__}, not a string")
    return value


def trace_of(output: str) -> tuple[str, str]:
    """``(trace, domain)`` of an alpaca ``output``; Unconvertible names what does not fit.

    The checks are the agent loop's grammar: tags never nest, every tool call is answered by
    one observation and every observation answers a call, and the response ends with its
    closed ``<answer>`` block."""
    pieces: list[str] = []
    inside: str | None = None  # the tag whose block is open
    awaiting: str | None = None  # a call whose observation has not come yet
    last = 0
    tools: Counter = Counter()
    answered = False
    for m in _TAG.finditer(output):
        tag = m.group(0)
        if inside == "result":
            if tag != TOOL_TAGS["result"][1]:
                continue  # tool output may quote a tag: it is sanitised below, not parsed
            pieces.append(sanitise_observation(output[last:m.start()], _RESERVED) + tag)
            inside, last = None, m.end()
            continue
        text = output[last:m.start()]
        last = m.end()
        if answered:
            raise Unconvertible(f"{tag} after the final </answer>")
        pieces.append(text)
        if tag in _OPENING:
            name = _OPENING[tag]
            if inside is not None:
                raise Unconvertible(f"{tag} inside <{inside}>")
            if awaiting is not None and name != "result":
                raise Unconvertible(f"<{awaiting}> call without a <result>")
            if name == "result" and awaiting is None:
                raise Unconvertible("<result> without a tool call before it")
            inside, awaiting = name, None
        else:
            name = _CLOSING[tag]
            if inside != name:
                raise Unconvertible(f"{tag} closes nothing")
            inside = None
            if name in TOOL_NAMES:
                awaiting = name
                tools[name] += 1
            answered = name == "answer"
        pieces.append(tag)
    tail = output[last:]
    if inside is not None:
        raise Unconvertible(f"<{inside}> never closed")
    if awaiting is not None:
        raise Unconvertible(f"<{awaiting}> call without a <result>")
    if not answered:
        raise Unconvertible("no final <answer> block")
    if tail.strip():
        raise Unconvertible("text after the final </answer>")
    return "".join(pieces).strip(), "search" if tools["search"] else "math"


def convert(records: Iterable[Any]) -> Conversion:
    """Every record converted or named in ``rejected``; ids are positions in the input."""
    from eval.verifiers.extract import extract_answer  # the evaluation's reading of an answer

    out = Conversion()
    for n, record in enumerate(records):
        try:
            if not isinstance(record, dict):
                raise Unconvertible(f"a {type(record).__name__}, not an object")
            question = _string(record, "input").strip() or _string(record, "instruction").strip()
            if not question:
                raise Unconvertible("no question (instruction and input are empty)")
            trace, domain = trace_of(_string(record, "output"))
            answer = extract_answer(trace)
            if answer is None:
                raise Unconvertible("the <answer> block holds no answer")
        except Unconvertible as e:
            out.rejected.append({"id": str(n), "reason": str(e)})
            continue
        out.rows.append({"id": str(n), "question": question, "answer": answer, "domain": domain, "trace": trace})
    return out


def trace_lengths(rows: Iterable[dict], tokenizer, system_prompt: str | None) -> dict:
    """Median, p99 and max token counts of the rows as SFT trains on them (``encode_trace``):
    the whole example, its prompt, the model's own tokens, and each tool observation."""
    import numpy as np

    counts: dict[str, list[int]] = {"example": [], "prompt": [], "model_tokens": [], "observation": []}
    for row in rows:
        ids, mask = encode_trace(tokenizer, row["question"], row["trace"], system_prompt)
        counts["example"].append(len(ids))
        counts["prompt"].append(len(build_prompt(tokenizer, row["question"], system_prompt)))
        counts["model_tokens"].append(sum(mask))
        counts["observation"] += [len(tokenizer(text, add_special_tokens=False)["input_ids"])
                                  for text, is_model in split_observations(row["trace"]) if not is_model]
    return {name: {"median": float(np.median(c)), "p99": float(np.percentile(c, 99)), "max": int(max(c)), "n": len(c)}
            for name, c in counts.items() if c}


def convert_file(source: str | Path, out: str | Path, report: str | Path | None = None, tokenizer=None,
                 system_prompt: str | None = None) -> Conversion:
    """``source`` (alpaca) -> ``out`` (task-format JSONL) and the report beside it
    (``<out>.report.json`` unless ``report`` says). Both are written atomically."""
    out = Path(out)
    result = convert(read_alpaca(source))
    if not result.rows:
        raise ValueError(f"{source}: no row could be converted ({result.report(str(source))['reasons']})")
    write_jsonl(out, result.rows)
    report = Path(report) if report else out.with_name(out.stem + ".report.json")
    if tokenizer is not None:
        result.trace_lengths = trace_lengths(result.rows, tokenizer, system_prompt)
    write_atomically(report, json.dumps(result.report(str(source)), indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cbpo.toolstar", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="Tool-Star-SFT-54K's alpaca JSON (or JSON lines)")
    parser.add_argument("out", help="the suite's SFT file (task-format JSONL)")
    parser.add_argument("--report", default=None, help="default: <out stem>.report.json beside it")
    parser.add_argument("--tokenizer", default=None,
                        help="a tokenizer folder (the backbone's): adds the traces' token lengths to the report")
    parser.add_argument("--system-prompt", default="default",
                        help='the study\'s system_prompt ("default", "none" or the text), as the lengths count it')
    args = parser.parse_args(argv)
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    system_prompt = resolve_system_prompt(args.system_prompt)
    result = convert_file(args.source, args.out, args.report, tokenizer, system_prompt)
    print(f"{args.out}: {len(result.rows)} rows; {len(result.rejected)} rejected"
          + "".join(f"\n  {n} x {reason}" for reason, n in Counter(r["reason"] for r in result.rejected).most_common()))
    for name, st in (result.trace_lengths or {}).items():
        print(f"  {name} tokens: median {st['median']:.0f}, p99 {st['p99']:.0f}, max {st['max']} ({st['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
