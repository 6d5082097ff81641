"""The only code that reads rule files from disk (being written: stable interface below)."""

from __future__ import annotations

from pathlib import Path

from webhook.rules import Policy, parse_sources


def packaged_rules_dir() -> Path:
    """The directory of the rule files shipped inside the package."""
    from importlib.resources import files

    return Path(str(files("webhook.default_rules")))


def load_policy(rules_dir: Path | None = None) -> Policy:
    """Read every *.yaml/*.yml/*.json file of `rules_dir` (None: the packaged rules) and parse them; raises RuleError."""
    directory = rules_dir or packaged_rules_dir()
    sources = [(str(p), p.read_text()) for p in sorted(directory.glob("*.y*ml"))]
    return parse_sources(sources)
