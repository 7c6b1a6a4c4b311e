"""CBPO hyperparameters (Sec. 5.1 of arXiv 2608.24300), one documented dataclass.

Every default is the paper's value unless the comment says "ours". The objective's settings
(PPO clip range, KL weight and estimator, which the paper does not give) are inherited from
``cbpo.objective.ObjectiveConfig``, shared by every method.
"""
from __future__ import annotations

from dataclasses import dataclass

from cbpo.objective import ObjectiveConfig


def check_slots(budget: int, n0: int) -> None:
    """M rollout slots per problem, N_0 of them CBPO's initial parents (Sec. 5.1)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if not 0 < n0 <= budget:
        raise ValueError(f"n0 must satisfy 0 < n0 <= budget, got n0={n0}, budget={budget}")


# CBPOConfig.candidates -> the Trajectory method whose positions it offers plan_branches ("full"
# ignores them: Eq. 5's grid).
CANDIDATES = {"full": "tool_boundaries", "tool_boundary": "tool_boundaries",
              "alive_boundary": "alive_boundaries", "frontier_boundary": "frontier_boundaries"}

ROOT_CREDIT = ("paper", "centred")  # CBPOConfig.root_credit


@dataclass(frozen=True)
class CBPOConfig(ObjectiveConfig):
    # Rollout budget (Sec. 5.1: "six slots to initial trajectories and ten to ... branching").
    budget: int = 16  # M, rollout slots per problem (the same for every method)
    n0: int = 6  # N_0, initial parent trajectories

    # Stage 1: candidate scanning (Eqs. 5-9).
    w: int = 20  # window length in model tokens (Eq. 6)
    # K, top-K probabilities kept per token for the truncated entropy (Eq. 6); the trainer's
    # rollout engine computes entropies with this K.
    top_k: int = 10
    d_min: int = 64  # spacing of candidate boundaries (Eq. 5)
    top_j: int = 3  # J_max, candidates retained per parent
    alpha: float = 0.2  # base priority (Eq. 9)
    gamma: float = 2.0  # entropy-increase scale (Eq. 9)
    # "full": fixed-interval windows over the whole response (the paper). "tool_boundary":
    # windows only where the model resumes after a tool observation (the ablation the paper
    # names as missing, Sec. 6). "alive_boundary" (ours, not the paper's, issue #36): the tool
    # boundaries before the first observation that showed a dead end (a tool error, an empty
    # search), so that no branch starts below a prefix its observations already showed lost.
    # "frontier_boundary" (ours, issue #36): only the last of those, the boundary where the parent
    # made its last choice before a dead end showed (the credit simulator's oracle when every dead
    # end shows and a losing choice shows at once).
    candidates: str = "full"

    # Stage 1: balanced allocation (Eq. 10, Algorithm 1 lines 13-22).
    kappa: float = 0.25  # a branch is sampled only if P_bal > kappa
    rho_path: float = 0.2  # path-level decay exponent (0 = "w/o path-level", Table 2)
    rho_node: float = 0.2  # node-level decay exponent (0 = "w/o node-level", Table 2)
    b_node: int = 3  # B_node, hard cap of branches per node
    b_path: int = 4  # B_path, hard cap of branches per parent path

    # Stage 2: credit (Eqs. 3, 13-17).
    eta: float = 0.2  # CBV modulation strength (0 = "w/o CBV", Table 2)
    phi: float = 2.0  # bound on the relative modulation (Eq. 16)
    eps: float = 1e-6  # epsilon in Eqs. 3 and 14
    cbv_threshold: float = 1e-6  # sigma_CBV below this -> every Z = 0 (Sec. 5.1)
    # "paper": Eqs. 15-19 as written. "centred" (ours, not the paper's, issue #36): the credit of
    # each root's opening (a parent's tokens before its first node, a filler's or unbranched
    # parent's whole response) less the mean over the problem's roots, so the tokens every root
    # shares (its first tool tag, say) get zero net credit, as under GRPO (cbpo.credit).
    root_credit: str = "paper"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.candidates not in CANDIDATES:
            raise ValueError(f"candidates must be one of {tuple(CANDIDATES)}, got {self.candidates!r}")
        if self.root_credit not in ROOT_CREDIT:
            raise ValueError(f"root_credit must be one of {ROOT_CREDIT}, got {self.root_credit!r}")
        check_slots(self.budget, self.n0)
        for name in ("w", "d_min", "top_j", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("rho_path", "rho_node"):  # decay exponents of Eq. 10
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.eta < self.phi:
            # Property 3 (Eq. 28) needs 0 <= eta < phi for the sign to be preserved.
            raise ValueError(f"eta must satisfy 0 <= eta < phi, got eta={self.eta}, phi={self.phi}")
