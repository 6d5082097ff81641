"""The vocabulary of a decision: enforcement levels, findings and the verdict the engine returns.

Kept apart from the engine so that the rule model, the engine, the admission server and the CLI all speak
the same small set of frozen values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

Enforcement = Literal["deny", "warn", "off"]
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
Mode = Literal["mutate", "validate"]


@dataclass(frozen=True)
class Finding:
    """One rule that fired: its stable id, what a person reads, and how it is enforced."""

    rule: str
    message: str
    enforcement: Enforcement = "deny"

    def render(self) -> str:
        """`[rule-id] message`, the form used in denials, warnings and `check` output."""
        return f"[{self.rule}] {self.message}"


class Edit(NamedTuple):
    """A change the engine wants, as data; `patch.operations` turns edits into RFC 6902 operations.

    `path` addresses a container (map or list) in the object, as map keys and list indices.
    "set":    set `key` to `value` in the map at `path`; the map may be absent (it is then added whole).
              The engine emits it only where the object has no value, or a defaulted one, never over
              what a person wrote.
    "append": append `value` to the list at `path`; the list may be absent (it is then added whole).
    "remove": remove `key` from the map at `path` (emitted only when present).

    A NamedTuple rather than a frozen dataclass: edits are made on every admission, and tuples are cheap.
    """

    kind: Literal["set", "append", "remove"]
    path: tuple[str | int, ...]
    key: str | None
    value: Any = None


class Patch(NamedTuple):
    """A JSON Patch made once and shared between reviews (`class_edits.class_changes`): its RFC 6902 operations,
    never to be changed (copy them first), and their JSON in base64, as `response.patch` carries it."""

    ops: tuple[dict[str, Any], ...]
    encoded: str


class Explains(Protocol):
    """Something that says in words how it was decided (the engine's chosen class, axis by axis)."""

    def explain(self) -> list[str]: ...


class Verdict(NamedTuple):
    """What the engine decided for one object (a NamedTuple, like Edit: one is made on every admission)."""

    violations: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()
    edits: tuple[Edit, ...] = ()
    gpu_class: str | None = None
    gpus: int = 0
    notes: tuple[str, ...] = ()
    classes: tuple[Explains, ...] = ()  # each pod spec's chosen class, explained only when asked (`choices`)
    # `edits` as a JSON Patch of the judged object when the engine had it memoised (shared between reviews: read
    # only); None: `patch.operations(object, edits)` builds it.
    patch: Patch | None = None

    @property
    def allowed(self) -> bool:
        return not self.violations

    @property
    def choices(self) -> tuple[str, ...]:
        """How each class axis was chosen, or why it was left out (for `check` and `test`; the server never
        asks, so the words are not made per review)."""
        return tuple(line for chosen in self.classes for line in chosen.explain())

    @property
    def rules(self) -> tuple[str, ...]:
        """Ids of every rule that fired (denials first), for logs and metrics."""
        if not self.violations and not self.warnings:
            return ()
        return tuple(f.rule for f in (*self.violations, *self.warnings))

    def message(self) -> str:
        """Every violation, one after the other: the denial's `status.message`."""
        return "; ".join(f.render() for f in self.violations)
