"""OPD, on-policy distillation (Li et al., 2026, "Rethinking On-Policy Distillation of Large
Language Models: Phenomenology, Mechanism, and Recipe", arXiv 2604.13016): the student samples
its own rollouts and a stronger teacher scores every student token; the negative reverse KL
(student || teacher) at the states the student visits is a dense reward, optimised with an RL
surrogate and no discounting.

Implemented: M = 16 independent student rollouts per problem; per model token
    A_t = r_t = log pi_T(y_t | s_t) - log pi_S(y_t | s_t)
(the code's sampled-token form, ``LOG_PROB_TOP_K=0`` with ``token_reward_direct``: no return
accumulation, no normalisation), both log-probs computed here on the student's exact tokens at
the temperature the policy is scored at; observation tokens are context for both models and get
no reward or loss. PPO clip 0.2, token-mean aggregation, no reference-KL term (the OPD scripts).
The outcome reward is logged but does not enter the advantage.

The teacher is ``teacher``, a checkpoint that must share the student's tokenizer (checked at
setup: the rewards compare the two models on the same token ids). On the tiny preset it is a
stronger tiny model the DAG trains with the same tokenizer (the SFT recipe run longer or wider).
At paper scale it is Qwen3-32B, the largest dense Qwen3 and so the largest same-family teacher
that shares Qwen3-1.7B's and Qwen3-4B's tokenizer (only its forward pass is needed).

Departures: the OPD code's default reward sums the log-ratio over the student's top-16 tokens
weighted by the student's probabilities (a truncated exact reverse KL); the sampled-token form
used here is its one-sample estimate, which the code also offers. On the local backend the
teacher runs inside the training process.

On ``backend=verl`` OPD is verl's own on-policy distillation (cbpo/backends/verl/config.py): the
teacher's vLLM servers, on GPUs of their own, return log pi_T of every token of each rollout as
the agent loop finishes it, and verl's k1 estimator with policy gradient gives every model token
A_t = -(log pi_S - log pi_T) in its vanilla PPO loss, with this clip and aggregation, no clamps
and no task-reward term. Departures there: log pi_S is the actor's at the update, so with
``rl.ppo_mini_batches`` > 1 every mini-batch after the first takes it from the partly updated
student rather than the sampling policy; the teacher is scored at temperature 1 whatever
``rl.temperature`` (the paper preset's is 1); verl's loss keeps dual-clip PPO (ratio bound 3 on
negative advantages), which the local objective turns off; and ``setup``'s tokenizer check does
not run (the teacher's server scores the student's token ids as they are).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from cbpo.logprobs import model_token_logprobs
from cbpo.objective import ObjectiveConfig
from cbpo.registry import TokenCredit, register_method
from cbpo.trajectory import Trajectory


@dataclass(frozen=True)
class OPDConfig(ObjectiveConfig):
    budget: int = 16  # rollouts per problem (the suite's 16 slots; the OPD scripts sample 4)
    teacher: str | None = None  # checkpoint directory or hub id; required to train
    loss_agg_mode: str = "token-mean"  # the OPD scripts (verl's default)
    beta: float = 0.0  # use_kl_loss=False: the teacher is the only anchor


@register_method("opd", distilled=True)
class OPD:
    display_name = "OPD"
    paper = "Li et al., 2026, Rethinking On-Policy Distillation of Large Language Models, arXiv 2604.13016"
    group = "supervised"
    trains = True
    implemented = "student rollouts; per-token advantage log pi_teacher - log pi_student on the sampled tokens (reverse KL)"
    config = OPDConfig

    def __init__(self, vocab_size: int | None = None, **overrides: Any):
        # vocab_size is part of every method's constructor; the tokenizer check happens at setup.
        self.cfg = OPDConfig.from_overrides(overrides)
        self.student = self.teacher = None

    def setup(self, model, tokenizer, temperature: float) -> None:
        from cbpo.models import load_model

        if not self.cfg.teacher:
            raise ValueError("opd needs a teacher: set method.teacher to a checkpoint that shares the student's tokenizer")
        teacher, teacher_tokenizer = load_model(self.cfg.teacher)
        if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"opd teacher {self.cfg.teacher} has another tokenizer than the student "
                f"({len(teacher_tokenizer)} vs {len(tokenizer)} tokens, or different ids): the teacher "
                "must score the student's own token ids, so both need the same tokenizer"
            )
        param = next(model.parameters())
        self.teacher = teacher.to(device=param.device, dtype=param.dtype).eval().requires_grad_(False)
        self.student, self.pad_id, self.temperature = model, tokenizer.pad_token_id, temperature

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        if self.teacher is None:
            raise RuntimeError("opd: setup(model, tokenizer, temperature) must run before credit")
        flat = [t for g in groups for t in g]
        teacher = model_token_logprobs(self.teacher, flat, self.pad_id, self.temperature)
        student = model_token_logprobs(self.student, flat, self.pad_id, self.temperature)
        rewards = iter(zip(teacher, student))
        return [[(lt - ls, np.ones(t.n_model_tokens, dtype=np.int8)) for t, (lt, ls) in zip(g, rewards)] for g in groups]
