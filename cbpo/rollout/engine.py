"""Batched sampling over a KV cache for a Hugging Face causal LM: the CPU rollout engine.

Every call takes arbitrary token prefixes (a prompt, or a prompt plus a partial response), so a
CBPO branch continuation (Sec. 4.2) is just another context. Per sampled token the engine
returns what the method needs downstream:

* its log-probability under the *raw* policy, ``log_softmax(logits)`` at temperature 1 with no
  top-p/top-k processing: this is log pi_old in the clipped surrogate (Eq. 20). If the engine
  samples with another temperature or top-p, the tokens come from the processed distribution
  but the returned log-probs are still those of the policy being trained;
* the truncated top-K entropy ``-sum_{v in topK} p_v log p_v`` with ``p`` the raw softmax,
  un-renormalised over the K kept tokens (Eq. 6, K = 10).

The loop is written by hand rather than with ``model.generate`` (which applies top-k 50 by
default, reports processed scores and keeps computing finished rows): finished rows leave the
batch, new rows can join it at any step (``HFEngine.batch``: the agent loop's rows rejoin after
a tool call, a method's branches start as soon as their parent is done), the KV cache is
written in place instead of concatenated, identical contexts share one prefill, a row that
continues a finished row's tokens (its own turn after a tool result, a branch of a parent)
starts from a copy of that row's cache, and sampling draws one uniform per row (see
``benchmarks/bench_engine.py``). Contexts are padded on the left and, after a copied prefix, in
the middle; positions are ``cumsum(mask) - 1`` so a padded row sees the positions it would see
alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Iterable, Sequence

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

STOP_REASONS = ("stop_token", "stop_string", "eos", "length")


@dataclass
class Sample:
    """One continuation. ``stop`` is one of ``STOP_REASONS``; ``stop_match`` is the stop token
    id (for "stop_token" and "eos"), the stop string (for "stop_string"), or None ("length").
    A stop token, EOS or the last token of a stop string is included in ``token_ids``."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    stop: str = "length"
    stop_match: int | str | None = None


def check_sampling_settings(top_k_entropy: int, temperature: float, top_p: float) -> None:
    """Engine settings every engine validates the same way."""
    if top_k_entropy < 1:
        raise ValueError(f"top_k_entropy must be >= 1, got {top_k_entropy}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def check_sample_args(
    contexts, max_new_tokens, stop_strings, max_context: int | None = None
) -> tuple[list[int], tuple[str, ...]]:
    """The ``sample`` contract's argument checks, shared by every engine: per-row token caps
    and the stop strings as a tuple. With ``max_context``, a context longer than it is an
    error and each cap is cut so that context and continuation fit in it; both happen before
    anything is allocated for the batch."""
    n = len(contexts)
    budgets = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(budgets) != n:
        raise ValueError(f"max_new_tokens has {len(budgets)} entries for {n} contexts")
    for i, (ctx, cap) in enumerate(zip(contexts, budgets)):
        if len(ctx) == 0:
            raise ValueError(f"context {i} is empty: sampling needs at least one token")
        if cap < 0:
            raise ValueError(f"max_new_tokens[{i}] is negative ({cap})")
        if max_context is not None:
            if len(ctx) > max_context:
                raise ValueError(f"context {i} has {len(ctx)} tokens, more than the model's context of "
                                 f"{max_context} (max_position_embeddings)")
            budgets[i] = min(cap, max_context - len(ctx))
    if isinstance(stop_strings, str):
        raise TypeError("stop_strings must be a list of strings, not one string")
    stop_strings = tuple(stop_strings)
    if any(not s for s in stop_strings):
        raise ValueError("stop_strings must not contain an empty string")
    return budgets, stop_strings


class SamplingEngine:
    """The ``sample`` contract every rollout engine keeps (``HFEngine``, ``VLLMEngine``): the
    arguments are checked here, once, and an engine implements ``_sample`` on checked ones."""

    max_context: int | None = None  # context + continuation the model takes; None: no limit checked

    def sample(
        self,
        contexts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        stop_token_ids: Iterable[int] = frozenset(),
        stop_strings: Sequence[str] = (),
    ) -> list[Sample]:
        """Continue every context until a stop token, EOS, a stop string or its token cap.

        ``max_new_tokens`` is one cap for all rows or one per row (a row with cap 0 returns an
        empty "length" sample). Stop strings serve tokenizers whose tags are several tokens;
        they are matched on the decoded tail, so a match may start inside the context but must
        end in a newly sampled token. A token both in ``stop_token_ids`` and an EOS reports
        "stop_token".
        """
        budgets, stop_strings = check_sample_args(contexts, max_new_tokens, stop_strings, self.max_context)
        return self._sample(contexts, budgets, frozenset(int(t) for t in stop_token_ids), stop_strings)

    def _sample(self, contexts: Sequence[Sequence[int]], budgets: list[int], stop_ids: frozenset[int],
                stop_strings: tuple[str, ...]) -> list[Sample]:
        raise NotImplementedError


class HFEngine(SamplingEngine):
    """Samples continuations of many token contexts in one batch.

    ``generator`` seeds sampling: a ``torch.Generator`` (on ``device``), an int seed, or None
    for a randomly seeded generator. It is kept as ``self.generator``, so the same engine and
    seed reproduce the same samples for the same sequence of calls. ``temperature=0`` samples
    greedily (the returned log-probs are still the raw policy's).

    Finished rows are dropped from the batch (and the KV cache) once at least
    ``compact_fraction`` of the batch has finished; until then they ride along and their
    tokens are ignored. Dropping copies the whole cache, so doing it at every single finish
    costs more than it saves; never dropping costs more still (benchmarks/bench_engine.py).
    Rows joining a running batch wait, by the same rule, until they are ``compact_fraction``
    of its live rows.

    ``max_context`` is the model's ``max_position_embeddings`` (None when its config has
    none): a longer context is an error naming both lengths, and a row stops with "length"
    when it fills the context.
    """

    def __init__(
        self,
        model,
        tokenizer,
        top_k_entropy: int = 10,
        temperature: float = 1.0,
        top_p: float = 1.0,
        device: str | torch.device = "cpu",
        generator: torch.Generator | int | None = None,
        compact_fraction: float = 0.25,
    ) -> None:
        check_sampling_settings(top_k_entropy, temperature, top_p)
        if compact_fraction <= 0:
            raise ValueError(f"compact_fraction must be > 0, got {compact_fraction}")
        self.model = model
        self.tokenizer = tokenizer
        self.top_k_entropy = top_k_entropy
        self.temperature = temperature
        self.top_p = top_p
        self.device = torch.device(device)
        self.compact_fraction = compact_fraction
        self.max_context = getattr(model.config, "max_position_embeddings", None)
        if any(type(layer) is not DynamicLayer for layer in DynamicCache(config=model.config).layers):
            # Packing and prefix copies move KV columns, which a sliding window's eviction forbids.
            raise ValueError("HFEngine supports models whose every layer attends to the full context")
        if isinstance(generator, torch.Generator):
            self.generator = generator
        else:
            self.generator = torch.Generator(device=self.device)
            if generator is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(int(generator))
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else min(self.eos_token_ids, default=0)
        self._stop_string_vocab: dict[tuple[str, ...], torch.Tensor] = {}

    def _sample(self, contexts, budgets, stop_ids, stop_strings) -> list[Sample]:
        """All rows in one running batch (see :meth:`batch`)."""
        samples = [Sample() for _ in contexts]
        with self.batch(stop_ids, stop_strings) as batch:
            for i, (ctx, cap) in enumerate(zip(contexts, budgets)):
                batch.admit(i, ctx, cap)
            while batch:
                for i, s in batch.step():
                    samples[i] = s
        return samples

    def batch(
        self, stop_token_ids: Iterable[int] = frozenset(), stop_strings: Sequence[str] = (), keep_prefixes: bool = False
    ) -> "Batch":
        """A running batch that rows can join at any step (see :class:`Batch`); use it as a
        context manager. ``keep_prefixes`` keeps each finished row's KV cache for the batch's
        lifetime, so a later row continuing it (the same row after its tool observation, a
        branch of it, a fresh row of its prompt) prefills only the tokens after the shared
        prefix."""
        _, stop_strings = check_sample_args([], 0, stop_strings)
        return Batch(self, frozenset(stop_token_ids), stop_strings, keep_prefixes)

    def _next_token(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample one token per row; return it with its raw log-prob and top-K entropy."""
        logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1)
        if self.temperature == 0:
            tokens = logits.argmax(dim=-1)
        else:
            if self.temperature == 1.0 and self.top_p == 1.0:
                probs = logp.exp()
            else:
                probs = torch.softmax(logits / self.temperature, dim=-1)
                if self.top_p < 1.0:
                    probs = _top_p_filter(probs, self.top_p)
            tokens = _inverse_cdf_sample(probs, self.generator)
        token_logp = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
        top = logp.topk(min(self.top_k_entropy, logp.shape[-1]), dim=-1).values.exp()
        entropy = -torch.special.xlogy(top, top).sum(dim=-1)  # 0 log 0 = 0 for masked logits
        return tokens, token_logp, entropy

    def _stop_string_vocab_mask(self, stop_strings: tuple[str, ...]) -> torch.Tensor:
        """Tokens whose text contains the last character of some stop string: only such a
        token can complete a match, so only those rows pay for decoding their tail."""
        if stop_strings not in self._stop_string_vocab:
            n_vocab = max(len(self.tokenizer), self.model.config.vocab_size)
            texts = self.tokenizer.batch_decode([[t] for t in range(len(self.tokenizer))])
            last_chars = {s[-1] for s in stop_strings}
            flags = [any(c in text for c in last_chars) for text in texts]
            mask = torch.zeros(n_vocab, dtype=torch.bool)
            mask[: len(flags)] = torch.as_tensor(flags, dtype=torch.bool)
            self._stop_string_vocab[stop_strings] = mask.to(self.device)
        return self._stop_string_vocab[stop_strings]

    def _stop_string_hit(self, context: Sequence[int], generated: list[int], stop_strings) -> str | None:
        # A match spans at most as many tokens as it has UTF-8 bytes; it must end in the newest
        # token, otherwise it would have been caught (or lies wholly in the context).
        span = max(len(s.encode("utf-8")) for s in stop_strings)
        tail = generated[-span:]
        if len(tail) < span:
            tail = list(context[len(tail) - span:]) + tail
        text = self.tokenizer.decode(tail, clean_up_tokenization_spaces=False)
        before = len(self.tokenizer.decode(tail[:-1], clean_up_tokenization_spaces=False))
        for s in stop_strings:
            if text.find(s, max(0, before - len(s) + 1)) >= 0:
                return s
        return None


@dataclass
class _Row:
    key: Hashable
    context: list[int]
    budget: int
    sample: Sample = field(default_factory=Sample)
    live: bool = True


@dataclass
class _Prefix:
    """A finished row's KV cache: ``keys``/``values`` per layer, ``[heads, len(tokens), dim]``."""

    key: Hashable
    tokens: np.ndarray
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class Batch:
    """Rows decoded together one token per ``step``, joining whenever they are admitted
    (continuous batching) and leaving when they finish.

    Rows admitted between steps wait until they are at least ``compact_fraction`` of the live
    rows (or no row is live) and are then prefilled in one forward and merged into the batch:
    merging copies the whole cache, so admitting one row at a time would cost more than the
    waiting. A merge packs every row's KV columns to the right, dropping finished rows and
    padding; rotary positions are baked into the keys and taken from ``cumsum(mask) - 1``, so a
    row's columns may move without changing what it computes.

    With ``keep_prefixes``, a new row whose context shares a prefix with a kept row starts from
    a copy of that row's KV and prefills only the rest of its context (at least its last token,
    for the next-token logits). Masked columns add exactly zero to attention, so log-probs and
    entropies stay those of a fresh forward pass up to float rounding.
    """

    def __init__(self, engine: HFEngine, stop_ids: frozenset[int], stop_strings: tuple[str, ...], keep_prefixes: bool):
        self.engine = engine
        self.stop_ids = stop_ids
        self.stop_strings = stop_strings
        self.may_end_string = engine._stop_string_vocab_mask(stop_strings) if stop_strings else None
        self.prefixes: list[_Prefix] | None = [] if keep_prefixes else None
        self.waiting: list[_Row] = []
        self.rows: list[_Row] = []  # batch row -> row; finished rows ride along until compacted
        self.cache = self.mask = self.next_pos = self.logits = None

    def __enter__(self) -> "Batch":
        self._was_training = self.engine.model.training
        self.engine.model.eval()
        self._no_grad = torch.inference_mode()
        self._no_grad.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.rows, self.cache, self.prefixes = [], None, None
        self._no_grad.__exit__(*exc)
        self.engine.model.train(self._was_training)

    def __len__(self) -> int:
        """Rows admitted and not yet returned by ``step``."""
        return len(self.waiting) + sum(r.live for r in self.rows)

    def admit(self, key: Hashable, context: Sequence[int], max_new_tokens: int) -> None:
        """Queue a row; ``step`` returns its sample under ``key``. The cap is cut as in
        ``HFEngine.sample`` so that context and continuation fit the model's context."""
        [cap], _ = check_sample_args([context], max_new_tokens, (), self.engine.max_context)
        self.waiting.append(_Row(key, list(context), cap))

    def step(self) -> list[tuple[Hashable, Sample]]:
        """Admit waiting rows if due, sample one token for every live row, and return the rows
        that finished, as ``(key, sample)``."""
        finished = [(r.key, r.sample) for r in self.waiting if r.budget == 0]
        waiting = [r for r in self.waiting if r.budget > 0]
        n_live = sum(r.live for r in self.rows)
        self.waiting = waiting
        if waiting and len(waiting) >= self.engine.compact_fraction * n_live:
            self.waiting = []
            self._merge(waiting)
        if not any(r.live for r in self.rows):
            return finished
        engine = self.engine
        tokens, logprobs, entropies = engine._next_token(self.logits)
        tok_l, lp_l, ent_l = tokens.tolist(), logprobs.tolist(), entropies.tolist()
        string_rows = self.may_end_string[tokens].tolist() if self.may_end_string is not None else None
        ended = []
        for b, r in enumerate(self.rows):
            if not r.live:
                continue
            s, tok = r.sample, tok_l[b]
            s.token_ids.append(tok)
            s.logprobs.append(lp_l[b])
            s.entropies.append(ent_l[b])
            if tok in self.stop_ids:
                s.stop, s.stop_match = "stop_token", tok
            elif tok in engine.eos_token_ids:
                s.stop, s.stop_match = "eos", tok
            elif string_rows is not None and string_rows[b] and (
                hit := engine._stop_string_hit(r.context, s.token_ids, self.stop_strings)
            ):
                s.stop, s.stop_match = "stop_string", hit
            elif len(s.token_ids) >= r.budget:
                s.stop = "length"
            else:
                continue
            r.live = False
            ended.append(b)
            finished.append((r.key, s))
        if ended and self.prefixes is not None:
            self._keep(ended)
        keep = [b for b, r in enumerate(self.rows) if r.live]
        if not keep:
            self.rows, self.cache = [], None
            return finished
        if len(keep) < len(self.rows) and len(self.rows) - len(keep) >= engine.compact_fraction * len(self.rows):
            keep_t = torch.as_tensor(keep, device=engine.device)
            self.cache.batch_select_indices(keep_t)
            tokens, self.mask, self.next_pos = tokens[keep_t], self.mask[keep_t], self.next_pos[keep_t]
            self.rows = [self.rows[b] for b in keep]
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        self.logits = engine.model(
            input_ids=tokens.unsqueeze(1),
            attention_mask=self.mask,
            position_ids=self.next_pos,
            past_key_values=self.cache,
            use_cache=True,
        ).logits[:, -1, :]
        self.next_pos = self.next_pos + 1
        return finished

    def _keep(self, ended: list[int]) -> None:
        """Keep the KV of rows that just finished (context and every sampled token but the
        last, which was never fed); a kept prefix that a newer one extends is dropped."""
        for b in ended:
            r = self.rows[b]
            cols = self.mask[b].nonzero().squeeze(1)
            layers = self.cache.layers
            new = _Prefix(
                r.key,
                np.asarray(r.context + r.sample.token_ids[:-1], dtype=np.int64),
                [layer.keys[b][:, cols] for layer in layers],
                [layer.values[b][:, cols] for layer in layers],
            )
            n = len(new.tokens)
            self.prefixes = [
                p for p in self.prefixes if not (len(p.tokens) <= n and np.array_equal(p.tokens, new.tokens[: len(p.tokens)]))
            ]
            self.prefixes.append(new)

    def forget(self, key: Hashable) -> None:
        """Drop the kept cache of row ``key``: nothing will continue it."""
        if self.prefixes is not None:
            self.prefixes = [p for p in self.prefixes if p.key != key]

    def _longest_prefix(self, context: list[int]) -> tuple[_Prefix | None, int]:
        """The kept prefix sharing the most leading tokens with ``context``, and how many (at
        most all but its last token)."""
        ctx = np.asarray(context, dtype=np.int64)
        best, best_n = None, 0
        for p in self.prefixes or ():
            m = min(len(p.tokens), len(ctx) - 1)
            if m <= best_n:
                continue
            same = p.tokens[:m] == ctx[:m]
            n = m if same.all() else int(same.argmin())
            if n > best_n:
                best, best_n = p, n
        return best, best_n

    def _merge(self, new: list[_Row]) -> None:
        """Prefill the new rows (identical contexts once, kept prefixes copied) and pack them
        with the live rows into one cache sized for every row's remaining tokens."""
        engine = self.engine
        first: dict[tuple[int, ...], int] = {}
        row_to_unique = [first.setdefault(tuple(r.context), len(first)) for r in new]
        unique = [list(c) for c in first]
        hits = [self._longest_prefix(c) for c in unique]
        width_p = max(n for _, n in hits)
        width_s = max(len(c) - n for c, (_, n) in zip(unique, hits))
        width = width_p + width_s
        input_ids = torch.full((len(unique), width_s), engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        kv = _kv_buffers(engine, len(unique), width)
        for k, v in kv:  # padding must be finite: masked columns still meet a 0 weight
            k[:, :, :width_p] = 0
            v[:, :, :width_p] = 0
        for u, (ctx, (prefix, n)) in enumerate(zip(unique, hits)):
            rest = len(ctx) - n
            input_ids[u, width_s - rest :] = torch.as_tensor(ctx[n:], dtype=torch.long)
            mask[u, width - rest :] = 1
            if n:
                mask[u, width_p - n : width_p] = 1
                for (k, v), pk, pv in zip(kv, prefix.keys, prefix.values):
                    k[u, :, width_p - n : width_p] = pk[:, :n]
                    v[u, :, width_p - n : width_p] = pv[:, :n]
        input_ids, mask = input_ids.to(engine.device), mask.to(engine.device)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        logits = engine.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions[:, width_p:],
            past_key_values=_cache(engine.model.config, kv, width_p),
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]
        expand = torch.as_tensor(row_to_unique, device=engine.device)
        parts = [([(k[expand], v[expand]) for k, v in kv], mask[expand])]
        pos, last = [positions[expand, -1:] + 1], [logits[expand]]
        live = [b for b, r in enumerate(self.rows) if r.live]
        if live:
            keep = torch.as_tensor(live, device=engine.device)
            parts.insert(0, ([(layer.keys[keep], layer.values[keep]) for layer in self.cache.layers], self.mask[keep]))
            pos.insert(0, self.next_pos[keep])
            last.insert(0, self.logits[keep])
        self.rows = [self.rows[b] for b in live] + new
        packed = [_packed(layer_kv, m) for layer_kv, m in parts]
        width = max(m.shape[1] for _, m in packed)
        room = max(r.budget - len(r.sample.token_ids) for r in self.rows)
        kv = _kv_buffers(engine, len(self.rows), width + room)
        self.mask = mask.new_zeros((len(self.rows), width))
        row = 0
        for layer_kv, m in packed:
            rows, w = slice(row, row + m.shape[0]), m.shape[1]
            self.mask[rows, width - w :] = m
            for (k, v), (pk, pv) in zip(kv, layer_kv):
                k[rows, :, : width - w] = 0
                v[rows, :, : width - w] = 0
                k[rows, :, width - w : width] = pk
                v[rows, :, width - w : width] = pv
            row += m.shape[0]
        self.cache = _cache(engine.model.config, kv, width)
        self.next_pos, self.logits = torch.cat(pos), torch.cat(last)


def _packed(kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor):
    """Every row's attended columns moved to the right end, in order, as narrow as the longest
    row allows; the columns left of a row's own are masked (and finite)."""
    width = int(mask.sum(1).max())
    order = torch.argsort(mask, dim=1, stable=True)[:, mask.shape[1] - width :]  # masked columns sort first
    out = []
    for k, v in kv:
        idx = order[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        out.append((k.gather(2, idx), v.gather(2, idx)))
    return out, mask.gather(1, order)


class _PreallocatedLayer(DynamicLayer):
    """A KV-cache layer written in place into a buffer sized for what its rows still need,
    instead of ``DynamicLayer``'s concatenation of the entire cache at every step (measured
    20-30% more tokens/s at batch 128 on the model of benchmarks/bench_engine.py, one thread).
    Supports what the engine uses: ``update``, ``get_seq_length`` and ``batch_select_indices``."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, length: int):
        super().__init__()
        self.dtype, self.device, self.is_initialized = k.dtype, k.device, True
        self._k, self._v, self.length = k, v, length
        self.keys, self.values = k[..., :length, :], v[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            raise RuntimeError(f"KV cache capacity {self._k.shape[-2]} exceeded ({end} positions)")
        self._k[..., self.length : end, :] = key_states
        self._v[..., self.length : end, :] = value_states
        self.length = end
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]


def _kv_buffers(engine: HFEngine, rows: int, capacity: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Uninitialised key and value buffers, one pair per layer, for ``capacity`` positions."""
    config = engine.model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = (rows, heads, capacity, dim)
    make = lambda: torch.empty(shape, dtype=engine.model.dtype, device=engine.device)  # noqa: E731
    return [(make(), make()) for _ in range(config.num_hidden_layers)]


def _cache(config, kv: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> DynamicCache:
    """The model's dynamic cache over the given buffers, the first ``length`` positions filled."""
    cache = DynamicCache(config=config)
    cache.layers = [_PreallocatedLayer(k, v, length) for k, v in kv]
    return cache


def _inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row from (unnormalised) ``probs``: the first token whose cumulative mass
    exceeds a uniform draw. One random number per row instead of ``torch.multinomial``'s
    per-entry work: 20x faster on CPU at batch 128 (and at Qwen3's 152k vocabulary). Float32
    cumsum: a token far below float resolution of the running sum (p << 1e-7) may be skipped."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return tokens.squeeze(1).clamp_(max=probs.shape[-1] - 1)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest set whose mass reaches ``top_p`` (nucleus)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    outside = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # mass before this token already enough
    sorted_p = sorted_p.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p)


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    return frozenset(ids)
