"""MkDocs hook: the nav's Methods section from the registry, beside the pages docs/gen_pages.py
writes from it, so the list cannot drift from ``python -m cbpo methods`` (names as the tables
spell them)."""
from __future__ import annotations

from cbpo.registry import describe, known_methods


def on_config(config):
    pages = sorted((describe(name)["display_name"], f"methods/{name}.md") for name in known_methods())
    for item in config["nav"]:
        if isinstance(item, dict) and "Methods" in item:
            item["Methods"] = ["methods/index.md", *({title: page} for title, page in pages)]
            return config
    raise ValueError("mkdocs.yml's nav has no Methods section for docs/hooks.py to fill")
