"""Pages generated at build time (mkdocs-gen-files), so they cannot drift from the code: a page
per method from the registry (what ``python -m cbpo methods`` prints) and the configuration
reference from the settings dataclasses behind ``cbpo/schema.py``."""
from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from dataclasses import asdict

import mkdocs_gen_files

from cbpo.objective import ObjectiveConfig
from cbpo.registry import GROUPS, describe, get_method, known_methods
from cbpo.schema import config_options, sections


def method_page(name: str) -> str:
    info, cls = describe(name), get_method(name)
    shared = asdict(ObjectiveConfig())
    module = sys.modules[cls.__module__]
    rows = "\n".join(f"| `method.{k}` | `{v!r}` | {'shared objective default' if k in shared and shared[k] == v else 'this method'} |"
                     for k, v in info["knobs"].items())
    return (f"# {info['display_name']} (`method={name}`)\n\n"
            f"**Paper:** {info['paper']}  \n**Group:** {info['group']}  \n"
            f"**Trains:** {'yes (an RL run of its own)' if info['trains'] else 'no: evaluated from the checkpoint it names'}\n\n"
            f"**Implemented:** {cls.implemented}\n\n"
            f"## Knobs\n\n| setting | default | set by |\n| --- | --- | --- |\n{rows}\n\n"
            f"## From the module (`{cls.__module__}`)\n\n```text\n{inspect.getdoc(module) or ''}\n```\n")


def methods_index() -> str:
    lines = ["# Methods\n",
             "Every method is one switch, `method=NAME`, over the same data, SFT initialisation, tools, rewards, decoding "
             "and rollout budget. This page and the pages below are generated from the registry (`cbpo/registry.py`) "
             "when the docs are built: they are what `python -m cbpo methods` prints.\n",
             "| method | name in the tables | group | trains | paper |", "| --- | --- | --- | --- | --- |"]
    for group in GROUPS:
        for name in known_methods():
            info = describe(name)
            if info["group"] == group:
                lines.append(f"| [`{name}`]({name}.md) | {info['display_name']} | {group} | {'yes' if info['trains'] else 'no'} "
                             f"| {info['paper']} |")
    return "\n".join(lines) + "\n"


def type_name(kind) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


def section_rows(cls: type, prefix: str) -> list[str]:
    hints, rows = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            rows += section_rows(kind, f"{prefix}{f.name}.")
            continue
        default = ("(from the YAML)" if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   else f"`{f.default!r}`" if f.default is not dataclasses.MISSING else "`(computed)`")
        rows.append(f"| `{prefix}{f.name}` | `{type_name(kind)}` | {default} |")
    return rows


def configuration_page() -> str:
    parts = ["# Configuration reference\n",
             "Generated from the settings dataclasses that `cbpo/schema.py` registers as Hydra's schema, when the docs "
             "are built. The defaults shown are the dataclasses'; the values a run uses come from `configs/` "
             "(`config.yaml`, then the `model`, `data`, `preset` groups) and the command line. "
             "`python -m cbpo.train --cfg job` prints the composed config of any command.\n",
             "Config groups: " + "; ".join(f"`{g}`: {', '.join(f'`{o}`' for o in config_options(g))}"
                                           for g in ("preset", "model", "data", "method")) + ".\n"]
    for key, cls in sections().items():
        doc = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        doc = "" if doc.startswith(f"{cls.__name__}(") else doc  # dataclass's generated signature, not a docstring
        parts.append(f"## `{key}` ({cls.__name__})\n\n{doc}\n\n| key | type | default |\n| --- | --- | --- |\n"
                     + "\n".join(section_rows(cls, f"{key}.")) + "\n")
    parts.append("## `method`\n\nThe chosen method's config dataclass: see each method's page under "
                 "[Methods](methods/index.md) for its knobs and their defaults.\n")
    return "\n".join(parts)


with mkdocs_gen_files.open("methods/index.md", "w") as f:
    f.write(methods_index())
for name in known_methods():
    with mkdocs_gen_files.open(f"methods/{name}.md", "w") as f:
        f.write(method_page(name))
with mkdocs_gen_files.open("configuration.md", "w") as f:
    f.write(configuration_page())
