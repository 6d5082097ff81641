"""The policy engine: one decision path for the admission server, `check`, `test` and `audit`.

(Being written: the signatures below are the stable interface.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.findings import Mode, Operation, Verdict
from webhook.rules import Policy


@dataclass(frozen=True)
class Context:
    """Where an object is being admitted: the authoritative namespace, the operation, and which endpoint asks."""

    namespace: str | None
    operation: Operation = "CREATE"
    mode: Mode = "mutate"


def evaluate(policy: Policy, obj: Mapping[str, Any] | None, ctx: Context) -> Verdict:
    """Decide on one object."""
    return Verdict()
