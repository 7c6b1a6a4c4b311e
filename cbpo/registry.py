"""One registry for every Table 1 method (CBPO and the baselines), in the spirit of verl's
``register_adv_est``: a method module decorates its class with ``@register_method("name")``.

A training method decides two things and nothing else: which rollouts to collect for a problem
under the shared budget of M slots (``collect``), and how outcome rewards become
per-model-token advantages and loss masks (``credit``). Its config (``cfg``) extends
:class:`cbpo.objective.ObjectiveConfig`, so the loss knobs are set the same way for all. The
trainer owns everything else. Rows that do not train (Base, TIR prompting, SFT) are registered
too, with ``trains = False``: they name the checkpoint and prompt an evaluation uses.

Optional hooks, for methods that need more of the trainer. A method without one gets the
default, which is what GRPO does; :func:`setup`, :func:`prompt_pool`, :func:`collect` and
:func:`step_stats` are the trainer's view of them.

- ``setup(model, tokenizer, temperature)``: called once before the first step with the policy
  being trained, its tokenizer and the temperature the policy is scored at (OPD loads its
  teacher, OC-GRPO rescores its privileged rollouts). Default: nothing.
- ``prompt_pool``: the trainer offers ``collect`` this many batches of the step's size
  (DAPO's dynamic sampling draws from them). Default 1.
- ``collect(prompts, sample)``: exactly ``budget`` rollouts per prompt, sampled through
  ``sample`` (batched). Default: ``budget`` fresh rollouts of each prompt (GRPO's).
- ``collect(prompts, sample, problems)``: a collect that takes a third parameter gets a
  :class:`Problems` for the offered prompts (rows, prompt encoding, in-loop rewards). It returns
  one group per offered prompt; an empty group means the prompt is not trained on. The trainer
  rewards every rollout still without a reward afterwards.
- ``step_stats()``: numbers about the last ``collect`` for the step's metrics record, e.g. the
  rollouts DAPO drew but does not train on. Default: none.

Facts a backend needs about a method are declared where it registers (``register_method``'s
keywords, read as class attributes), as verl's ``register_adv_est`` names an estimator at its
definition: the backends read them and keep no table of method names.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from cbpo.objective import ObjectiveConfig
from cbpo.trajectory import Trajectory

# A method is its config, configs/method/<name>.yaml, and the module that registers it,
# baselines/<name>.py (imported on use, so a method's dependencies load only where it runs): a
# new baseline is those two files (docs/add-a-method.md). These methods register elsewhere.
METHOD_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "method"
OTHER_MODULES = {"base": "baselines.training_free", "tir": "baselines.training_free", "sft": "baselines.training_free",
                 "cbpo": "cbpo.method"}
# Listings follow Table 1's order, then the two branch methods the suite adds, then any other.
TABLE_ORDER = ("base", "tir", "sft", "opd", "grpo", "reinforce_pp", "dapo", "gspo", "eapo", "oc_grpo", "gigpo",
               "tree_grpo", "arpo", "cbpo", "aepo", "branpo")
GROUPS = ("training-free", "supervised", "classic-rl", "agentic-rl")

_REGISTRY: dict[str, type] = {}

Sampler = Callable[[list[Trajectory]], list[Trajectory]]
TokenCredit = tuple[np.ndarray, np.ndarray]  # (advantage per model token, 0/1 loss mask)


class Method(Protocol):
    """Class attributes describe the method for tables and ``python -m cbpo methods``."""

    name: str  # set by register_method, as are the facts it declares (verl_estimator, distilled,
    # off_context_credit)
    display_name: str  # as Table 1 prints it
    paper: str  # authors, year, title, arXiv id
    group: str  # one of GROUPS
    trains: bool  # False for rows evaluated without RL (base, tir, sft)
    implemented: str  # one line: what this suite implements
    config: type  # the frozen config dataclass; its fields and defaults are the method's knobs

    cfg: Any  # an instance of ``config``

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        """Per-model-token advantages and loss masks for rewarded rollouts."""


@dataclass(frozen=True)
class Problems:
    """What the trainer knows about the prompts it offers ``collect``, for methods that need
    more than token ids (DAPO's dynamic sampling, OC-GRPO's privileged context)."""

    rows: Sequence[Mapping[str, Any]]  # the data row of each offered prompt (question, answer, ...)
    encode: Callable[[str], list[int]]  # a question -> its prompt ids, built as the trainer builds prompts
    # score(groups, indices): sets the reward of every rollout in groups[k] against rows[indices[k]]
    score: Callable[[Sequence[Sequence[Trajectory]], Sequence[int]], None]


def register_method(name: str, *, verl_estimator: str | Callable[[Any], str] | None = None, distilled: bool = False,
                    off_context_credit: bool = False):
    """Registers a method class under ``name``, with what a backend must know of it:

    - ``verl_estimator``: verl's own advantage estimator where one computes what the method's
      ``credit`` does (a name, or a function of the method's config); None: the suite's credit.
    - ``distilled``: its advantage is on-policy distillation from a teacher (OPD), which verl's
      distillation computes on the teacher's own GPUs.
    - ``off_context_credit``: its credit scores rollouts in a context other than the one they were
      sampled in (OC-GRPO's hint-free rescoring), so the policy's log-probs are recomputed there.
    """
    def deco(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        cls.verl_estimator, cls.distilled, cls.off_context_credit = verl_estimator, distilled, off_context_credit
        _REGISTRY[name] = cls
        return cls

    return deco


def method_names() -> list[str]:
    """Every method with a config, in listing order."""
    return list(_method_names())


@functools.cache
def _method_names() -> tuple[str, ...]:
    names = {p.stem for p in METHOD_CONFIGS.glob("*.yaml")}
    return (*(n for n in TABLE_ORDER if n in names), *sorted(names - set(TABLE_ORDER)))


def get_method(name: str) -> type:
    if name not in method_names():
        raise KeyError(f"unknown method {name!r}; known methods: {', '.join(known_methods())}")
    importlib.import_module(OTHER_MODULES.get(name, f"baselines.{name}"))
    if name not in _REGISTRY:
        raise KeyError(f"method {name!r}: baselines/{name}.py registers no @register_method({name!r})")
    return _REGISTRY[name]


def build_method(cfg, vocab_size: int | None):
    """The method named by a run config's ``method.name`` with every other ``method.*`` setting
    (what both backends train)."""
    from omegaconf import OmegaConf

    params = OmegaConf.to_container(cfg.method, resolve=True)
    return get_method(params.pop("name"))(vocab_size=vocab_size, **params)


def known_methods() -> list[str]:
    return sorted(method_names())


def verl_estimator(method_cls, method_cfg) -> str | None:
    """The method's ``verl_estimator`` for this config (None: the suite's credit)."""
    est = method_cls.verl_estimator
    return est(method_cfg) if callable(est) else est


# ----------------------------------------------------------------------------- shared pieces

def sample_fresh(prompts: Sequence[list[int]], n: int, sample: Sampler, kind: str = "parent") -> list[list[Trajectory]]:
    """``n`` complete rollouts from each prompt, all in one batched call."""
    done = sample([Trajectory(prompt_ids=list(p), kind=kind) for p in prompts for _ in range(n)])
    return [done[i * n : (i + 1) * n] for i in range(len(prompts))]


def broadcast(group: Sequence[Trajectory], advantages: Sequence[float]) -> list[TokenCredit]:
    """Each rollout's advantage on every one of its model tokens, all of them with loss."""
    return [(np.full(t.n_model_tokens, float(a)), np.ones(t.n_model_tokens, dtype=np.int8)) for t, a in zip(group, advantages)]


def extra_stats(drawn: Iterable[Trajectory], trained: Iterable[Sequence[Trajectory]]) -> dict[str, int]:
    """What the rollouts drawn and not trained on cost (DAPO's dynamic sampling), under the
    metrics lines' keys: their number, generated tokens and tool calls."""
    kept = {id(t) for g in trained for t in g}
    extra = [t for t in drawn if id(t) not in kept]
    return {"extra_rollouts": len(extra), "extra_generated_tokens": sum(t.generated_tokens for t in extra),
            "extra_tool_calls": sum(t.tool_calls - t.copied_tool_calls for t in extra)}


# ----------------------------------------------------------------------------- optional hooks

def setup(method, model, tokenizer, temperature: float) -> None:
    if hasattr(method, "setup"):
        method.setup(model, tokenizer, temperature)


def prompt_pool(method) -> int:
    return getattr(method, "prompt_pool", 1)


def collect(method, prompts: Sequence[list[int]], sample: Sampler, problems: Problems) -> list[list[Trajectory]]:
    if not hasattr(method, "collect"):  # GRPO's: ``budget`` fresh rollouts of each prompt
        return sample_fresh(prompts, method.cfg.budget, sample)
    if len(inspect.signature(method.collect).parameters) > 2:
        return method.collect(prompts, sample, problems)
    return method.collect(prompts, sample)


def reward_kl(method) -> float:
    """beta of a KL penalty in the method's token reward (REINFORCE++); 0: none. Where > 0 the
    trainer fills each rollout's ``ref_kl`` before ``credit``."""
    return float(getattr(method, "reward_kl", 0.0))


def step_stats(method) -> dict[str, float]:
    return method.step_stats() if hasattr(method, "step_stats") else {}


# ----------------------------------------------------------------------------- listing

def describe(name: str) -> dict[str, Any]:
    """``{"name", "display_name", "paper", "group", "trains", "knobs"}``; knobs are the config's
    fields with their defaults."""
    cls = get_method(name)
    knobs = asdict(cls.config())
    if not cls.trains:  # a row that does not train has no objective to tune
        knobs = {k: v for k, v in knobs.items() if k not in ObjectiveConfig.__dataclass_fields__}
    return {
        "name": name,
        "display_name": cls.display_name,
        "paper": cls.paper,
        "group": cls.group,
        "trains": cls.trains,
        "knobs": knobs,
    }


def methods_json() -> str:
    return json.dumps([describe(name) for name in method_names()])


def methods_table() -> str:
    """A Markdown table: name, paper, what is implemented, knobs. The knobs column lists the
    method's own knobs and the objective knobs it sets differently from the shared defaults
    (``--json`` lists every knob)."""
    shared = asdict(ObjectiveConfig())
    lines = ["| name | paper | implemented | knobs |", "| --- | --- | --- | --- |"]
    for name in method_names():
        info = describe(name)
        own = {k: v for k, v in info["knobs"].items() if k not in shared or shared[k] != v}
        knobs = ", ".join(f"{k}={v}" for k, v in own.items())
        lines.append(f"| `{name}` | {info['paper']} | {get_method(name).implemented} | {knobs} |")
    return "\n".join(lines)
