"""Whether a node admits what a pod spec asks of its labels and taints, as kube-scheduler's NodeAffinity and
TaintToleration plugins decide: nodeSelector entries, required node affinity (`matchExpressions`, `matchFields`),
the node selector operators, and tolerations.

Pure, on `webhook.policy.snapshot.Node`s; `webhook.policy.inventory` builds its decisions on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.policy.pods import mapping
from webhook.policy.rules import Expression
from webhook.policy.snapshot import Node, Taint, _list

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# Taints the node lifecycle controller adds for a while (NotReady, cordoned, pressure): not a property of
# the node's size, so they never make a Pod "never schedulable".
TRANSIENT_TAINT_PREFIX = "node.kubernetes.io/"


def value_selects(node: Node, selector: Mapping[str, str], expressions: Sequence[Expression]) -> bool:
    """Whether a class value's nodeSelector and matchExpressions both hold on the node."""
    return (all(node.labels.get(k) == v for k, v in selector.items())
            and all(label_matches(node.labels.get(e.key), e.operator, e.values) for e in expressions))


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """Kubernetes `ToleratesTaint`: effect, key, then Exists or an equal value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.key:
        return False
    if operator == "Exists":
        return True
    return bool(key) and str(toleration.get("value") or "") == taint.value


def untolerated(node: Node, tolerations: Sequence[Mapping[str, Any]], *, transient: bool = False) -> list[Taint]:
    """The node's NoSchedule/NoExecute taints none of `tolerations` tolerates (`transient`: include
    the node lifecycle taints such as node.kubernetes.io/not-ready)."""
    return [
        t for t in node.taints
        if t.effect in HARD_EFFECTS and (transient or not t.key.startswith(TRANSIENT_TAINT_PREFIX))
        and not any(tolerates(tol, t) for tol in tolerations)
    ]


def selector_mismatches(node: Node, selector: Mapping[str, str]) -> list[str]:
    """`key=wanted (node has X)` for every nodeSelector entry the node's labels do not satisfy."""
    return [
        f"{key}={value} (node has {node.labels.get(key, 'no such label')})"
        for key, value in sorted(selector.items()) if node.labels.get(key) != value
    ]


def affinity_matches(node: Node, affinity: Mapping[str, Any] | None) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution: any term, all of its expressions."""
    required = mapping(mapping(affinity).get(REQUIRED))
    terms = [mapping(t) for t in _list(required.get("nodeSelectorTerms"))]
    if not terms:
        return True
    return any(_term_matches(node, term) for term in terms)


def _term_matches(node: Node, term: Mapping[str, Any]) -> bool:
    expressions = [mapping(e) for e in _list(term.get("matchExpressions"))]
    fields = [mapping(e) for e in _list(term.get("matchFields"))]
    if not expressions and not fields:
        return False  # an empty term matches no node
    by_field = {"metadata.name": node.name}
    return all(_expression(node.labels, e) for e in expressions) and all(_expression(by_field, e) for e in fields)


def _expression(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    values = [str(v) for v in _list(expr.get("values"))]
    return label_matches(labels.get(str(expr.get("key") or "")), expr.get("operator"), values)


def label_matches(have: str | None, op: Any, values: Sequence[str]) -> bool:
    """Kubernetes' node selector operators on one label: `have` is its value on the node, None when absent."""
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(values) == 1:
        try:
            return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
        except ValueError:
            return False
    return False
