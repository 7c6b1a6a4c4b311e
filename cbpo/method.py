"""CBPO as a training method (Algorithm 1): per problem, N_0 parents, its Stage-1 plan, then its
branches and fillers, each problem's second phase joining the running batch as soon as its own
parents finish (``cbpo.rollout.agent.run_jobs``); Stage-2 credit over the whole batch. The
equations live in ``cbpo.branching`` and ``cbpo.credit``."""
from __future__ import annotations

from typing import Any, Sequence

from cbpo.branching import BranchPlan, plan_branches
from cbpo.config import CANDIDATES, CBPOConfig
from cbpo.credit import ProblemRollouts, assign_credit
from cbpo.registry import Sampler, TokenCredit, register_method
from cbpo.rollout.agent import Job, run_jobs
from cbpo.trajectory import Trajectory


@register_method("cbpo")
class CBPO:
    display_name = "CBPO"
    paper = "Contrastive Branch Policy Optimization, 2026, arXiv 2608.24300"
    group = "agentic-rl"
    trains = True
    implemented = ("entropy-screened, decay-balanced branching under M slots (Eqs. 5-10); CBV-modulated "
                   "segment credit (Eqs. 13-19); PPO clip + KL (Eqs. 20-23)")
    config = CBPOConfig  # ``method.*`` settings; the trainer's loss reads ``cfg.objective()``

    def __init__(self, vocab_size: int, **overrides: Any):
        self.cfg = CBPOConfig.from_overrides(overrides)
        self.vocab_size = vocab_size
        self.last_plans: list[BranchPlan] = []  # for rollout dumps and figures

    def collect(self, prompts: Sequence[list[int]], sample: Sampler) -> list[list[Trajectory]]:
        results = run_jobs([self._rollouts(p) for p in prompts], sample)
        self.last_plans = [plan for plan, _ in results]
        return [group for _, group in results]

    def _rollouts(self, prompt: list[int]) -> Job:
        """One problem's rollout set R_x: N_0 parents, its Stage-1 plan, then its branches and
        fillers, which start as soon as its own parents are done (Algorithm 1 lines 16-22)."""
        cfg = self.cfg
        parents = yield [Trajectory(prompt_ids=list(prompt)) for _ in range(cfg.n0)]
        plan = plan_branches(
            [t.model_entropies() for t in parents],
            self.vocab_size,
            cfg,
            tool_boundaries=[getattr(t, CANDIDATES[cfg.candidates])() for t in parents],
        )
        rest = [parents[i].branch_prefix(b, i) for i, b in plan.branches]
        rest += [Trajectory(prompt_ids=list(prompt), kind="fill") for _ in range(plan.fill)]
        return plan, parents + (yield rest)

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        problems = [
            ProblemRollouts(
                rewards=[t.reward for t in group],
                kinds=[t.kind for t in group],
                parent=[-1 if t.parent is None else t.parent for t in group],
                at=[-1 if t.at is None else t.at for t in group],
                n_tokens=[t.n_model_tokens for t in group],
            )
            for group in groups
        ]
        result = assign_credit(problems, self.cfg)
        self.last_nodes = result.nodes
        return [list(zip(a, m)) for a, m in zip(result.advantages, result.loss_masks)]

    def rollout_info(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[dict]]:
        """For rollout dumps: each parent's retained candidate windows with P^raw and the
        boundaries chosen at it; each node's CBV, Z and A^shared on its parent."""
        info: list[list[dict]] = []
        nodes = {(n.problem, n.parent, n.at): n for n in getattr(self, "last_nodes", [])}
        for x, (group, plan) in enumerate(zip(groups, self.last_plans)):
            rows = []
            for k, t in enumerate(group):
                if t.kind != "parent":
                    rows.append({})
                    continue
                cand = plan.candidates[k]
                chosen = sorted({b for i, b in plan.branches if i == k})
                rows.append({
                    "candidates": cand.positions.tolist(),
                    "priorities": [round(float(p), 6) for p in cand.priority],
                    "chosen": chosen,
                    "nodes": [
                        {"at": b, "cbv": nodes[(x, k, b)].cbv, "z": nodes[(x, k, b)].z, "shared": nodes[(x, k, b)].shared}
                        for b in chosen if (x, k, b) in nodes
                    ],
                })
            info.append(rows)
        return info
