"""The DRA part of the inventory: ResourceSlices, DeviceClasses and ResourceClaims, kept small and indexed so that a
review's question about the devices costs the same whatever the cluster's size.

Pure: objects come in as the API server's JSON (`resource.k8s.io/v1`; v1beta2 has the same shape, v1beta1 nests a
device's fields under `basic` and a request's under the request itself), parsed field by field: a field of the wrong
JSON type is skipped, never raised on. Only what the rules read is kept: per device its attributes and capacity, per
DeviceClass its selectors, per ResourceClaim its requests' DeviceClass and count and whether it is allocated (not the
whole object: a large cluster holds 10,000 claims).

Two halves, as for the nodes (`webhook.policy.node_index`):

- `DraIndex`, the writer's side (callers hold one lock): objects go in and out one event at a time, or all of one
  kind at once (a relist);
- `DraView`, what a review reads: immutable (persistent `immutables.Map`s), published by `DraIndex.view()`.

What a view answers without walking the slices:

- `nodes_with(query, count)`: the nodes with at least `count` devices matching a `DeviceQuery` (CEL selectors,
  ANDed, evaluated as the scheduler does: `webhook.policy.device_selectors`), or None when a selector fails on a
  device (no decision);
- `values(driver, attribute)`: the values an attribute takes (the product names, say), with how many nodes and
  devices have each;
- `claim(namespace, name)`, `device_class(name)`.

A question is answered from an aggregate the writer keeps up to date on every slice event once a review has asked
it; the first time, it is computed from every device (once per view) and the writer tracks it from then on (at most
`MAX_TRACKED` questions). A slice event costs O(devices on its node x tracked questions).
"""

from __future__ import annotations

import re
import sys
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import immutables

from webhook.policy import claims
from webhook.policy.device_selectors import Device, DeviceQuery
from webhook.policy.dra_rules import IMPLICIT_PREFIX

MAX_TRACKED = 256
SHOWN = 3  # node names kept in an answer
ALL_DEVICES: None = None  # a request's count under `allocationMode: All`
Kind = Literal["resourceslices", "deviceclasses", "resourceclaims"]
KINDS: tuple[Kind, ...] = ("resourceslices", "deviceclasses", "resourceclaims")


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Slice:
    """A ResourceSlice: the devices one driver publishes for one node (`node` "" when the slice is not node-local:
    `nodeSelector`, `allNodes` or per-device node selection)."""

    name: str
    driver: str
    node: str
    pool: str
    devices: tuple[Device, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A DeviceClass: its CEL selectors, the drivers they name (`device.driver == "..."`), the extended resource it
    maps (`spec.extendedResourceName`, KEP-5004) and when it was created (which decides between two classes that map
    the same name)."""

    name: str
    selectors: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    extended_resource_name: str | None = None
    created: str = ""  # metadata.creationTimestamp (RFC 3339, UTC, whole seconds: orders as text)


@dataclass(frozen=True, slots=True)
class Alternative:
    """What a request (or one subrequest of `firstAvailable`) asks: a DeviceClass and a count (None: `All`)."""

    device_class: str
    count: int | None


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One request of a ResourceClaim: one alternative (`exactly`), or `firstAvailable`'s in order."""

    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A ResourceClaim, as far as the rules read it."""

    namespace: str
    name: str
    requests: tuple[ClaimRequest, ...] = ()
    allocated: bool = False
    devices: int = 0  # devices allocated
    reserved_for: int = 0  # consumers (Pods) it is reserved for

    def as_claim(self) -> claims.Claim:
        """As the rules read a claim (`webhook.policy.claims`): its requests' DeviceClasses and counts, no selectors
        (a claim by name is judged when it is created; a Pod's rules count its devices)."""
        path = ("spec", "devices", "requests")
        return claims.Claim("ResourceClaim", self.name, tuple(
            claims.Request(r.name, tuple(
                claims.DeviceAsk(f"request {claims.shown(r.name)}", path, a.device_class, a.count, a.count is None,
                                 False, (), False) for a in r.alternatives), len(r.alternatives) > 1)
            for r in self.requests), {})


# --------------------------------------------------------------------------------------------- parsing


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return sys.intern(value) if isinstance(value, str) else ""


def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = _map(obj.get("metadata"))
    return _text(meta.get("namespace")), _text(meta.get("name"))


def _qualified(driver: str, name: str) -> str:
    return sys.intern(name if "/" in name else f"{driver}/{name}")


_VALUE_TYPES = (("string", str), ("version", str), ("int", int), ("bool", bool))


def _attribute(raw: Any) -> tuple[str, str] | None:
    """(type, text) of an attribute value (`{"string": ...}`, `{"version": ...}`, `{"int": ...}`, `{"bool": ...}`)."""
    entry = _map(raw)
    for kind, python in _VALUE_TYPES:
        value = entry.get(kind)
        if isinstance(value, python) and (python is bool or not isinstance(value, bool)):
            return kind, sys.intern(str(value).lower() if isinstance(value, bool) else str(value))
    return None


def _device(raw: Any, driver: str) -> Device | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        return None
    body = _map(raw.get("basic")) or raw  # v1beta1: the fields are under `basic`
    attributes = sorted((_qualified(driver, str(key)), *value) for key, entry in _map(body.get("attributes")).items()
                        if (value := _attribute(entry)) is not None)
    capacity = sorted((_qualified(driver, str(key)), _text(_map(entry).get("value")))
                      for key, entry in _map(body.get("capacity")).items() if isinstance(_map(entry).get("value"), str))
    return Device(_text(raw["name"]), tuple(attributes), tuple(capacity))


def slice_from_api(obj: Mapping[str, Any]) -> Slice:
    """A ResourceSlice from its JSON; devices whose fields are of the wrong type are skipped, or kept without them."""
    spec = _map(obj.get("spec"))
    driver = _text(spec.get("driver"))
    devices = (_device(raw, driver) for raw in _list(spec.get("devices")))
    return Slice(_name(obj)[1], driver, _text(spec.get("nodeName")), _text(_map(spec.get("pool")).get("name")),
                 tuple(d for d in devices if d is not None))


_DRIVER_SELECTOR = re.compile(r"""device\.driver\s*==\s*(["'])([^"'\\]+)\1""")


def device_class_from_api(obj: Mapping[str, Any]) -> DeviceClass:
    """A DeviceClass from its JSON: the CEL expressions of `spec.selectors[].cel` that are strings."""
    expressions = tuple(e for s in _list(_map(obj.get("spec")).get("selectors"))
                        if isinstance(e := _map(_map(s).get("cel")).get("expression"), str))
    drivers = tuple(dict.fromkeys(m.group(2) for e in expressions for m in _DRIVER_SELECTOR.finditer(e)))
    extended = _map(obj.get("spec")).get("extendedResourceName")
    return DeviceClass(_name(obj)[1], expressions, drivers,
                       extended if isinstance(extended, str) and extended else None,
                       _text(_map(obj.get("metadata")).get("creationTimestamp")))


def _count(fields: Mapping[str, Any]) -> int | None:
    """A request's count: None for `allocationMode: All`, else `count` (1 when absent; 0 when not a whole number)."""
    if fields.get("allocationMode") == "All":
        return ALL_DEVICES
    count = fields.get("count", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0


def _alternative(fields: Mapping[str, Any]) -> Alternative | None:
    device_class = fields.get("deviceClassName")
    return Alternative(_text(device_class), _count(fields)) if isinstance(device_class, str) else None


def _claim_request(raw: Any) -> ClaimRequest | None:
    request = _map(raw)
    if not isinstance(request.get("name"), str):
        return None
    listed = [_alternative(_map(s)) for s in _list(request.get("firstAvailable"))]
    if not listed:  # v1/v1beta2 `exactly`, or v1beta1's fields on the request itself
        listed = [_alternative(_map(request.get("exactly")) or request)]
    alternatives = tuple(a for a in listed if a is not None)
    return ClaimRequest(_text(request["name"]), alternatives) if alternatives else None


def resource_claim_from_api(obj: Mapping[str, Any]) -> ResourceClaim:
    """A ResourceClaim from its JSON: its requests, and whether (and with how many devices) it is allocated."""
    namespace, name = _name(obj)
    requests = (_claim_request(r) for r in _list(_map(_map(obj.get("spec")).get("devices")).get("requests")))
    status = _map(obj.get("status"))
    allocation = status.get("allocation")
    results = _list(_map(_map(allocation).get("devices")).get("results"))
    return ResourceClaim(namespace, name, tuple(r for r in requests if r is not None), isinstance(allocation, Mapping),
                         sum(isinstance(r, Mapping) for r in results), len(_list(status.get("reservedFor"))))


def key_of(record: Slice | DeviceClass | ResourceClaim) -> tuple[str, str]:
    """(namespace, name) of a record ("" for the cluster-scoped slices and classes)."""
    return (record.namespace if isinstance(record, ResourceClaim) else "", record.name)


# --------------------------------------------------------------------------------------------- questions


@dataclass(frozen=True, slots=True)
class DeviceSummary:
    """An answer of `nodes_with`: matching devices in all, nodes with at least the count asked, a few of them, the
    most on one node."""

    devices: int
    nodes: int
    shown: tuple[str, ...]
    largest: int


@dataclass(frozen=True, slots=True)
class ValueCount:
    value: str
    nodes: int
    devices: int


# --------------------------------------------------------------------------------------------- aggregates

_Empty: immutables.Map[Any, Any] = immutables.Map()
NodeSlices = immutables.Map[str, Slice]  # one node's slices by name


class _Matching:
    """Per node, how many devices match a query, and per count the nodes that have it; and the devices on which the
    query is undecided (a selector fails on them), per node."""

    def __init__(self, query: DeviceQuery, at: Iterable[tuple[str, NodeSlices]]) -> None:
        self.query = query
        self.per_node: immutables.Map[str, int] = _Empty
        self.by_count: immutables.Map[int, immutables.Map[str, bool]] = _Empty
        self.undecided: immutables.Map[str, int] = _Empty
        self.devices = 0
        for node, slices in at:
            self.update(node, slices.values())

    def update(self, node: str, slices: Iterable[Slice]) -> None:
        new, undecided = self.query.count((s.driver, d) for s in slices for d in s.devices)
        if undecided != self.undecided.get(node, 0):
            self.undecided = self.undecided.set(node, undecided) if undecided else self.undecided.delete(node)
        old = self.per_node.get(node, 0)
        if new == old:
            return
        self.devices += new - old
        if old:
            rest = self.by_count[old].delete(node)
            self.by_count = self.by_count.set(old, rest) if rest else self.by_count.delete(old)
            self.per_node = self.per_node.delete(node)
        if new:
            self.by_count = self.by_count.set(new, self.by_count.get(new, _Empty).set(node, True))
            self.per_node = self.per_node.set(node, new)

    def frozen(self) -> _Matching:
        """A copy for a view: the maps are persistent, so this costs a few references."""
        copy = _Matching(self.query, ())
        copy.per_node, copy.by_count, copy.undecided, copy.devices = (
            self.per_node, self.by_count, self.undecided, self.devices)
        return copy

    def summary(self, count: int) -> DeviceSummary | None:
        if self.undecided:
            return None
        nodes, shown = 0, list[str]()
        for have, members in self.by_count.items():  # as many entries as distinct counts, not nodes
            if have >= max(count, 1):
                nodes += len(members)
                shown.extend(name for name, _ in zip(members, range(SHOWN), strict=False))
        return DeviceSummary(self.devices, nodes, tuple(sorted(shown)[:SHOWN]), max(self.by_count.keys(), default=0))


class _Values:
    """Per value of one attribute of one driver's devices: the nodes that have it (with how many) and the devices."""

    def __init__(self, driver: str, attribute: str, at: Iterable[tuple[str, NodeSlices]]) -> None:
        self.driver, self.attribute = driver, attribute
        self.nodes: immutables.Map[str, immutables.Map[str, int]] = _Empty
        self.devices: immutables.Map[str, int] = _Empty
        for node, slices in at:
            self.update(node, (), slices.values())

    def _counted(self, slices: Iterable[Slice]) -> Counter[str]:
        return Counter(found[1] for s in slices if s.driver == self.driver for d in s.devices
                       if (found := d.attribute(self.attribute)) is not None)

    def update(self, node: str, old: Iterable[Slice], new: Iterable[Slice]) -> None:
        before, after = self._counted(old), self._counted(new)
        for value in before.keys() | after.keys():
            change = after[value] - before[value]
            if not change:
                continue
            devices = self.devices.get(value, 0) + change
            self.devices = self.devices.set(value, devices) if devices else self.devices.delete(value)
            members = self.nodes.get(value, _Empty)
            members = members.set(node, after[value]) if after[value] else members.delete(node)
            self.nodes = self.nodes.set(value, members) if members else self.nodes.delete(value)

    def frozen(self) -> _Values:
        copy = _Values(self.driver, self.attribute, ())
        copy.nodes, copy.devices = self.nodes, self.devices
        return copy

    def answer(self) -> tuple[ValueCount, ...]:
        found = (ValueCount(v, len(self.nodes.get(v, _Empty)), n) for v, n in self.devices.items())
        return tuple(sorted(found, key=lambda c: (-c.nodes, c.value)))


# --------------------------------------------------------------------------------------------- view


class DraView:
    """The DRA inventory at one moment: immutable, answered without walking the slices once a question is tracked."""

    def __init__(self, at: immutables.Map[str, NodeSlices] = _Empty, classes: immutables.Map[str, DeviceClass] = _Empty,
                 claims: immutables.Map[tuple[str, str], ResourceClaim] = _Empty,
                 matching: Mapping[DeviceQuery, _Matching] | None = None,
                 values: Mapping[tuple[str, str], _Values] | None = None,
                 requests: deque[DeviceQuery | tuple[str, str]] | None = None, counts: Mapping[Kind, int] | None = None,
                 listed: frozenset[Kind] = frozenset()) -> None:
        self._at, self._classes, self._claims = at, classes, claims
        self.listed = listed  # the kinds listed from a server that serves them to us (not absent, not forbidden)
        self._matching: dict[DeviceQuery, _Matching] = dict(matching or {})
        self._values: dict[tuple[str, str], _Values] = dict(values or {})
        self._answers: dict[tuple[str, str], tuple[ValueCount, ...]] = {}
        self._serving: dict[str, DeviceClass | None] = {}  # extended resource -> its DeviceClass, once per view
        self._requests = requests
        self.counts: Mapping[Kind, int] = counts or dict.fromkeys(KINDS, 0)

    @property
    def devices_known(self) -> bool:
        """Whether the ResourceSlices and DeviceClasses were listed: only then does an empty answer mean "no such
        device" rather than "not known" (a cluster without DRA, or an identity that may not read them)."""
        return {"resourceslices", "deviceclasses"} <= self.listed

    def slices(self) -> Iterator[Slice]:
        """Every slice (for the tools; a review asks `nodes_with` or `values` instead)."""
        for slices in self._at.values():
            yield from slices.values()

    def _all_at(self) -> Iterator[tuple[str, NodeSlices]]:
        return iter(self._at.items())

    def nodes_with(self, query: DeviceQuery, count: int = 1) -> DeviceSummary | None:
        """The nodes with at least `count` devices matching `query` (node "" stands for the slices that are not
        node-local); None when a selector fails on a device (the scheduler fails such a claim's allocation, and the
        webhook makes no decision)."""
        found = self._matching.get(query)
        if found is None:
            found = self._matching[query] = _Matching(query, self._all_at())  # once per view, then tracked
            if self._requests is not None:
                self._requests.append(query)
        return found.summary(count)

    def values(self, driver: str, attribute: str) -> tuple[ValueCount, ...]:
        """The values of an attribute (qualified: `gpu.nvidia.com/productName`) among a driver's devices, the most
        widespread first."""
        key = (driver, _qualified(driver, attribute))
        answer = self._answers.get(key)
        if answer is None:
            found = self._values.get(key)
            if found is None:
                found = self._values[key] = _Values(*key, self._all_at())  # once per view, then tracked
                if self._requests is not None:
                    self._requests.append(key)
            answer = self._answers[key] = found.answer()  # as many entries as values (products), not devices
        return answer

    def nodes_by_count(self, query: DeviceQuery) -> Iterator[tuple[int, Iterable[str]]] | None:
        """The nodes with devices matching `query`, grouped by how many they have, most first (node "" stands for
        the slices that are not node-local); None when a selector fails on a device, as for `nodes_with`."""
        self.nodes_with(query)  # tracked from here on
        found = self._matching[query]
        if found.undecided:
            return None
        return ((have, found.by_count[have].keys()) for have in sorted(found.by_count.keys(), reverse=True))

    def serving(self, resource: str) -> DeviceClass | None:
        """The DeviceClass kube-scheduler hands `resource` to (KEP-5004), as its extended resource cache decides
        (k8s.io/dynamic-resource-allocation deviceclass/extendedresourcecache): the class the implicit name
        `deviceclass.resource.kubernetes.io/<class>` names, else among the classes whose `extendedResourceName` is
        `resource` the newest, a tie going to the lower name; None when no class maps it."""
        if resource.startswith(IMPLICIT_PREFIX):
            return self._classes.get(resource[len(IMPLICIT_PREFIX):])
        if resource not in self._serving:
            mapping = [c for c in self._classes.values() if c.extended_resource_name == resource]
            newest = max((c.created for c in mapping), default="")  # "" (no timestamp) is the oldest
            self._serving[resource] = min((c for c in mapping if c.created == newest), key=lambda c: c.name,
                                          default=None)
        return self._serving[resource]

    def claim(self, namespace: str, name: str) -> ResourceClaim | None:
        return self._claims.get((namespace, name))

    def device_class(self, name: str) -> DeviceClass | None:
        return self._classes.get(name)

    def device_classes(self) -> tuple[str, ...]:
        return tuple(sorted(self._classes.keys()))


# --------------------------------------------------------------------------------------------- writer


def view_from_api(slices: Iterable[Mapping[str, Any]] = (), classes: Iterable[Mapping[str, Any]] = (),
                  resource_claims: Iterable[Mapping[str, Any]] = ()) -> DraView:
    """A view of DRA objects given at once (a dump for `check --nodes` and the rule cases), parsed as the server's.
    A kind counts as listed when at least one object of it is given."""
    index = DraIndex()
    for kind, parse, given in (("resourceslices", slice_from_api, list(slices)),
                               ("deviceclasses", device_class_from_api, list(classes)),
                               ("resourceclaims", resource_claim_from_api, list(resource_claims))):
        index.replace(kind, map(parse, given), absent=not given)  # type: ignore[arg-type]
    return index.view()


class DraIndex:
    """The writer's side: one lock held by the callers (the inventory's reflector threads and `view()`)."""

    def __init__(self) -> None:
        self._at: immutables.Map[str, NodeSlices] = _Empty
        self._where: dict[str, str] = {}  # slice name -> its node
        self._classes: immutables.Map[str, DeviceClass] = _Empty
        self._claims: immutables.Map[tuple[str, str], ResourceClaim] = _Empty
        self._matching: dict[DeviceQuery, _Matching] = {}
        self._values: dict[tuple[str, str], _Values] = {}
        self._requests: deque[DeviceQuery | tuple[str, str]] = deque()
        self._view: DraView | None = None
        self._listed: set[Kind] = set()

    def count(self, kind: str) -> int:
        return {"resourceslices": len(self._where), "deviceclasses": len(self._classes),
                "resourceclaims": len(self._claims)}.get(kind, 0)

    def put(self, record: Slice | DeviceClass | ResourceClaim) -> None:
        if isinstance(record, Slice):
            self._remove_slice(record.name)
            node = record.node
            self._where[record.name] = node
            self._set_node(node, self._at.get(node, _Empty).set(record.name, record))
        elif isinstance(record, DeviceClass):
            self._classes = self._classes.set(record.name, record)
        else:
            self._claims = self._claims.set((record.namespace, record.name), record)
        self._view = None

    def remove(self, kind: str, key: tuple[str, str]) -> None:
        if kind == "resourceslices":
            self._remove_slice(key[1])
        elif kind == "deviceclasses":
            self._classes = self._classes.delete(key[1]) if key[1] in self._classes else self._classes
        elif key in self._claims:
            self._claims = self._claims.delete(key)
        self._view = None

    def replace(self, kind: Kind, records: Iterable[Slice | DeviceClass | ResourceClaim], absent: bool = False) -> None:
        """A relist: every object of one kind at once; `absent` when the server does not serve the kind to us (then
        the kind is not `listed`, and its emptiness means nothing)."""
        if absent:
            self._listed.discard(kind)
        else:
            self._listed.add(kind)
        if kind == "resourceslices":
            for name in list(self._where):
                self._remove_slice(name)
        elif kind == "deviceclasses":
            self._classes = _Empty
        else:
            self._claims = _Empty
        for record in records:
            self.put(record)
        self._view = None

    def _remove_slice(self, name: str) -> None:
        node = self._where.pop(name, None)
        if node is not None:
            self._set_node(node, self._at[node].delete(name))

    def _set_node(self, node: str, slices: NodeSlices) -> None:
        old = self._at.get(node, _Empty)
        self._at = self._at.set(node, slices) if slices else self._at.delete(node)
        for matching in self._matching.values():
            matching.update(node, slices.values())
        for values in self._values.values():
            values.update(node, old.values(), slices.values())

    def view(self) -> DraView:
        """The current state as an immutable view; questions asked of earlier views are tracked from now on."""
        while self._requests:
            asked = self._requests.popleft()
            if len(self._matching) + len(self._values) >= MAX_TRACKED:
                break
            if isinstance(asked, DeviceQuery) and asked not in self._matching:
                self._matching[asked] = _Matching(asked, self._at.items())
                self._view = None
            elif isinstance(asked, tuple) and asked not in self._values:
                self._values[asked] = _Values(*asked, self._at.items())
                self._view = None
        if self._view is None:
            self._view = DraView(
                self._at, self._classes, self._claims,
                {q: m.frozen() for q, m in self._matching.items()},
                {k: v.frozen() for k, v in self._values.items()}, self._requests,
                {k: self.count(k) for k in KINDS}, frozenset(self._listed))
        return self._view

