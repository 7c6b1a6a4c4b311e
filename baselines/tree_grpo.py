"""Tree-GRPO (Ji, Ma, Wang, Chen, Chu and Wu, "Tree Search for LLM Agent Reinforcement
Learning", ICLR 2026, arXiv 2509.21240): rollouts grow as trees whose nodes are whole agent steps
(thought, tool call, observation), so continuations share exact prefixes, and each leaf is
credited relative to its own tree and to every leaf of the problem.

Implemented (official code, AMAP-ML/Tree-GRPO): M trees per problem, each started by one complete
chain; L rounds in which every tree expands N nodes drawn uniformly with replacement from its root
and its non-leaf step nodes (the points where the model resumes after a tool observation), each
expansion a complete continuation of the node's exact prefix (``baselines.agent_steps.fork``; the root
expansion is a fresh chain of the same tree); rewards on the leaves; A = A_inter + A_intra with
A_inter = GRPO over all leaves of the problem and A_intra = GRPO over the leaves of the same tree.
Every leaf trains as its whole root-to-leaf sequence, so a copied prefix keeps loss and the leaf's
advantage (shared tokens appear in several rows, as in the code); observations carry no loss.

Budget: M (1 + N L) generation calls per problem must equal the suite's 16 slots: M=4, N=3, L=1
(the paper's scripts use M=2, N=2, L=1, K=3 with 6 leaves); by default M is derived from the
budget, so a smaller budget keeps N and L and grows fewer trees. K, the leaves kept per tree, is
every leaf (K = 1 + N L = 4), so no slot is spent on a rollout that does not train.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from baselines.agent_steps import fork, fresh, grouped_advantages
from cbpo.credit import grpo_advantages
from cbpo.objective import ObjectiveConfig
from cbpo.registry import Sampler, TokenCredit, broadcast, register_method
from cbpo.rollout.agent import Job, run_jobs
from cbpo.trajectory import Trajectory


@dataclass(frozen=True)
class TreeGRPOConfig(ObjectiveConfig):
    budget: int = 16  # generation calls per problem, M (1 + N L)
    trees: int | None = None  # M; None: budget / (1 + N L), 4 at 16 slots (the paper's scripts: 2)
    expansions: int = 3  # N nodes expanded per tree and round (the paper's scripts: 2)
    rounds: int = 1  # L
    seed: int = 0  # ours: the node draws
    eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget < 1 or self.expansions < 0 or self.rounds < 0:
            raise ValueError(f"need budget >= 1, expansions >= 0, rounds >= 0; got {self.budget}, {self.expansions}, {self.rounds}")
        leaves = 1 + self.expansions * self.rounds  # per tree
        if self.trees is None and self.budget % leaves == 0:
            object.__setattr__(self, "trees", self.budget // leaves)
        if self.trees is None or self.trees * leaves != self.budget:
            raise ValueError(f"trees * (1 + expansions * rounds) generation calls must equal budget = {self.budget}, "
                             f"got trees={self.trees}, 1 + expansions * rounds = {leaves}")


def tree_of(group: Sequence[Trajectory]) -> list[int]:
    """The tree (index of its initial chain) of every rollout; parents precede their branches."""
    tree: list[int] = []
    for k, t in enumerate(group):
        tree.append(k if t.parent is None else tree[t.parent])
    return tree


def expandable_nodes(group: Sequence[Trajectory], root: int) -> list[tuple[int, int]]:
    """(rollout, boundary) of the tree's root and its non-leaf step nodes, each node once: a
    branch owns only the nodes after its own branch point (earlier ones are its parent's)."""
    tree = tree_of(group)
    nodes = [(root, 0)]
    for k, t in enumerate(group):
        if tree[k] == root:
            nodes += [(k, b) for b in t.tool_boundaries() if b > (t.at or 0)]
    return nodes


def tree_advantages(rewards: Sequence[float], tree: Sequence[int], eps: float = 1e-6) -> np.ndarray:
    """A = A_inter (GRPO over all leaves of the problem) + A_intra (GRPO within each tree)."""
    return grpo_advantages(np.asarray(rewards, dtype=np.float64), eps) + grouped_advantages(rewards, tree, eps)


@register_method("tree_grpo")
class TreeGRPO:
    display_name = "Tree-GRPO"
    paper = "Ji et al., 2026, Tree Search for LLM Agent Reinforcement Learning (ICLR), arXiv 2509.21240"
    group = "agentic-rl"
    trains = True
    implemented = "M trees, N random step-node expansions per round (exact prefixes), A = inter-tree + intra-tree GRPO"
    config = TreeGRPOConfig

    def __init__(self, vocab_size: int, **overrides: Any):
        # vocab_size is part of every method's constructor; the tree search does not need it.
        self.cfg = TreeGRPOConfig.from_overrides(overrides)
        self.rng = np.random.default_rng(self.cfg.seed)

    def collect(self, prompts: Sequence[list[int]], sample: Sampler) -> list[list[Trajectory]]:
        return run_jobs([self._rollouts(p) for p in prompts], sample)

    def _rollouts(self, prompt: list[int]) -> Job:
        """One problem's trees: each round's expansions start once its previous round is done."""
        cfg = self.cfg
        group = yield fresh(prompt, cfg.trees)
        for _ in range(cfg.rounds):
            requests = []
            for root in range(cfg.trees):
                nodes = expandable_nodes(group, root)
                for n in self.rng.integers(len(nodes), size=cfg.expansions):
                    k, b = nodes[n]
                    requests.append(fork(group[k], b, k))
            group += yield requests
        return group

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        return [broadcast(g, tree_advantages([t.reward for t in g], tree_of(g), self.cfg.eps)) for g in groups]
