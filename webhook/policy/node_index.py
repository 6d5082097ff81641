"""The nodes of a snapshot, indexed by what the inventory decisions ask, so that a review's cost does not grow
with the cluster.

Two halves:

- `NodeIndex`, the writer's side (one thread, or callers holding one lock): nodes go in and out one event at
  a time (`put`, `remove`) in time proportional to that node, or all at once (`NodeIndex.build`, a relist).
- `NodeView`, what a review reads: immutable. `NodeIndex.view()` publishes one after whole events only, so a
  review never sees half an update, and a view stays valid while the writer moves on (the maps are
  persistent `immutables.Map`s: a change copies only the path to the entry it changes).

What a view answers without looking at every node:

- `offering[resource]`: the nodes whose allocatable has `resource` > 0, with the amount;
- `summary(query)`: for a `Query` (a placement's nodeSelector, required node affinity and tolerations, and the
  resources it asks for): how many nodes match, the first few by name, the largest offer and the node that has
  it. A query is answered from an aggregate the writer keeps up to date on every Node event (O(1) for the
  reader) once a review has asked it; the first time, it is computed from `offering` (time proportional to the
  nodes that offer the resource) and the writer is asked to track it from then on. At most `MAX_TRACKED`
  queries are tracked; the rest are computed per view (and memoised in it).

Node events cost O(labels changed + tracked queries on the node's GPU resources); a review on a tracked query
costs a dictionary lookup.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import immutables
from sortedcontainers import SortedList

MAX_TRACKED = 512  # distinct queries kept up to date by the writer (classes x resources x Pod selections)
SHOWN = 3  # names kept per query: the messages name at most this many nodes

Kind = Literal["eligible", "matched", "ready"]


# --------------------------------------------------------------------------------------------- queries


@dataclass(frozen=True)
class Query:
    """A question about the nodes, keyed by value.

    `eligible`: Ready nodes offering `resources[0]`, selected by the nodeSelector and affinity, whose hard
    (non-transient) taints the tolerations tolerate; the offer is the amount of that resource.
    `matched`: nodes offering any of `resources` and selected, whatever their readiness and taints; `ready`: the
    same, Ready only. Every answer also counts the members `time_sliced` says share their GPUs.
    """

    kind: Kind
    resources: tuple[str, ...]
    selector: tuple[tuple[str, str], ...]
    affinity: str  # canonical JSON of the required node affinity, "" for none
    tolerations: str  # canonical JSON, "" for none
    admits: Callable[[Any], int] = field(compare=False, hash=False, repr=False)
    labels_read: frozenset[str] = field(default=frozenset(), compare=False, hash=False, repr=False)
    time_sliced: Callable[[Any], bool] = field(default=lambda node: False, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Summary:
    """The answer to a Query: how many nodes, the first `SHOWN` by name, the largest (offer, name), and how many
    of them share their GPUs by time-slicing (`Query.time_sliced`)."""

    count: int = 0
    first: tuple[str, ...] = ()
    largest: tuple[int, str] | None = None
    time_sliced: int = 0


EMPTY = Summary()


def canonical(value: Any) -> str:
    """A stable text key for a JSON value (affinity, tolerations)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str) if value else ""


# --------------------------------------------------------------------------------------------- view


class NodeList(Sequence[Any]):
    """A view's nodes in name order, materialised on first use (for the linear readers: `doctor`, tests)."""

    __slots__ = ("_nodes", "_sorted", "view")

    def __init__(self, view: NodeView) -> None:
        self.view = view
        self._nodes = view.nodes
        self._sorted: tuple[Any, ...] | None = None

    def _all(self) -> tuple[Any, ...]:
        if self._sorted is None:
            self._sorted = tuple(self._nodes[name] for name in sorted(self._nodes))
        return self._sorted

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._all())

    def __bool__(self) -> bool:
        return len(self._nodes) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NodeList):
            return self._nodes == other._nodes
        return isinstance(other, tuple | list) and self._all() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return f"NodeList({len(self)} nodes)"


class NodeView:
    """One consistent, immutable state of the index (what a review reads)."""

    __slots__ = ("_wanted", "memo", "node_list", "nodes", "offering", "summaries")

    def __init__(self, nodes: immutables.Map[str, Any], offering: immutables.Map[str, immutables.Map[str, int]],
                 summaries: Mapping[Query, Summary], wanted: deque[Query] | None) -> None:
        self.nodes = nodes
        self.offering = offering
        self.summaries = summaries
        self._wanted = wanted
        self.memo: dict[Any, Any] = {}  # answers computed on this view (a cache: same view, same answer)
        self.node_list = NodeList(self)

    def offers(self, resource: str) -> immutables.Map[str, int]:
        """name -> amount of the nodes offering `resource` (> 0)."""
        return self.offering.get(resource) or _NO_OFFERS

    def summary(self, query: Query) -> Summary:
        """The query's answer: the writer's aggregate when tracked, else computed here once per view."""
        found = self.summaries.get(query)
        if found is not None:
            return found
        memo = self.memo.get(query)
        if memo is None:
            memo = self.memo[query] = _summarise(self.candidates(query), query)
            if self._wanted is not None:
                self._wanted.append(query)  # the writer tracks it from its next view on
        return memo

    def candidates(self, query: Query) -> Iterator[Any]:
        """The nodes that could satisfy `query`: those offering one of its resources (each once)."""
        if len(query.resources) == 1:
            nodes = self.nodes
            return (nodes[name] for name in self.offers(query.resources[0]))
        names: set[str] = set()
        for resource in query.resources:
            names.update(self.offers(resource))
        return (self.nodes[name] for name in names)

    def first_names(self, names: Iterable[str], n: int = SHOWN) -> list[str]:
        return heapq.nsmallest(n, names)


_NO_OFFERS: immutables.Map[str, int] = immutables.Map()


def _summarise(nodes: Iterable[Any], query: Query) -> Summary:
    admits, time_sliced = query.admits, query.time_sliced
    count = sliced = 0
    first: list[str] = []
    largest: tuple[int, str] | None = None
    for node in nodes:
        offer = admits(node)
        if offer < 0:
            continue
        count += 1
        sliced += time_sliced(node)
        first.append(node.name)
        if len(first) > SHOWN * 4:
            first = heapq.nsmallest(SHOWN, first)
        mine = (offer, node.name)
        if largest is None or mine > largest:
            largest = mine
    return Summary(count, tuple(heapq.nsmallest(SHOWN, first)), largest, sliced)


# --------------------------------------------------------------------------------------------- writer


class _Aggregate:
    """A tracked query's members, kept in name order and by offer (the writer's, never seen by readers)."""

    __slots__ = ("by_offer", "names", "offers", "query", "sliced")

    def __init__(self, query: Query, nodes: Iterable[Any]) -> None:
        self.query = query
        self.sliced: set[str] = set()  # members that share their GPUs by time-slicing
        self.offers: dict[str, int] = {}
        self.names: SortedList = SortedList()
        self.by_offer: dict[int, SortedList] = {}
        for node in nodes:
            self.update(None, node)

    def update(self, old: Any, new: Any) -> bool:
        """Move one node in or out; True when the summary may have changed."""
        admits = self.query.admits
        name = (new or old).name
        before = self.offers.get(name, -1)
        after = admits(new) if new is not None else -1
        sliced = after >= 0 and self.query.time_sliced(new)
        if sliced != (name in self.sliced):
            if sliced:
                self.sliced.add(name)
            else:
                self.sliced.discard(name)
            if before == after:
                return True
        if before == after:
            return False
        if before >= 0:
            del self.offers[name]
            self.names.remove(name)
            bucket = self.by_offer[before]
            bucket.remove(name)
            if not bucket:
                del self.by_offer[before]
        if after >= 0:
            self.offers[name] = after
            self.names.add(name)
            self.by_offer.setdefault(after, SortedList()).add(name)
        return True

    def summary(self) -> Summary:
        if not self.offers:
            return EMPTY
        top = max(self.by_offer)
        return Summary(len(self.offers), tuple(self.names.islice(0, SHOWN)), (top, self.by_offer[top][-1]),
                       len(self.sliced))


def _extended(node: Any) -> Mapping[str, int]:
    return node.allocatable if node is not None else {}


def _persistent(items: Mapping[str, Any]) -> immutables.Map[str, Any]:
    """A persistent map of `items`, built one entry per bytecode step: `immutables.Map(items)` is one C call that
    holds the GIL for all of them (26-80 ms at 100,000 nodes), so the reviews of a relisting worker would wait."""
    mutation: immutables.MapMutation[str, Any] = immutables.Map().mutate()
    for key, value in items.items():
        mutation[key] = value
    return mutation.finish()


class NodeIndex:
    """The writer's side: apply Node events, publish immutable views. Not thread-safe by itself: one writer
    (or a lock around `put`, `remove` and `view`). Readers only touch views."""

    def __init__(self) -> None:
        self._nodes: immutables.Map[str, Any] = immutables.Map()
        self._offering: immutables.Map[str, immutables.Map[str, int]] = immutables.Map()
        self._aggregates: dict[Query, _Aggregate] = {}
        self._by_resource: dict[str, list[_Aggregate]] = {}
        self._summaries: dict[Query, Summary] = {}
        self._dirty: set[Query] = set()
        self._wanted: deque[Query] = deque()
        self._view: NodeView | None = None
        self._labels_read: frozenset[str] = frozenset()  # by the tracked queries: other labels never move a node

    # ----------------------------------------------------------------------------------------- building

    @classmethod
    def build(cls, nodes: Iterable[Any], queries: Iterable[Query] = ()) -> NodeIndex:
        """An index of `nodes` (a full list), tracking `queries` (those of the index it replaces)."""
        index = cls()
        by_name = {node.name: node for node in nodes}
        offering: dict[str, dict[str, int]] = {}
        for name, node in by_name.items():
            for resource, amount in node.allocatable.items():
                if amount > 0:
                    offering.setdefault(resource, {})[name] = amount
        index._nodes = _persistent(by_name)
        index._offering = immutables.Map({r: _persistent(names) for r, names in offering.items()})
        for query in queries:
            index._track(query)
        return index

    def queries(self) -> list[Query]:
        """The tracked queries (to carry over to an index built beside this one)."""
        return [*self._aggregates, *self._wanted]

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, name: str) -> Any:
        return self._nodes.get(name)

    # ----------------------------------------------------------------------------------------- events

    def put(self, node: Any) -> bool:
        """Add or replace a node; False when nothing changed."""
        old = self._nodes.get(node.name)
        if old == node:
            return False
        self._nodes = self._nodes.set(node.name, node)
        self._changed(old, node)
        return True

    def remove(self, name: str) -> bool:
        old = self._nodes.get(name)
        if old is None:
            return False
        self._nodes = self._nodes.delete(name)
        self._changed(old, None)
        return True

    def _changed(self, old: Any, new: Any) -> None:
        self._view = None
        if old is not None and new is not None and old.ready == new.ready and old.taints == new.taints \
                and old.allocatable == new.allocatable \
                and all(old.labels.get(k) == new.labels.get(k) for k in self._labels_read):
            return  # a label no tracked query reads (a GFD timestamp, an annotation-like label): nothing moves
        before, after = _extended(old), _extended(new)
        name = (new or old).name
        offering = self._offering
        for resource in before.keys() | after.keys():
            had, has = before.get(resource, 0), after.get(resource, 0)
            if had == has:
                continue
            names = offering.get(resource) or _NO_OFFERS
            names = names.set(name, has) if has > 0 else names.delete(name) if had > 0 else names
            offering = offering.set(resource, names) if names else offering.delete(resource)
        self._offering = offering
        touched: dict[int, _Aggregate] = {}
        for resource in before.keys() | after.keys():
            for aggregate in self._by_resource.get(resource, ()):
                touched[id(aggregate)] = aggregate
        for aggregate in touched.values():
            if aggregate.update(old, new):
                self._dirty.add(aggregate.query)

    # ----------------------------------------------------------------------------------------- queries

    def _track(self, query: Query) -> None:
        if query in self._aggregates or len(self._aggregates) >= MAX_TRACKED:
            return
        view = self._view or self._publish()
        aggregate = _Aggregate(query, view.candidates(query))
        self._aggregates[query] = aggregate
        self._labels_read |= query.labels_read
        for resource in query.resources:
            self._by_resource.setdefault(resource, []).append(aggregate)
        self._dirty.add(query)
        self._view = None

    def _publish(self) -> NodeView:
        if self._dirty:
            summaries = dict(self._summaries)
            for query in self._dirty:
                summaries[query] = self._aggregates[query].summary()
            self._summaries = summaries
            self._dirty = set()
        return NodeView(self._nodes, self._offering, self._summaries, self._wanted)

    def view(self) -> NodeView:
        """The current state as an immutable view (the same object until something changes)."""
        while self._wanted:
            self._track(self._wanted.popleft())
        if self._view is None:
            self._view = self._publish()
        return self._view

    @property
    def pending(self) -> bool:
        """A review asked for queries the writer does not track yet (`view()` starts tracking them)."""
        return bool(self._wanted)


@contextlib.contextmanager
def bulk_load() -> Iterator[None]:
    """Around a full list's parse and build: the cycle collector is paused, and what was built is then moved out
    of its reach (`gc.freeze`).

    The nodes and the index hold no reference cycles (frozen dataclasses, dicts of strings, persistent maps), so
    the collector never frees any of them, yet a full collection walks them all: at 7,500 nodes one took 186 ms
    in the middle of a relist, holding the GIL, so every review in the worker waited. Frozen objects are still
    freed by reference counting when the next relist replaces them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # before the collector is back: another thread's next allocation would start a collection
        if enabled:  # over everything built meanwhile (2.1 s at 100,000 nodes when the order was the other way)
            gc.enable()


__all__ = ["EMPTY", "MAX_TRACKED", "SHOWN", "NodeIndex", "NodeList", "NodeView", "Query", "Summary", "bulk_load",
           "canonical"]
