"""Sampling speed of the rollout engine against a plain ``model.generate`` loop on the same
batch, for a tiny random Qwen3-style model (hidden 128, 4 layers, vocab 600), 128 new tokens.

Also prints: the engine with rows finishing early (10 stop ids, ~1/60 per token) under three
policies for finished rows; and 16 branch continuations of ~150-token prefixes, all distinct
or 4 prefixes 4 times each (identical contexts share one prefill), prefill alone and with 96
new tokens. The engine also computes log-probs and top-10 entropies; generate does not.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_engine.py
"""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cbpo.rollout.engine import HFEngine

# No EOS: every row runs to its cap in both samplers, so they generate the same token count
# (rows finishing early are measured separately, with explicit stop ids).
VOCAB, NEW_TOKENS, PAD = 600, 128, 0


def build_model() -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


def prompts(batch: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 61, (batch,), generator=g)
    return [torch.randint(2, VOCAB, (int(n),), generator=g).tolist() for n in lengths]


def best_of(runs: int, fns: dict) -> dict[str, tuple[float, int]]:
    """Fastest of ``runs`` interleaved timings of each fn (returning its token count): the
    machine is shared, so interleaving and taking the best keeps the comparison fair."""
    best: dict[str, tuple[float, int]] = {}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            n_tokens = fn()
            seconds = time.perf_counter() - start
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, n_tokens)
    return best


def run_engine(engine: HFEngine, contexts, stop_ids=frozenset(), new_tokens=NEW_TOKENS) -> int:
    return sum(len(s.token_ids) for s in engine.sample(contexts, new_tokens, stop_ids))


def run_generate(model, contexts) -> int:
    width = max(map(len, contexts))
    ids = torch.tensor([[PAD] * (width - len(c)) + c for c in contexts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(c) for c in contexts])[:, None]).long()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            top_k=0,
            top_p=1.0,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=PAD,
            eos_token_id=None,
        )
    return out[:, width:].numel()


def main() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    runs = int(os.environ.get("BENCH_RUNS", "3"))
    model = build_model()
    tokenizer = SimpleNamespace(eos_token_id=None, pad_token_id=PAD)  # no stop strings: ids suffice
    engine = HFEngine(model, tokenizer, generator=0)
    print(f"threads={torch.get_num_threads()} params={sum(p.numel() for p in model.parameters()) / 1e6:.2f}M "
          f"best of {runs} interleaved runs")
    run_engine(engine, prompts(8), new_tokens=8)  # warm-up

    for batch in (16, 128):
        contexts = prompts(batch)
        timings = best_of(runs, {
            "engine": lambda: run_engine(engine, contexts),
            "generate": lambda: run_generate(model, contexts),
        })
        for name, (seconds, n) in timings.items():
            print(f"batch {batch:3d} {name:8s}: {n:6d} tokens in {seconds:6.2f} s = {n / seconds:7.0f} tok/s")

    contexts = prompts(128, seed=1)
    stop_ids = frozenset(range(2, 12))

    def with_fraction(fraction):
        policy = HFEngine(model, tokenizer, compact_fraction=fraction)

        def run():
            policy.generator.manual_seed(1)  # same seed; the batch order (hence draws) differs
            return run_engine(policy, contexts, stop_ids)

        return run

    policies = {"drop at every finish": 1e-9, "drop at >=25% finished": 0.25, "never drop": 2.0}
    timings = best_of(runs, {label: with_fraction(f) for label, f in policies.items()})
    for label, (seconds, n) in timings.items():
        print(f"early stops, batch 128, {label:22s}: {n:6d} tokens in {seconds:5.2f} s "
              f"= {n / seconds:6.0f} tok/s")

    # 16 branch continuations of ~150-token prefixes (prompt + 110 response tokens), either all
    # different or 4 parents' prefixes 4 times each (identical contexts share one prefill).
    g = torch.Generator().manual_seed(2)
    distinct = [p + torch.randint(2, VOCAB, (110,), generator=g).tolist() for p in prompts(16, seed=2)]
    shared = [p for p in distinct[:4] for _ in range(4)]
    timings = best_of(runs, {
        f"{label} {what}": (lambda c=c, k=k: run_engine(engine, c, new_tokens=k))
        for label, c in (("16 distinct", distinct), ("4 x 4 shared", shared))
        for what, k in (("prefill+1", 1), ("96 new", 96))
    })
    for label, (seconds, n) in timings.items():
        print(f"branches, {label:24s}: {seconds:6.3f} s ({n} tokens)")


if __name__ == "__main__":
    main()
