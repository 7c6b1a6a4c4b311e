"""BranPO ("BranPO: Scalable Contrastive Branch Sampling for Long-Horizon Agentic Reinforcement
Learning", arXiv 2602.03719): outcomes diverge mostly near the tail, so BranPO cuts a finished
rollout a few steps before its end, resamples the tail, and keeps a branch only if it contrasts
with the original; the shared prefix gets a value-like advantage, the tails a contrastive one.

Implemented (official code, YubaoZhao/BranPO ``agent_branch_engine.py`` and
``agent_ppo_branch_trainer.py``; a step is one model turn, "correct" means R >= 0.8):
- difficulty-aware branch sampling from each base rollout, by the base group's accuracy acc and
  the rollout's reward and step count, first matching row wins:
  0.5 < acc < 1, correct, steps - mean correct steps >= 0.1: 5 attempts regenerating the last 2
  steps | acc = 1: 1 attempt, last step | acc < 0.5, wrong: 2 attempts each at 1, then 2, then 3
  trailing steps | acc <= 0.75 or wrong: 2 attempts at 1, then 2 | otherwise none;
  a truncated ("length") rollout is not branched. An attempt keeps the exact prefix
  (``baselines.agent_steps.fork``) and regenerates the tail; attempts stop at the first contrastive one:
  the reward crosses 0.8 either way, or, only when 0.5 < acc < 1, both are correct with equal
  reward and the branch takes fewer (preferred) or more (rejected) steps; the original tail gets
  the opposite preference. A branch ending in "length" or "turns" never contrasts.
- advantages: each base rollout is split at its cut (the last attempt's branch point, else 2 steps
  before its end); A_pre = GRPO over the base rollouts, each scored by the mean reward of its
  tails (its own and the kept branch); A_br = GRPO over all tails of the problem. Prefix tokens
  get A_pre once, on the base rollout; each tail's tokens get its A_br; a kept branch's copied
  prefix has no loss. Redundant Step Masking: on a tail's first step, A_br = 0 when its preference
  is negative and A_br > 0. Attempts that did not contrast are discarded (no loss), as the code.

Budget [APPROX]: BranPO's count is data-dependent; here 8 base rollouts and at most 8 attempts per
problem (BASELINES.md section 13), one attempt per searching rollout per phase of its problem (a
problem's next phase joins the running batch once its own attempts are done), given in the
table's row order when slots run short; the remaining slots are fresh rollouts (kind "fill")
that train as base rollouts without a branch. The realised split is on the rollouts' ``kind``.
- as the paper's search script (``start_branpo_trainer.sh``): a problem whose rollouts all earn
  R <= 0 or all R >= 1 trains on none of them (``rllm.rejection_sample``: no contrast to learn
  from), a truncated rollout (finish "length") has no loss (``mask_truncated_samples``), and the
  PPO clip is 0.2 / 0.28 (``clip_ratio_high``) with verl's token-mean loss.
Not used: the segment-level variant and rollout importance sampling (the script's bypass-mode
token IS at 2.0 corrects a vLLM/FSDP mismatch; the local trainer scores pi_old itself). Contrast
needs rewards during collection: ``collect`` takes the trainer's ``Problems`` and scores each
problem's rollouts as they come.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from baselines.agent_steps import fill_to_budget, fork, fresh, step_starts
from cbpo.credit import grpo_advantages
from cbpo.objective import ObjectiveConfig
from cbpo.registry import Problems, Sampler, TokenCredit, register_method
from cbpo.rollout.agent import Job, run_jobs
from cbpo.trajectory import Trajectory

MASKED_FINISHES = ("length", "turns")  # the code's masked-out terminations


@dataclass(frozen=True)
class BranPOConfig(ObjectiveConfig):
    budget: int = 16  # 8 base + at most 8 branch attempts (BASELINES.md section 13)
    base_rollouts: int | None = None  # n; None: half the budget (the paper's script: 4)
    correct: float = 0.8  # reward at which a rollout counts as correct
    redundant_step_masking: bool = True
    reject_uniform_groups: bool = True  # rllm.rejection_sample: all R <= 0 or all R >= 1 trains nothing
    mask_truncated: bool = True  # mask_truncated_samples: a "length" rollout has no loss
    eps: float = 1e-6
    loss_agg_mode: str = "token-mean"  # the script's
    clip_high: float | None = 0.28  # the script's clip_ratio_high

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.base_rollouts is None:
            object.__setattr__(self, "base_rollouts", max(self.budget // 2, 1))
        if not 0 < self.base_rollouts <= self.budget:
            raise ValueError(f"need 0 < base_rollouts <= budget, got {self.base_rollouts}, {self.budget}")


@dataclass
class Search:
    """The branch search of one base rollout: trailing steps per level, attempts per level."""

    row: int  # the schedule table's row (lower = served first when slots run short)
    levels: tuple[int, ...]
    attempts: int
    level: int = 0
    used: int = 0

    @property
    def active(self) -> bool:
        return self.level < len(self.levels)


def schedule(t: Trajectory, accuracy: float, mean_steps: float, correct: float) -> Search:
    """Difficulty-aware branch sampling: the code's table, first matching row wins."""
    ok = t.reward >= correct
    if t.finish == "length":
        return Search(5, (), 0)
    if 0.5 < accuracy < 1 and ok and len(step_starts(t)) - mean_steps >= 0.1:
        return Search(0, (2,), 5)
    if accuracy == 1:
        return Search(1, (1,), 1)
    if accuracy < 0.5 and not ok:
        return Search(2, (1, 2, 3), 2)
    if accuracy <= 0.75 or not ok:
        return Search(3, (1, 2), 2)
    return Search(4, (), 0)


def cut(t: Trajectory, trailing: int) -> int:
    """Model-token position that keeps all but the last ``trailing`` steps (0 when fewer)."""
    starts = step_starts(t)
    return int(starts[max(len(starts) - trailing, 0)])


def first_step_end(t: Trajectory, b: int) -> int:
    """End of the step that starts at model token ``b``."""
    starts = step_starts(t)
    later = starts[starts > b]
    return int(later[0]) if later.size else t.n_model_tokens


def preference(orig: Trajectory, branch: Trajectory, accuracy: float, correct: float) -> int:
    """+1 if the branch is preferred to the original tail, -1 if rejected, 0 if not contrastive."""
    if branch.finish in MASKED_FINISHES:
        return 0
    a, b = orig.reward >= correct, branch.reward >= correct
    if a != b:
        return 1 if b else -1
    if 0.5 < accuracy < 1 and a and orig.reward == branch.reward:
        return int(np.sign(len(step_starts(orig)) - len(step_starts(branch))))
    return 0


def base_statistics(group: Sequence[Trajectory], correct: float) -> tuple[float, float]:
    """Accuracy of the base rollouts and the mean step count of the correct ones."""
    base = [t for t in group if t.kind == "parent"]
    steps = [len(step_starts(t)) for t in base if t.reward >= correct]
    return float(np.mean([t.reward >= correct for t in base])), float(np.mean(steps)) if steps else 0.0


def branpo_credit(group: Sequence[Trajectory], cfg: BranPOConfig) -> list[TokenCredit]:
    """Prefix and tail advantages of one problem. The search is replayed from the rewards: a
    base rollout's kept branch is its first attempt that contrasts, its cut the kept branch's
    point, else its last attempt's, else 2 steps before its end (as the code's default)."""
    accuracy, _ = base_statistics(group, cfg.correct)
    prefixes = [i for i, t in enumerate(group) if t.kind != "branch"]  # base rollouts and fillers
    cuts, kept = {}, {}
    for i in prefixes:
        attempts = [k for k, t in enumerate(group) if t.kind == "branch" and t.parent == i]
        for k in attempts:
            pref = preference(group[i], group[k], accuracy, cfg.correct)
            if pref:
                kept[i] = (k, pref)
                break
        cuts[i] = group[kept[i][0] if i in kept else attempts[-1]].at if attempts else cut(group[i], 2)
    tails = prefixes + [k for k, _ in kept.values()]
    tail_pref = {i: -kept[i][1] if i in kept else 0 for i in prefixes} | {k: p for k, p in kept.values()}
    r_base = [np.mean([group[i].reward] + ([group[kept[i][0]].reward] if i in kept else [])) for i in prefixes]
    a_pre = dict(zip(prefixes, grpo_advantages(np.array(r_base), cfg.eps)))
    a_br = dict(zip(tails, grpo_advantages(np.array([group[k].reward for k in tails], dtype=np.float64), cfg.eps)))

    rewards = np.array([t.reward for t in group], dtype=np.float64)
    uniform = cfg.reject_uniform_groups and (np.all(rewards <= 0) or np.all(rewards >= 1))
    out = []
    for k, t in enumerate(group):
        adv = np.zeros(t.n_model_tokens)
        mask = np.zeros(t.n_model_tokens, dtype=np.int8)
        if uniform or (cfg.mask_truncated and t.finish == "length"):
            out.append((adv, mask))
            continue
        if k in a_br:
            b = cuts[k] if k in cuts else t.at
            adv[b:] = a_br[k]
            mask[b:] = 1
            if cfg.redundant_step_masking and tail_pref[k] < 0 and a_br[k] > 0:
                adv[b : first_step_end(t, b)] = 0.0
            if k in a_pre:
                adv[:b] = a_pre[k]
                mask[:b] = 1
        out.append((adv, mask))
    return out


@register_method("branpo")
class BranPO:
    display_name = "BranPO"
    paper = "BranPO: Scalable Contrastive Branch Sampling for Long-Horizon Agentic RL, arXiv 2602.03719"
    group = "agentic-rl"
    trains = True
    implemented = "half the slots as base rollouts + difficulty-aware tail re-sampling keeping contrastive branches; prefix/tail advantages, RSM"
    config = BranPOConfig

    def __init__(self, vocab_size: int, **overrides: Any):
        # vocab_size is part of every method's constructor; BranPO does not need it.
        self.cfg = BranPOConfig.from_overrides(overrides)

    def collect(self, prompts: Sequence[list[int]], sample: Sampler, problems: Problems) -> list[list[Trajectory]]:
        return run_jobs([self._rollouts(x, p, problems) for x, p in enumerate(prompts)], sample)

    def _rollouts(self, x: int, prompt: list[int], problems: Problems) -> Job:
        """Problem ``x``: base rollouts, then one attempt per searching rollout per phase."""
        cfg = self.cfg
        group = yield fresh(prompt, cfg.base_rollouts)
        problems.score([group], [x])
        stats = base_statistics(group, cfg.correct)
        searches = {i: schedule(t, *stats, cfg.correct) for i, t in enumerate(group)}
        while True:
            left = cfg.budget - len(group)
            owners = [i for i, s in sorted(searches.items(), key=lambda kv: (kv[1].row, kv[0])) if s.active][: max(left, 0)]
            if not owners:
                break
            added = yield [fork(group[i], cut(group[i], searches[i].levels[searches[i].level]), i) for i in owners]
            problems.score([added], [x])
            group += added
            for i, t in zip(owners, added):
                s = searches[i]
                s.used += 1
                if preference(group[i], t, stats[0], cfg.correct):
                    s.level = len(s.levels)
                elif s.used == s.attempts:
                    s.level, s.used = s.level + 1, 0
        yield from fill_to_budget(group, prompt, cfg.budget)
        return group

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        return [branpo_credit(g, self.cfg) for g in groups]

