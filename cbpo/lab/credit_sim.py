"""A tabular model of sequential tool decisions, trained with the suite's own branching and
credit: where do the methods differ, and does CBPO branch where it matters?

    python -m cbpo.lab.credit_sim --decisions 4 --choices 3 --seeds 3

A response is D decisions, each a k-way choice, in the tool format the tasks use. Each decision
is one model token. It is followed by ``execution`` tokens of fixed entropy and success rate,
then a tool observation, which is not a model token. So decision d sits at model-token position
``d * (1 + execution)``. The model then resumes after the observation there: that position is
the tool boundary ``candidates=tool_boundary`` scans. The policy is a table of logits, one
softmax per decision, that does not depend on earlier choices. The right choice is fixed per
decision, and every decision starts with the same probability of it (``--start``, the SFT
policy). The reward is sparse:

- ``all``: 1 only when every decision is right and every execution succeeded;
- ``fraction``: the share of right decisions, times the executions' success.

Each update samples ``problems`` groups of M = ``budget`` rollouts. A method turns their rewards
into per-token advantages. A decision token's advantage, where its loss mask is 1, moves its
softmax along the tabular policy gradient. The methods:

- ``grpo``: M fresh rollouts, Eq. 3 on every token (``cbpo.credit.grpo_advantages``).
- ``cbpo``: the paper's settings. N_0 parents; ``cbpo.branching.plan_branches`` on their token
  entropies (Eqs. 5-10); the branches, which copy the parent's choices before their branch point
  and resample the rest; fillers; ``cbpo.credit.assign_credit`` (Eqs. 13-19).
- ``cbpo-boundary``: CBPO with ``candidates=tool_boundary`` and alpha = 0.3 > kappa, the
  suite's variant that scans only where the model resumes after a tool observation.
- ``cbpo-alive``: ``cbpo-boundary`` offered only the tool boundaries whose prefix no
  observation has shown to be dead: a wrong choice's observation shows the dead end with
  probability ``reveal``. Not the paper's CBPO: an extension that reads the observations.
- ``random``: CBPO's budget split and credit, with branch points drawn uniformly over the
  response: a control for where branches start.
- ``oracle``: CBPO's credit, with each branch started at the parent's first wrong decision, so
  that it lies below a prefix that is still right. A control no real method can run: it knows
  the right choices.

It prints, per setting and method:

- the median number of updates until every decision is right with probability ``target``;
- the expected reward after ``report_at`` updates;
- the branches per update;
- the share of branches that resample a decision, i.e. start anywhere between the previous
  decision and it;
- the share that start below a prefix which has already failed.

The paper gives no such model. Every number here is a property of this model, not of a
language model: it shows where the mechanism can separate methods, not that it does on real
tasks.
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from cbpo.branching import plan_branches
from cbpo.config import CBPOConfig
from cbpo.credit import ProblemRollouts, assign_credit, grpo_advantages

REWARDS = ("all", "fraction")


@dataclass(frozen=True)
class World:
    """The task: D decisions of k choices, each followed by execution and a tool observation."""

    decisions: int = 4  # D
    choices: int = 3  # k
    execution: int = 30  # model tokens after each decision, before its tool call
    exec_entropy: float = 0.5  # nats per execution token (the engine's top-K entropy)
    exec_success: float = 1.0  # chance that one segment's execution succeeds
    start: float = 0.5  # probability of the right choice at every decision before training
    reveal: float = 1.0  # chance that a wrong choice's tool observation shows the dead end
    reward: str = "all"  # all | fraction
    vocab: int = 32000  # |V| of Eq. 6's normalisation

    def __post_init__(self) -> None:
        if self.decisions < 1 or self.choices < 2 or self.execution < 0:
            raise ValueError("need decisions >= 1, choices >= 2 and execution >= 0")
        if not 0 < self.start < 1 or not 0 < self.exec_success <= 1 or not 0 <= self.reveal <= 1:
            raise ValueError("start must lie in (0, 1), exec_success in (0, 1] and reveal in [0, 1]")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")

    @property
    def positions(self) -> np.ndarray:
        """Model-token position of each decision."""
        return np.arange(self.decisions) * (1 + self.execution)

    @property
    def n_tokens(self) -> int:
        return self.decisions * (1 + self.execution)


@dataclass(frozen=True)
class Training:
    problems: int = 8  # groups per update
    budget: int = 16  # M, rollouts per group for every method
    lr: float = 0.1  # step size of the tabular policy gradient
    max_steps: int = 800
    target: float = 0.8  # every decision right with at least this probability
    report_at: int = 50  # the expected reward is read after this many updates


@dataclass
class Rollouts:
    """One group's rollouts: choices and execution outcomes per decision, and how each was made."""

    choices: np.ndarray  # (n, D) chosen index; 0 is the right choice
    executed: np.ndarray  # (n, D) execution of each segment succeeded
    kinds: list[str]
    parent: np.ndarray
    at: np.ndarray


def initial_logits(world: World) -> np.ndarray:
    wrong = (1 - world.start) / (world.choices - 1)
    return np.log(np.tile([world.start] + [wrong] * (world.choices - 1), (world.decisions, 1)))


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample(world: World, probs: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` fresh responses: a choice per decision from the policy, an execution outcome per segment."""
    u = rng.random((n, world.decisions, 1))
    choices = (u > np.cumsum(probs, axis=-1)[None]).sum(axis=-1)
    return np.minimum(choices, world.choices - 1), rng.random((n, world.decisions)) < world.exec_success


def rewards(world: World, choices: np.ndarray, executed: np.ndarray) -> np.ndarray:
    right = choices == 0
    if world.reward == "all":
        return (right & executed).all(axis=1).astype(np.float64)
    return right.mean(axis=1) * executed.all(axis=1)


def token_entropies(world: World, probs: np.ndarray) -> np.ndarray:
    """Per model token: the decision's softmax entropy on its token, ``exec_entropy`` elsewhere.
    The policy is the same for every response, so every parent has these entropies."""
    ent = np.full(world.n_tokens, world.exec_entropy)
    ent[world.positions] = -(probs * np.log(probs)).sum(axis=-1)
    return ent


def branch(world: World, choices: np.ndarray, executed: np.ndarray, b: int, probs: np.ndarray,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A continuation of one parent from model token ``b``: what lies before b is copied, the
    rest is sampled again (a segment's execution is decided at its last token)."""
    fresh_c, fresh_e = sample(world, probs, 1, rng)
    keep_choice = world.positions < b
    keep_exec = world.positions + world.execution < b
    return np.where(keep_choice, choices, fresh_c[0]), np.where(keep_exec, executed, fresh_e[0])


# ----------------------------------------------------------------------------- branch points

BranchPoints = Callable[[World, np.ndarray, np.ndarray, np.ndarray, int, np.random.Generator], list[tuple[int, int]]]


def planned_points(cfg: CBPOConfig, alive_only: bool = False) -> BranchPoints:
    """CBPO's Stage 1 (``plan_branches``) on the parents' entropies. ``alive_only`` (tool
    boundaries only) offers each parent only the boundaries that resample its first dead end
    that an observation showed, or an earlier decision: a branch then never keeps a choice its
    own context already shows to be wrong."""

    def points(world, probs, choices, executed, slots, rng):
        ent = token_entropies(world, probs)
        bounds = [world.positions[1:].tolist()] * len(choices) if cfg.candidates == "tool_boundary" else None
        if alive_only:
            shown = (choices != 0) & (rng.random(choices.shape) < world.reveal)  # dead ends the observations show
            last = [int(np.argmax(row)) if row.any() else world.decisions - 1 for row in shown]
            bounds = [world.positions[1 : last[i] + 1].tolist() for i in range(len(choices))]
        plan = plan_branches([ent] * len(choices), world.vocab, cfg, bounds, budget=len(choices) + slots)
        return plan.branches

    return points


def random_points(world, probs, choices, executed, slots, rng):
    """Branch points uniform over the response, parents in turn."""
    return [(j % len(choices), int(rng.integers(1, world.n_tokens))) for j in range(slots)]


def oracle_points(world, probs, choices, executed, slots, rng):
    """Each failed parent's first wrong decision (its prefix is still right), in turn."""
    wrong = (choices != 0) | ~executed
    first = [int(np.argmax(w)) for w in wrong]
    failed = [i for i, w in enumerate(wrong) if w.any()]
    return [(i, int(world.positions[first[i]])) for i in (failed[j % len(failed)] for j in range(slots))] if failed else []


METHODS: dict[str, BranchPoints | None] = {
    "grpo": None,
    "cbpo": planned_points(CBPOConfig()),
    "cbpo-boundary": planned_points(CBPOConfig(candidates="tool_boundary", alpha=0.3)),
    "cbpo-alive": planned_points(CBPOConfig(candidates="tool_boundary", alpha=0.3), alive_only=True),
    "random": random_points,
    "oracle": oracle_points,
}


# ----------------------------------------------------------------------------- one group

def group(world: World, probs: np.ndarray, budget: int, points: BranchPoints | None, n0: int,
          rng: np.random.Generator) -> Rollouts:
    if points is None:
        c, e = sample(world, probs, budget, rng)
        return Rollouts(c, e, ["fill"] * budget, np.full(budget, -1), np.full(budget, -1))
    c, e = sample(world, probs, n0, rng)
    kinds, parent, at = ["parent"] * n0, [-1] * n0, [-1] * n0
    rows_c, rows_e = list(c), list(e)
    for p, b in points(world, probs, c, e, budget - n0, rng):
        bc, be = branch(world, c[p], e[p], b, probs, rng)
        rows_c.append(bc)
        rows_e.append(be)
        kinds.append("branch")
        parent.append(p)
        at.append(b)
    fill = budget - len(kinds)
    if fill:
        fc, fe = sample(world, probs, fill, rng)
        rows_c += list(fc)
        rows_e += list(fe)
        kinds += ["fill"] * fill
        parent += [-1] * fill
        at += [-1] * fill
    return Rollouts(np.array(rows_c), np.array(rows_e), kinds, np.array(parent), np.array(at))


def branch_stats(world: World, g: Rollouts) -> tuple[int, int, int]:
    """(branches, those that resample a decision, those below a prefix that already failed)."""
    is_branch = np.array([k == "branch" for k in g.kinds])
    if not is_branch.any():
        return 0, 0, 0
    at, parent = g.at[is_branch], g.parent[is_branch]
    at_decision = at <= world.positions[-1]
    wrong = (g.choices[parent] != 0) | ~g.executed[parent]
    failed_before = ((world.positions[None] < at[:, None]) & wrong).any(axis=1)
    return int(is_branch.sum()), int(at_decision.sum()), int(failed_before.sum())


# ----------------------------------------------------------------------------- training

@dataclass
class Run:
    steps_to_target: int | None
    reward_at: float  # expected reward after report_at updates
    branches: int
    at_decision: int
    below_failed: int
    steps: int


def expected_reward(world: World, probs: np.ndarray) -> float:
    right, ok = probs[:, 0], world.exec_success ** world.decisions
    return float((right.prod() if world.reward == "all" else right.mean()) * ok)


def train(world: World, method: str, training: Training, seed: int) -> Run:
    """One run: updates until every decision reaches ``target`` (and at least ``report_at``
    updates, where the reward is read), at most ``max_steps``."""
    rng = np.random.default_rng(seed)
    logits = initial_logits(world)
    points, cfg = METHODS[method], CBPOConfig(budget=training.budget)
    positions = world.positions
    reached, reward_at, totals = None, None, np.zeros(3, dtype=np.int64)
    for step in range(training.max_steps + 1):
        probs = softmax(logits)
        if step == training.report_at:
            reward_at = expected_reward(world, probs)
        if reached is None and probs[:, 0].min() >= training.target:
            reached = step
        if (reached is not None and step >= training.report_at) or step == training.max_steps:
            break
        groups = [group(world, probs, training.budget, points, cfg.n0, rng) for _ in range(training.problems)]
        grad = np.zeros_like(logits)
        if points is None:
            for g in groups:
                adv = grpo_advantages(rewards(world, g.choices, g.executed), cfg.eps)
                _accumulate(grad, g.choices, probs, np.repeat(adv[:, None], world.decisions, axis=1))
        else:
            problems = [ProblemRollouts(rewards(world, g.choices, g.executed), g.kinds, g.parent, g.at,
                                        np.full(len(g.kinds), world.n_tokens)) for g in groups]
            credit = assign_credit(problems, cfg)
            for g, adv, mask in zip(groups, credit.advantages, credit.loss_masks):
                token_adv = np.stack([a[positions] * m[positions] for a, m in zip(adv, mask)])
                _accumulate(grad, g.choices, probs, token_adv)
                totals += branch_stats(world, g)
        logits += training.lr * grad / (training.problems * training.budget)
    return Run(reached, reward_at if reward_at is not None else expected_reward(world, softmax(logits)),
               *totals.tolist(), steps=step)


def _accumulate(grad: np.ndarray, choices: np.ndarray, probs: np.ndarray, advantages: np.ndarray) -> None:
    """sum over rollouts of A_{r,d} (onehot(a_{r,d}) - pi_d): the softmax's log-likelihood gradient."""
    onehot = np.eye(probs.shape[1])[choices]  # (n, D, k)
    grad += (advantages[:, :, None] * (onehot - probs[None])).sum(axis=0)


# ----------------------------------------------------------------------------- the table

def summarise(world: World, method: str, runs: Sequence[Run], training: Training) -> dict:
    steps = [r.steps_to_target for r in runs]
    reached = [s for s in steps if s is not None]
    # the median over seeds, counting a run that never reached the target as beyond max_steps
    median = float(np.median([s if s is not None else np.inf for s in steps]))
    branches = sum(r.branches for r in runs)
    updates = sum(r.steps for r in runs)
    return {
        "D": world.decisions, "k": world.choices, "reward": world.reward, "method": method,
        "median steps to target": f"> {training.max_steps}" if not np.isfinite(median) else f"{median:.0f}",
        "reached": f"{len(reached)}/{len(runs)}",
        f"reward at {training.report_at}": f"{np.mean([r.reward_at for r in runs]):.3f}",
        "branches per update": f"{branches / max(updates, 1):.1f}",
        "at a decision": f"{sum(r.at_decision for r in runs) / branches:.0%}" if branches else "—",
        "below a failed prefix": f"{sum(r.below_failed for r in runs) / branches:.0%}" if branches else "—",
    }


def markdown(rows: Sequence[dict]) -> str:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows])


def _train(job: tuple) -> Run:
    return train(*job)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cbpo.lab.credit_sim", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--decisions", type=_ints, default=[4], help="D, decisions per response; a comma list runs each")
    parser.add_argument("--choices", type=_ints, default=[3], help="k, choices per decision; a comma list runs each")
    parser.add_argument("--seeds", type=int, default=20, help="independent runs per setting and method (seeds 0..N-1)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    parser.add_argument("--reward", default="all", help="comma list of all (every decision right) | fraction (share right)")
    parser.add_argument("--start", type=float, default=World.start, help="probability of the right choice before training")
    parser.add_argument("--execution", type=int, default=World.execution, help="model tokens of execution after each decision")
    parser.add_argument("--exec-entropy", type=float, default=World.exec_entropy, help="entropy of an execution token (nats)")
    parser.add_argument("--reveal", type=float, default=World.reveal,
                        help="chance that a wrong choice's tool observation shows the dead end (cbpo-alive reads it)")
    parser.add_argument("--exec-success", type=float, default=World.exec_success, help="chance one segment's execution succeeds")
    parser.add_argument("--lr", type=float, default=Training.lr, help="step size of the tabular policy gradient")
    parser.add_argument("--max-steps", type=int, default=Training.max_steps, help="updates before a run gives up")
    parser.add_argument("--jobs", type=int, default=1, help="processes running seeds at once")
    parser.add_argument("--report-at", type=int, default=Training.report_at, help="updates after which the expected reward is read")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    training = Training(lr=args.lr, max_steps=args.max_steps, report_at=args.report_at)
    worlds = [World(decisions=d, choices=k, execution=args.execution, exec_entropy=args.exec_entropy,
                    exec_success=args.exec_success, start=args.start, reward=reward, reveal=args.reveal)
              for d in args.decisions for k in args.choices for reward in args.reward.split(",")]
    cells = [(world, method) for world in worlds for method in methods]
    t0 = time.perf_counter()
    # every run is independent: seeds of every cell go to the workers at once
    jobs = [(world, method, training, seed) for world, method in cells for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        done = pool.map(_train, jobs, chunksize=4) if pool else map(_train, jobs)
        runs = list(tqdm(done, total=len(jobs), desc="runs", unit="run", dynamic_ncols=True))
    rows = [summarise(world, method, runs[i * args.seeds : (i + 1) * args.seeds], training)
            for i, (world, method) in enumerate(cells)]
    print(markdown(rows))
    print(f"\n{args.seeds} seeds; start={args.start}, reveal={args.reveal}, execution={args.execution} tokens "
          f"({args.exec_entropy} nats, success {args.exec_success}), problems={training.problems} x "
          f"budget={training.budget}, lr={args.lr}, target={training.target}; "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
