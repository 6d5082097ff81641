"""What a Pod's own node selection says about the class axes: the values it admits, term by term.

A pod spec selects nodes with `nodeSelector` (every entry must hold) and the required node affinity (any one
of its `nodeSelectorTerms`, each with all of its expressions). Here that becomes a tuple of terms, each a
tuple of `Requirement`s, with the nodeSelector entries in every term. For a class axis, a term admits the
axis values whose nodes could satisfy every requirement the term makes on the axis's keys (`Axis.keys`: its
nodeSelector keys, aliases and `nodeLabels`). A term that says nothing about the axis admits every value.

Pure and cheap in the usual case: a Pod with neither a nodeSelector nor node affinity is one empty term,
which constrains nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from webhook.policy.inventory import label_matches
from webhook.policy.pods import Path, mapping, render_path
from webhook.policy.rules import Axis, LabelValues

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_TERMS_PATH = ("affinity", "nodeAffinity", _REQUIRED, "nodeSelectorTerms")
_FRESH_OK = frozenset({"NotIn", "Exists"})  # what a present value that no requirement lists satisfies


class Requirement(NamedTuple):
    """One label requirement of the Pod: `key operator values`, and where the Pod says it."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...]
    where: str

    def holds(self, value: str | None) -> bool:
        """Whether a node whose label has `value` (None: no such label) satisfies the requirement."""
        return label_matches(value, self.operator, self.values)


Term = tuple[Requirement, ...]
NO_SELECTION: tuple[Term, ...] = ((),)


def terms_of(spec: Mapping[str, Any], spec_path: Path) -> tuple[Term, ...]:
    """The Pod's own selection as terms (any one must hold; all requirements of a term must hold)."""
    selector = spec.get("nodeSelector")
    affinity = spec.get("affinity")
    if not selector and not affinity:
        return NO_SELECTION
    base = tuple(
        Requirement(str(k), "In", (str(v),), f"{render_path((*spec_path, 'nodeSelector'))}[{k}]={v}")
        for k, v in mapping(selector).items()
    )
    raw_terms = mapping(mapping(mapping(affinity).get("nodeAffinity")).get(_REQUIRED)).get("nodeSelectorTerms")
    if not isinstance(raw_terms, list) or not raw_terms:
        return (base,)
    terms = []
    for index, raw in enumerate(raw_terms):
        term = mapping(raw)
        expressions = [mapping(e) for e in term.get("matchExpressions") or () if isinstance(e, dict)]
        if not expressions and not term.get("matchFields"):
            continue  # an empty term matches no node
        where = render_path((*spec_path, *_TERMS_PATH, index))
        terms.append(base + tuple(
            Requirement(str(e.get("key") or ""), str(e.get("operator") or ""),
                        tuple(str(v) for v in e.get("values") or () if v is not None),
                        f"{where} {e.get('key')} {e.get('operator')}{_shown(e.get('values'))}")
            for e in expressions
        ))
    return tuple(terms) or (base,)


def _shown(values: Any) -> str:
    return f" [{', '.join(map(str, values))}]" if isinstance(values, list) and values else ""


def admitted(axis: Axis, term: Term) -> frozenset[str] | None:
    """The axis values one term admits; None when the term says nothing about the axis."""
    by_key: dict[str, list[Requirement]] = {}
    for r in term:
        if r.key in axis.keys:
            by_key.setdefault(r.key, []).append(r)
    if not by_key:
        return None
    return frozenset(value for value, c in axis.values.items()
                     if all(satisfiable(c.aliases.get(key), reqs) for key, reqs in by_key.items()))


def satisfiable(found: LabelValues | None, requirements: Sequence[Requirement]) -> bool:
    """Whether some node of a value, carrying `found` for the key (None: the value's nodes lack it), satisfies
    every requirement on that key. An alias key may be missing on a node of its value (a GKE node has no
    Karpenter label); the value's own nodeSelector key never is."""
    if (found is None or not found.certain) and all(r.holds(None) for r in requirements) and (
            found is None or all(label_matches(None, e.operator, e.values) for e in found.expressions)):
        return True  # a node of the value without the key
    if found is None:
        return False
    if found.expressions:
        return _expressions_meet(found, requirements)
    witnesses = set(found.literals)
    for r in requirements:
        if r.operator == "In":
            witnesses.update(v for v in r.values if found.matches(v))
    if any(all(r.holds(w) for r in requirements) for w in witnesses):
        return True
    # A glob also matches values no requirement lists: never a number, never one of the In values.
    return found.globs is not None and all(r.operator in _FRESH_OK for r in requirements)


def _expressions_meet(found: LabelValues, requirements: Sequence[Requirement]) -> bool:
    """Whether some label value satisfies both a class value's matchExpressions on the key and the Pod's
    requirements. The candidates: the values either side lists, each integer bound and its neighbours (two sets
    of Gt/Lt bounds meet iff one of those lies in both), and a fresh value no one lists."""
    listed = {v for r in requirements for v in r.values} | {v for e in found.expressions for v in e.values}
    candidates = set(listed)
    for value in listed:
        if value.lstrip("-").isdigit():
            candidates.update(str(int(value) + step) for step in (-1, 1))
    candidates.add("\x00fresh")  # a value neither side lists (NotIn and Exists admit it)

    def holds(value: str) -> bool:
        return (all(label_matches(value, e.operator, e.values) for e in found.expressions)
                and all(r.holds(value) for r in requirements))

    return any(holds(c) for c in candidates)


def candidates(axis: Axis, terms: Sequence[Term]) -> frozenset[str] | None:
    """The axis values some term admits; None when some term leaves the axis open (the Pod did not choose)."""
    found: set[str] = set()
    for term in terms:
        values = admitted(axis, term)
        if values is None:
            return None
        found |= values
    return frozenset(found)


def keep_terms(axis: Axis, value: str, terms: tuple[Term, ...]) -> tuple[Term, ...]:
    """The terms that still hold once `value` is chosen for `axis` (so later axes choose within them)."""
    if terms is NO_SELECTION:
        return terms
    kept = tuple(t for t in terms if (values := admitted(axis, t)) is None or value in values)
    return kept or terms


def describe(axis: Axis, terms: Sequence[Term]) -> str:
    """The Pod's requirements on the axis's keys, as it wrote them (for messages)."""
    seen = dict.fromkeys(r.where for term in terms for r in term if r.key in axis.keys)
    return " or ".join(seen) if seen else "its node selection"
