"""The only code that reads rule files from disk.

A rule directory is read whole: every `*.yaml`, `*.yml` and `*.json` file directly inside it, in name order.
Hidden entries (the `..data` links of a mounted ConfigMap) and a `kustomization.yaml` (which generates the
ConfigMap from the same directory) are not rule files and are skipped.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from webhook.policy.rules import Policy, RuleError, parse_sources

RULE_SUFFIXES = (".yaml", ".yml", ".json")
NOT_RULES = ("kustomization.yaml", "kustomization.yml")


def packaged_rules_dir() -> Path:
    """The directory of the rule files shipped inside the package (the repository's `rules/`)."""
    return Path(str(files("webhook.default_rules")))


def rule_files(rules_dir: Path) -> list[Path]:
    """The rule files of a directory, in the order they are merged."""
    if not rules_dir.is_dir():
        raise RuleError(f"{rules_dir}: not a directory; point --rules (or GPU_WEBHOOK_RULES) at the rule directory")
    return sorted(
        p for p in rules_dir.iterdir()
        if p.suffix in RULE_SUFFIXES and not p.name.startswith(".") and p.name not in NOT_RULES and p.is_file()
    )


def read_sources(rules_dir: Path | None = None) -> list[tuple[str, str]]:
    """[(file path, text)] of every rule file; raises RuleError when a file cannot be read."""
    directory = rules_dir or packaged_rules_dir()
    sources = []
    for path in rule_files(directory):
        try:
            sources.append((str(path), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as err:
            raise RuleError(f"{path}: cannot be read ({err}); check the file and its permissions") from None
    return sources


def load_policy(rules_dir: Path | None = None) -> Policy:
    """Read and parse the rule directory (None: the packaged rules); raises RuleError naming file and field."""
    return parse_sources(read_sources(rules_dir))
