"""One registry for every training method (CBPO and the baselines), in the spirit of verl's
``register_adv_est``: a method module decorates its class with ``@register_method("name")``.

A method decides two things and nothing else: which rollouts to collect for a problem under
the shared budget of M slots (``collect``), and how outcome rewards become per-model-token
advantages and loss masks (``credit``). The trainer owns everything else.
"""
from __future__ import annotations

import importlib
from typing import Callable, Protocol, Sequence

import numpy as np

from cbpo.trajectory import Trajectory

# name -> module that registers it (imported lazily so a method's dependencies load on use).
METHOD_MODULES = {
    "grpo": "baselines.grpo",
    "cbpo": "cbpo.method",
}

_REGISTRY: dict[str, type] = {}

Sampler = Callable[[list[Trajectory]], list[Trajectory]]
TokenCredit = tuple[np.ndarray, np.ndarray]  # (advantage per model token, 0/1 loss mask)


class Method(Protocol):
    name: str
    policy_loss: str  # a verl policy-loss name ("vanilla" = PPO clip, Eqs. 20-22)

    def collect(self, prompts: Sequence[list[int]], sample: Sampler) -> list[list[Trajectory]]:
        """Exactly ``budget`` rollouts per prompt, sampled through ``sample`` (batched)."""

    def credit(self, groups: Sequence[Sequence[Trajectory]]) -> list[list[TokenCredit]]:
        """Per-model-token advantages and loss masks for rewarded rollouts."""


def register_method(name: str):
    def deco(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_method(name: str) -> type:
    if name not in METHOD_MODULES:
        raise KeyError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHOD_MODULES))}")
    importlib.import_module(METHOD_MODULES[name])
    return _REGISTRY[name]


def known_methods() -> list[str]:
    return sorted(METHOD_MODULES)
