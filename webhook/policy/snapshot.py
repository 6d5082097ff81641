"""The cluster state the webhook reads: frozen snapshots of nodes, runtime classes, namespaces and DRA claim
templates, the DRA inventory's view (`webhook.policy.dra_inventory`), and the parsing of each from its API JSON.

Pure: API objects come in as plain JSON mappings (`*_from_api`); a field of the wrong JSON type is ignored. The
decisions that read a snapshot are in `webhook.policy.inventory`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.policy import claims, quantity
from webhook.policy.claims import Claim
from webhook.policy.dra_inventory import DraView
from webhook.policy.node_index import NodeIndex, NodeList, NodeView
from webhook.policy.pods import mapping

# --------------------------------------------------------------------------------------------- snapshot


# How a snapshot's `reason` begins when the API server refused an initial list (401/403): with no list of that kind
# ever made, the server cannot run the checks it was configured for, and its /readyz fails (webhook.admission.app).
REFUSED_AT_START = "the API server refused the initial list of"
# How it begins while an initial list has had no answer yet: the replica is unready until every first list is
# answered, so a new replica never turns Ready (and lets a rollout go on) a moment before a refusal would show.
FIRST_LIST_UNANSWERED = "no answer yet to the initial list of"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True)
class Node:
    """A node: labels, taints, allocatable extended resources as whole numbers, readiness."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Mapping[str, int] = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False

    def offers(self, resource: str) -> int:
        return self.allocatable.get(resource, 0)


@dataclass(frozen=True)
class RuntimeClass:
    """A node.k8s.io/v1 RuntimeClass: its handler and what it merges into a Pod's scheduling."""

    name: str
    handler: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Namespace:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimTemplate:
    """A resource.k8s.io ResourceClaimTemplate: the DeviceClasses its device requests use."""

    namespace: str
    name: str
    device_classes: tuple[str, ...] = ()
    claim: Claim | None = None  # its requests, counts and selectors (webhook.policy.claims)


@dataclass(frozen=True)
class Snapshot:
    """What the caches held at one moment. `synced` is False before the first full list, or when the API
    server has been unreachable for too long; `reason` then says why.

    `nodes` may be given as any sequence (it is then indexed once, and held in name order); the live caches
    pass the `NodeList` of their index's current view instead, which costs nothing to hand over. The
    decisions read `index` (webhook.policy.node_index), never scan `nodes`."""

    nodes: Sequence[Node] = ()
    runtime_classes: Mapping[str, RuntimeClass] = field(default_factory=dict)
    namespaces: Mapping[str, Namespace] = field(default_factory=dict)
    claim_templates: Mapping[tuple[str, str], ClaimTemplate] = field(default_factory=dict)
    dra: DraView = field(default_factory=DraView, compare=False)  # ResourceSlices, DeviceClasses, ResourceClaims
    synced: bool = True
    reason: str = ""
    index: NodeView = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes = self.nodes
        view = nodes.view if isinstance(nodes, NodeList) else NodeIndex.build(nodes).view()
        object.__setattr__(self, "index", view)
        object.__setattr__(self, "nodes", view.node_list)

    def namespace_labels(self, name: str | None) -> Mapping[str, str] | None:
        """The labels of a namespace, or None when it is not known (or the snapshot is not synced)."""
        found = self.namespaces.get(name or "") if self.synced else None
        return found.labels if found is not None else None


def snapshot_from_api(nodes: Iterable[Mapping[str, Any]] = (), runtime_classes: Iterable[Mapping[str, Any]] = (),
                      namespaces: Iterable[Mapping[str, Any]] = (), claim_templates: Iterable[Mapping[str, Any]] = (),
                      *, dra: DraView | None = None, synced: bool = True, reason: str = "") -> Snapshot:
    """A snapshot from lists of API objects (JSON as the API server sends it)."""
    return snapshot_of(map(node_from_api, nodes), map(runtime_class_from_api, runtime_classes),
                       map(namespace_from_api, namespaces), map(claim_template_from_api, claim_templates),
                       dra=dra, synced=synced, reason=reason)


def snapshot_of(nodes: Iterable[Node], runtime_classes: Iterable[RuntimeClass], namespaces: Iterable[Namespace],
                claim_templates: Iterable[ClaimTemplate], *, dra: DraView | None = None, synced: bool = True,
                reason: str = "") -> Snapshot:
    """A snapshot from parsed objects: nodes in name order, the rest keyed as the checks look them up."""
    return Snapshot(
        nodes=nodes if isinstance(nodes, NodeList) else tuple(nodes),
        runtime_classes={r.name: r for r in runtime_classes},
        namespaces={n.name: n for n in namespaces},
        claim_templates={(c.namespace, c.name): c for c in claim_templates},
        dra=dra if dra is not None else DraView(),
        synced=synced,
        reason=reason,
    )


# --------------------------------------------------------------------------------------------- parsing


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in mapping(value).items()}


def _interned(value: Any) -> dict[str, str]:
    """Labels with keys and values interned: the same strings repeat on every node of a pool, held once."""
    return {sys.intern(str(k)): sys.intern(str(v)) for k, v in mapping(value).items()}


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of an API object ("" for cluster-scoped)."""
    meta = mapping(obj.get("metadata"))
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def node_from_api(obj: Mapping[str, Any]) -> Node:
    """A Node from its API JSON: only extended resources (names with a domain) are kept, as whole numbers."""
    meta, spec, status = mapping(obj.get("metadata")), mapping(obj.get("spec")), mapping(obj.get("status"))
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or "NoSchedule"))
        for t in _list(spec.get("taints")) if isinstance(t, dict)
    )
    allocatable: dict[str, int] = {}
    for name, raw in mapping(status.get("allocatable")).items():
        if "/" not in str(name):
            continue
        try:
            value = quantity.parse(raw)
        except quantity.QuantityError:
            continue
        allocatable[str(name)] = max(int(value), 0)
    ready = any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in _list(status.get("conditions"))
    )
    return Node(str(meta.get("name") or ""), _interned(meta.get("labels")), taints, allocatable, ready,
                bool(spec.get("unschedulable")))


def runtime_class_from_api(obj: Mapping[str, Any]) -> RuntimeClass:
    scheduling = mapping(obj.get("scheduling"))
    return RuntimeClass(
        name=object_key(obj)[1],
        handler=str(obj.get("handler") or ""),
        node_selector=_strings(scheduling.get("nodeSelector")),
        tolerations=tuple(dict(t) for t in _list(scheduling.get("tolerations")) if isinstance(t, dict)),
    )


def namespace_from_api(obj: Mapping[str, Any]) -> Namespace:
    return Namespace(object_key(obj)[1], _strings(mapping(obj.get("metadata")).get("labels")))


def claim_template_from_api(obj: Mapping[str, Any]) -> ClaimTemplate:
    """Device classes of every request: v1/v1beta2 `exactly`, v1beta1 top-level, and `firstAvailable`."""
    namespace, name = object_key(obj)
    devices = mapping(mapping(mapping(obj.get("spec")).get("spec")).get("devices"))
    classes: list[str] = []
    for request in _list(devices.get("requests")):
        request = mapping(request)
        alternatives = map(mapping, _list(request.get("firstAvailable")))
        for candidate in (request, mapping(request.get("exactly")), *alternatives):
            device_class = candidate.get("deviceClassName")
            if isinstance(device_class, str) and device_class and device_class not in classes:
                classes.append(device_class)
    parsed = claims.parse({**obj, "kind": "ResourceClaimTemplate"}) if isinstance(obj, dict) else None
    return ClaimTemplate(namespace, name, tuple(classes), parsed)
