"""Evaluation searches through the shared cache the paper preset uses (a search backend plus
``tools_cfg.search_cache``): a real model folder on real HotpotQA rows, bm25 over a small
corpus, and a second evaluation that finds every query cached."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cbpo.data import shared_data_dir

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
pytestmark = pytest.mark.skipif(not (shared_data_dir() / "benchmarks" / "hotpotqa" / "test.jsonl").is_file(),
                                reason="shared benchmark data absent")

# Not benchmark questions: the model learns to search first whatever it is asked.
QUESTIONS = ["Which city is the capital of France?", "Who wrote the novel Dune?", "When was the Eiffel Tower built?",
             "What river flows through Cairo?", "Who directed Alien?", "Which band released Abbey Road?"]
TRACE = "<search>capital of France</search><result>\nPage 1: Paris\n</result><answer>\\boxed{Paris}</answer>"
CORPUS = [
    {"id": "1", "title": "Paris", "text": "Paris is the capital and largest city of France, on the Seine."},
    {"id": "2", "title": "Lyon", "text": "Lyon is the third-largest city of France, at the Rhone and Saone."},
    {"id": "3", "title": "Berlin", "text": "Berlin is the capital and largest city of Germany."},
]


@pytest.fixture(scope="module")
def searcher(tmp_path_factory):
    """A tiny model folder that, greedy, answers every question with one search first: 60
    steps of next-token training on one trace, so the test spends seconds, not an SFT run."""
    import torch

    from cbpo.models import load_model, prepare_model
    from cbpo.chat import encode_trace
    from cbpo.runlog import save_checkpoint

    work = tmp_path_factory.mktemp("search-eval")
    prepare_model("tiny", work / "prepared", corpus_texts=[*QUESTIONS, TRACE] * 20, seed=0)
    model, tokenizer = load_model(work / "prepared")
    encoded = [encode_trace(tokenizer, q, TRACE, system_prompt=None) for q in QUESTIONS]
    width = max(len(seq) for seq, _ in encoded)
    ids = torch.tensor([seq + [tokenizer.pad_token_id] * (width - len(seq)) for seq, _ in encoded])
    trained = torch.tensor([mask + [0] * (width - len(mask)) for _, mask in encoded])[:, 1:] == 1
    attention = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq, _ in encoded])
    torch.manual_seed(0)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        logits = model(ids, attention_mask=attention).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits[trained], ids[:, 1:][trained])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    save_checkpoint(work / "model", model, tokenizer, {"step": "final"})
    (work / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    return work


def evaluate(work: Path, eval_out: str) -> dict:
    command = [sys.executable, "-m", "eval.run", "preset=smoke", "benchmark=hotpotqa", "evaluation.limit=4",
               "system_prompt=none", f"checkpoint={work / 'model'}", f"eval_out={eval_out}",
               "rl.agent.max_new_tokens=48", "rl.agent.max_total_tokens=1024", "rl.agent.max_obs_tokens=64",
               "tools_cfg.search_backend=bm25", f"++tools_cfg.search_options.corpus={work / 'corpus.jsonl'}",
               f"tools_cfg.search_cache={work / 'cache' / 'search_bm25.sqlite'}"]
    done = subprocess.run(command, cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads((work / eval_out / "summary.json").read_text())["search"]


def test_second_evaluation_finds_every_search_in_the_shared_cache(searcher):
    first = evaluate(searcher, "first")
    assert first["backend"] == "bm25" and first["cache"].endswith("search_bm25.sqlite")
    assert first["search_calls"] >= 4 and first["search_cache_misses"] >= 1
    assert first["search_cache_hits"] + first["search_cache_misses"] == first["search_calls"]
    second = evaluate(searcher, "second")  # another output folder: the samples are made again
    assert second["search_calls"] == first["search_calls"]
    assert second["search_cache_hits"] == second["search_calls"] and second["search_cache_misses"] == 0
