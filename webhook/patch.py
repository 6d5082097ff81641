"""Edits -> RFC 6902 JSON Patch operations (being written: stable interface below)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.findings import Edit


def operations(obj: Mapping[str, Any], edits: Sequence[Edit]) -> list[dict[str, Any]]:
    """The smallest correct JSON Patch that applies `edits` to `obj`."""
    return []
