"""The configuration's schema, so that every bad setting is named.

Hydra composes ``configs/`` onto typed nodes (registered in its ConfigStore): an override of
the wrong type, or of a key that does not exist, fails before anything runs and names the full
key (``rl.temperature=abc``), and every option exists under every preset without a ``+``. Range
checks are the settings dataclasses' own ``__post_init__``; ``validate`` runs them all before a
job starts, naming the key (``rl.steps must be >= 1, got 0``).

Each setting is defined once: ``SFTConfig`` and ``RLConfig`` (cbpo/stages.py, with the
agent's ``AgentConfig``) and each method's config dataclass are the schema of ``sft``, ``rl`` and
``method``; the sections only the entry points read are defined here. Values live in the YAML.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from cbpo import device
from cbpo.config import check_slots
from cbpo.registry import get_method
from cbpo.stages import RLConfig, SFTConfig
from cbpo.tools import ToolsConfig


# Sections defined here. Their values come from configs/ (no defaults); like every settings
# dataclass, each error message starts with the field's name.
@dataclass
class RolloutConfig:
    """Rollout slots per problem, the same for every method (Sec. 5.1); methods read them."""

    budget: int  # M
    n0: int  # N_0, CBPO's initial parents

    def __post_init__(self) -> None:
        check_slots(self.budget, self.n0)


@dataclass
class ScanConfig:
    """CBPO's candidate scan lengths in model tokens (Eqs. 5-6), scaled per preset."""

    w: int
    d_min: int

    def __post_init__(self) -> None:
        for name in ("w", "d_min"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class EvaluationConfig:
    n_samples: int  # per problem: Pass@1 averages them, Pass@k needs k
    batch_size: int  # problems per generation call
    limit: int | None  # first N problems of a benchmark; None: all
    temperature: float  # 0: greedy
    engine: str  # hf (transformers on the run's device) | vllm (eval/run.py's make_engine)
    # A task with decisions (cbpo.tasks.forks): the winning choice forced at its first N
    # decisions, a diagnostic of what the policy can finish (0: an ordinary evaluation).
    forced: int

    def __post_init__(self) -> None:
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"engine must be 'hf' or 'vllm', got {self.engine!r}")
        for name in ("n_samples", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.forced < 0:
            raise ValueError(f"forced must be >= 0, got {self.forced}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be null or >= 1, got {self.limit}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclass
class PathsConfig:
    data_dir: str
    models_dir: str
    runs_dir: str
    results_dir: str


@dataclass
class WandbConfig:
    """What ``cbpo.runlog.open_wandb`` passes to ``wandb.init``."""

    enabled: bool
    mode: str
    project: str
    name: str | None  # a run: <run_name>-seed<seed>
    group: str | None  # a study: <preset>/<model>/<data>, the runs one table aggregates
    job_type: str  # sft | rl (the stage); eval.run logs as eval
    tags: list[str]

    def __post_init__(self) -> None:
        if self.mode not in ("online", "offline", "disabled"):
            raise ValueError(f"mode must be 'online', 'offline' or 'disabled', got {self.mode!r}")


@dataclass
class Placement:
    """Top-level keys: which trainer runs and, for the local one, where. Not a section, so
    their errors name the bare key."""

    backend: str  # local | verl (cbpo.backends)
    device: str  # auto | cpu | cuda: the local backend's device (auto: cuda when available)
    dtype: str  # auto | float32 | bfloat16: forward passes (auto: bf16 on a GPU that has it)

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_PACKAGES:
            raise ValueError(f"backend must be {' or '.join(map(repr, BACKEND_PACKAGES))}, got {self.backend!r}")
        device.check(self.device, self.dtype)


SECTIONS: dict[str, type] = {
    "sft": SFTConfig,
    "rl": RLConfig,
    "evaluation": EvaluationConfig,
    "rollout": RolloutConfig,
    "scan": ScanConfig,
    "tools_cfg": ToolsConfig,
    "paths": PathsConfig,
    "wandb": WandbConfig,
}  # and each backend's own (register_backend)

# Backends register themselves as methods do (cbpo.registry): each package below calls
# register_backend when imported, which the schema does before it is built. The core names the
# packages and never imports a backend's code: a launcher is "module:function", imported on use.
BACKEND_PACKAGES = {"local": "cbpo.backends.local", "verl": "cbpo.backends.verl"}
_LAUNCHERS: dict[str, str] = {}


def register_backend(name: str, launch: str, sections: Mapping[str, type] | None = None) -> None:
    """A backend's launcher, ``"module:function"`` taking ``(cfg, out)`` for one training run
    (imported on use: verl's import alone costs seconds), and the config sections only it
    reads (e.g. ``verl``: settings dataclasses, as ``SECTIONS``)."""
    _LAUNCHERS[name] = launch
    SECTIONS.update(sections or {})


def sections() -> dict[str, type]:
    """Every config section's settings dataclass, the backends' own included."""
    for package in BACKEND_PACKAGES.values():
        importlib.import_module(package)
    return SECTIONS


def backend_launcher(name: str) -> Callable[[DictConfig, Path], None]:
    """The function that trains one run on backend ``name``."""
    if name not in BACKEND_PACKAGES:
        raise ValueError(f"backend must be {' or '.join(map(repr, BACKEND_PACKAGES))}, got {name!r}")
    importlib.import_module(BACKEND_PACKAGES[name])
    module, function = _LAUNCHERS[name].split(":")
    return getattr(importlib.import_module(module), function)

# Settings that moved to the method's config, the one place each is read; the old keys are
# refused naming the new one (a silently ignored override is the failure this prevents).
MOVED = {
    **{f"rl.{k}": f"method.{k}" for k in ("clip_eps", "clip_low", "clip_high", "beta", "kl_estimator")},
    "rl.top_k_entropy": "method.top_k",
}

_SCALARS = (bool, int, float, str, type(None))
CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # what entry_point's config_path names


def _schema(cls: type, **extra: type) -> type:
    """``cls`` as a schema node: a mutable dataclass of the fields a config file can set
    (scalars, optional scalars, ``dict`` fields and nested settings dataclasses) with their
    defaults, plus ``extra`` fields. A frozen dataclass would make a read-only node, and
    fields such as the agent's tag table are code rather than settings: they keep their
    defaults."""
    hints = typing.get_type_hints(cls)
    spec = [(name, kind, field(default=MISSING)) for name, kind in extra.items()]
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            node = _schema(kind)
            spec.append((f.name, node, field(default_factory=node)))
        elif typing.get_origin(kind) is dict or all(a in _SCALARS for a in typing.get_args(kind) or (kind,)):
            if f.default_factory is not dataclasses.MISSING:
                spec.append((f.name, kind, field(default_factory=f.default_factory)))
            else:
                spec.append((f.name, kind, field(default=MISSING if f.default is dataclasses.MISSING else f.default)))
    return dataclasses.make_dataclass(cls.__name__, spec)


def register() -> None:
    """The schema for ``configs/config.yaml`` (its ``schema`` default) and for each method with
    a ``configs/method/<name>.yaml`` (its ``/schema/method/<name>`` default). Only methods that
    can be chosen are imported, so a baseline's module loads only where it has a config."""
    store = ConfigStore.instance()
    store.store(name="schema", node={key: _schema(cls) for key, cls in sections().items()})
    for path in sorted((CONFIGS / "method").glob("*.yaml")):
        store.store(group="schema/method", name=path.stem, node=_schema(get_method(path.stem).config, name=str))


def build(cls: type, values: Mapping[str, Any], key: str) -> Any:
    """``cls`` from a config section's values, nested settings dataclasses included; a range
    error names the full key (``rl.steps must be >= 1, got 0``)."""
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(known))
    if unknown:  # added with `+key=...`, which the schema lets through
        raise ValueError(f"{', '.join(f'{key}.{k}' for k in unknown)}: no such setting; {key} has {', '.join(known)}")
    kwargs = {k: build(hints[k], v, f"{key}.{k}") if dataclasses.is_dataclass(hints[k]) else v for k, v in values.items()}
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ValueError(f"{key}.{e}") from None


def settings(cfg: DictConfig, key: str) -> Any:
    """The settings dataclass of section ``key`` (see ``SECTIONS``)."""
    return build(sections()[key], OmegaConf.to_container(cfg[key], resolve=True, throw_on_missing=True), key)


def placement(cfg: DictConfig) -> Placement:
    return Placement(**{f.name: cfg[f.name] for f in dataclasses.fields(Placement)})


def method_config(cfg: DictConfig) -> Any:
    """The method's config dataclass (an ``ObjectiveConfig``) from ``method.*``."""
    values = OmegaConf.to_container(cfg.method, resolve=True, throw_on_missing=True)
    return build(get_method(values.pop("name")).config, values, "method")


def validate(cfg: DictConfig) -> None:
    """Every section and the method's config, built once: the first bad value stops the job
    before it reads or writes anything, naming its key."""
    for key in sections():
        settings(cfg, key)
    placement(cfg)
    method_config(cfg)


def refuse_moved(overrides: Sequence[str]) -> None:
    """Name the new place of a moved key given on the command line. Hydra would only say the
    key does not exist, which suggests adding it with ``+``, where nothing would read it."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if "=" in override and key in MOVED:
            raise ValueError(f"{key} is no longer a setting: set {MOVED[key]} instead (the objective's settings "
                             "and the entropy's top-K belong to the method, the one place each is read)")


def config_options(group: str) -> list[str]:
    """The options of a config group: its ``configs/<group>/*.yaml`` files."""
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


# With --help: Hydra's settings dump and flags after the entry point's usage, not Hydra's
# group list, which shows the internal schema/method group (configs/hydra/help/suite.yaml).
HELP_TEMPLATE = "hydra/help=suite"


def entry_point(task: Callable[[DictConfig], Any] | None = None, *,
                usage: Callable[[], str] | None = None) -> Callable[[], Any]:
    """``hydra.main`` on ``configs/config.yaml`` with this schema: ``task`` runs only on
    settings that pass ``validate``, and an override of a moved key is refused naming its new
    place. ``--cfg job`` prints the composed (type-checked) config without running ``task``;
    ``--help`` prints ``usage()`` (what the entry point does, the settings people change, the
    options it accepts) before Hydra's settings dump. Use as ``@entry_point`` or
    ``@entry_point(usage=...)``."""
    if task is None:
        return functools.partial(entry_point, usage=usage)
    register()

    @functools.wraps(task)  # Hydra finds configs/ and names the job from the wrapped task
    def checked(cfg: DictConfig) -> Any:
        try:
            validate(cfg)
        except ValueError as e:
            sys.exit(f"invalid setting: {e}")
        return task(cfg)

    main = hydra.main(config_path="../configs", config_name="config", version_base=None)(checked)

    @functools.wraps(task)
    def run() -> Any:
        try:
            refuse_moved(sys.argv[1:])
        except ValueError as e:
            sys.exit(f"invalid setting: {e}")
        if usage is not None and any(a in ("--help", "-h") for a in sys.argv[1:]):
            print(usage())
            sys.argv.append(HELP_TEMPLATE)
        return main()

    return run
