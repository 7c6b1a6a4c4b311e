"""OC-GRPO, Off-Context GRPO (Agrawal et al., 2026, "Off-Context GRPO: Learning to Reason on Hard
Problems using Privileged Information", arXiv 2607.19313): on problems the policy cannot solve,
rollouts are sampled with privileged information in the context and the policy is trained on
them in the context without it.

Implemented (BASELINES.md section 6):
1. G_1 = M/2 rollouts from the plain prompt x, rewarded at once. If every reward is below
   ``hint_threshold`` (0.5: all failed, for 0/1 and F1 rewards alike), the other M/2 rollouts are
   sampled from the privileged prompt (x, p), p = a hint stating the gold answer with an
   instruction not to reveal it; otherwise M/2 more from x. Always M rollouts (kind
   "privileged" marks the hinted ones).
2. Off-context training: a privileged rollout is trained under x. Its importance weight
   pi_old(y_t | x, y_<t) / pi_b(y_t | x, p, y_<t), capped at ``is_cap`` = 2 (truncated IS), both
   log-probs from the pre-update policy at the scoring temperature (``off_context``; computed
   here with the model ``setup`` gives), multiplies its token advantages. With one optimiser
   step per batch (``rl.ppo_mini_batches=1``) the clipped ratio is 1 at the gradient, so this is
   the clipped surrogate against the behaviour policy of BASELINES.md.
3. GRPO advantages over all M rewards; a privileged rollout that leaks p gets reward 0: its
   model text (tool observations excluded: a tool may print what the model derived) names the
   hint, or states a gold answer outside its final ``<answer>`` (``leaks_hint``).

On verl (cbpo/backends/verl/): collect runs in the agent loop without the model
(``setup(None, ...)``) and each rollout carries its hinted prompt and leak flag. The trainer
takes the old log-probs from verl's ``old_log_probs`` (the actor before the update, hint-free,
at ``rl.temperature``: the local scoring temperature unless that is 0) and the behaviour
log-probs from one more pass of that actor call over the privileged rows with their hinted
prompts (longer than verl's ``rollout.prompt_length``: that pass sizes its prompt block to
them), then ``off_context``. Both come from verl's FSDP actor, so they match the local forward
pass up to its numerics (bf16, fused kernels).

[APPROX] No page, abstract or code of arXiv 2607.19313 was reachable: this is the mechanism of
the closest public method, Guide-GRPO (Nath et al., arXiv 2506.13923: hints only for all-failed
prompts, importance correction towards the hint-free context), with BASELINES.md's choices
(8 + 8 slots, gold-answer hints, cap 2). The hint text is ours.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import re

import numpy as np

from cbpo.logprobs import model_token_logprobs
from cbpo.chat import TOOL_TAGS
from cbpo.credit import grpo_advantages
from cbpo.objective import ObjectiveConfig
from cbpo.registry import Problems, Sampler, TokenCredit, register_method, sample_fresh
from cbpo.trajectory import Trajectory

HINT = ("Privileged hint: a reference answer to this question is {answer}. Use it to guide your "
        "reasoning and tool calls, derive the answer yourself, and do not mention this hint.")
HINT_WORDING = ("privileged hint", "reference answer", "this hint")  # phrases of HINT a leak repeats
ANSWER_OPEN = TOOL_TAGS["answer"][0]


@dataclass(frozen=True)
class OCGRPOConfig(ObjectiveConfig):
    budget: int = 16  # M rollouts per problem: M/2 plain, then M/2 plain or privileged
    eps: float = 1e-6
    hint_threshold: float = 0.5  # delta: hint a problem whose first M/2 rewards all fall below it
    is_cap: float = 2.0  # rho_max of the truncated importance weight

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget < 2:
            raise ValueError(f"OC-GRPO splits the budget in two halves: need budget >= 2, got {self.budget}")
        if not self.is_cap > 0:
            raise ValueError(f"is_cap must be > 0, got {self.is_cap}")


def hint(row: Mapping[str, Any]) -> str:
    """The privileged information p of a problem: its gold answer (the first, if several)."""
    return HINT.format(answer=answers(row)[0])


def answers(row: Mapping[str, Any]) -> list[str]:
    answer = row["answer"]
    return [answer] if isinstance(answer, str) else list(answer)


def leaks_hint(text: str, gold: Sequence[str]) -> bool:
    """Whether a privileged rollout's model text restates its hint: the hint's wording anywhere,
    or a gold answer (as a whole word, any case) before its final answer tag, which is where the
    answer belongs. A check for the whole hint sentence almost never fires (BASELINES.md sec. 6)."""
    if any(w in text.lower() for w in HINT_WORDING):
        return True
    cut = text.rfind(ANSWER_OPEN)
    before = text if cut < 0 else text[:cut]
    return any(re.search(rf"(?<!\w){re.escape(a.strip())}(?!\w)", before, re.IGNORECASE) for a in gold if a.strip())


def model_text(tokenizer, t: Trajectory) -> str:
    """The text of a rollout's model tokens, each run decoded on its own (observations left out)."""
    runs, run = [], []
    for tok, own in zip(t.response_ids, t.model_mask):
        if own:
            run.append(tok)
        elif run:
            runs.append(run)
            run = []
    return "\n".join(tokenizer.batch_decode(runs + [run] if run else runs, skip_special_tokens=False))


def off_context_weights(logp_old: np.ndarray, logp_behaviour: np.ndarray, cap: float) -> np.ndarray:
    """min(pi_old(y_t | x) / pi_b(y_t | x, p), cap) per token."""
    return np.minimum(np.exp(np.asarray(logp_old) - np.asarray(logp_behaviour)), cap)


@register_method("oc_grpo", off_context_credit=True)
class OCGRPO:
    display_name = "OC-GRPO"
    paper = "Agrawal et al., 2026, Off-Context GRPO: Learning to Reason on Hard Problems using Privileged Information, arXiv 2607.19313"
    group = "classic-rl"
    trains = True
    implemented = "[APPROX] 8 plain rollouts; if all fail, 8 more with a gold-answer hint, trained hint-free with capped IS; GRPO"
    config = OCGRPOConfig

    def __init__(self, vocab_size: int | None = None, **overrides: Any):
        # vocab_size is part of every method's constructor; OC-GRPO does not need it.
        self.cfg = OCGRPOConfig.from_overrides(overrides)
        self.model = self.tokenizer = None
        self.last_hinted: list[dict[int, list[int]]] = []  # [problem] -> {privileged rollout: its prompt (x, p)}
        self.last_weights: list[dict[int, np.ndarray]] = []  # [problem] -> {privileged rollout: IS weight per token}
        self.last_leaks: list[set[int]] = []  # [problem] -> privileged rollouts that copied the hint

    def setup(self, model, tokenizer, temperature: float) -> None:
        """``model`` None: collect samples and flags leaks only, and the backend that trains
        supplies the log-probs through ``off_context`` (verl's actor, cbpo/backends/verl/trainer.py)."""
        self.model, self.tokenizer, self.temperature = model, tokenizer, temperature

    def collect(self, prompts: Sequence[list[int]], sample: Sampler, problems: Problems) -> list[list[Trajectory]]:
        if self.tokenizer is None:
            raise RuntimeError("oc_grpo: setup(model, tokenizer, temperature) must run before collect")
        half, rest = self.cfg.budget // 2, self.cfg.budget - self.cfg.budget // 2
        groups = sample_fresh(prompts, half, sample)
        problems.score(groups, range(len(prompts)))
        hints = [hint(row) if max(t.reward for t in g) < self.cfg.hint_threshold else None for g, row in zip(groups, problems.rows)]
        owners = [x for x in range(len(prompts)) for _ in range(rest)]
        done = sample([
            Trajectory(prompt_ids=problems.encode(f"{problems.rows[x]['question']}\n\n{hints[x]}"), kind="privileged") if hints[x]
            else Trajectory(prompt_ids=list(prompts[x]))
            for x in owners
        ])
        hinted = [k for k, t in enumerate(done) if t.kind == "privileged"]
        self.last_hinted = [{} for _ in prompts]
        leaks = [set() for _ in prompts]
        for k in hinted:
            x = owners[k]
            slot = half + k - x * rest  # its index in groups[x] once appended below
            self.last_hinted[x][slot] = done[k].prompt_ids
            if leaks_hint(model_text(self.tokenizer, done[k]), answers(problems.rows[x])):
                leaks[x].add(slot)
            # from here on a privileged rollout lives in the hint-free context it is trained in
            done[k] = replace(done[k], prompt_ids=list(prompts[x]))
        for x, t in zip(owners, done):
            groups[x].append(t)
        self.last_weights, self.last_leaks = [{} for _ in prompts], leaks
        if self.model is not None:
            self.off_context(self.model_logprobs(groups), leaks)
        return groups

    def model_logprobs(self, groups: Sequence[Sequence[Trajectory]]) -> list[dict[int, tuple[np.ndarray, np.ndarray]]]:
        """Per problem, privileged slot -> (old, behaviour) log-probs of its model tokens: the
        pre-update policy at the scoring temperature, without and with the hint."""
        slots = [(x, k) for x, hinted in enumerate(self.last_hinted) for k in hinted]
        trajs = [groups[x][k] for x, k in slots]
        pad = self.tokenizer.pad_token_id
        with_hint = [replace(t, prompt_ids=self.last_hinted[x][k]) for (x, k), t in zip(slots, trajs)]
        behaviour = model_token_logprobs(self.model, with_hint, pad, self.temperature)
        old = model_token_logprobs(self.model, trajs, pad, self.temperature)
        out = [{} for _ in groups]
        for (x, k), lo, lb in zip(slots, old, behaviour):
            out[x][k] = (lo, lb)
        return out

    def off_context(self, logprobs: Sequence[Mapping[int, tuple[np.ndarray, np.ndarray]]],
                    leaks: Sequence[set[int]]) -> None:
        """What ``credit`` needs of the last collect's privileged rollouts: per problem, slot ->
        (old, behaviour) log-probs of its model tokens, and the slots that leaked the hint."""
        self.last_weights = [{k: off_context_weights(lo, lb, self.cfg.is_cap) for k, (lo, lb) in slots.items()}
                             for slots in logprobs]
        self.last_leaks = [set(s) for s in leaks]

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        out = []
        for x, g in enumerate(groups):
            rewards = np.array([0.0 if k in self.last_leaks[x] else t.reward for k, t in enumerate(g)], dtype=np.float64)
            adv = grpo_advantages(rewards, self.cfg.eps)
            # every privileged rollout has its weight: a missing one is an error, not a weight of 1
            weights = [self.last_weights[x][k] if t.kind == "privileged" else np.ones(t.n_model_tokens) for k, t in enumerate(g)]
            out.append([(a * w, np.ones(t.n_model_tokens, dtype=np.int8)) for t, a, w in zip(g, adv, weights)])
        return out
