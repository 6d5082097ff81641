"""Whether a claim's GPU requests can be allocated on the cluster's devices (`dra-unsatisfiable`), and which placed
defaults to hold back so that the claim stays allocatable (as `webhook.policy.engine` holds back a Pod's nodeSelector
that would leave it no node).

Pure: a parsed claim (`webhook.policy.claims`), the DRA part of the inventory (`webhook.policy.dra_inventory.DraView`)
and the selectors the class would add, in; findings out. A request or subrequest is allocatable when some node (or
a pool that is not node-local) has `count` devices (one for `allocationMode: All`) that match its DeviceClass's own
selectors, then the selectors it will carry: the author's, or else the class's. A `firstAvailable` request is
allocatable when one of its alternatives is. Nothing is said when the answer is not known: the devices were not
listed (no DRA, or not readable), a selector does not compile, or it fails on a device (the scheduler would fail
that allocation, and the webhook never decides on what it cannot evaluate).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from webhook.policy.claims import Claim, DeviceAsk, shown
from webhook.policy.device_selectors import query_of
from webhook.policy.dra_inventory import DeviceSummary, DraView

RULE = "dra-unsatisfiable"
SHOWN_VALUES = 4
_ATTRIBUTE = re.compile(r"""device\.attributes\[\s*(["'])([^"'\\]+)\1\s*\]\.([A-Za-z_][A-Za-z0-9_]*)""")
Placed = Mapping[str, Sequence[tuple[str, str]]]  # DeviceClass -> (source, CEL) the class adds


@dataclass(frozen=True)
class Fit:
    """What the devices say of a claim: findings as (rule, message), and the sources (`gpu-type t4`) of defaulted
    selectors held back because they would leave a request no device."""

    findings: tuple[tuple[str, str], ...] = ()
    held: frozenset[str] = frozenset()


def assess(claim: Claim, gpu_asks: Sequence[DeviceAsk], view: DraView, placed: Placed,
           defaulted: frozenset[str]) -> Fit:
    """Hold back defaulted selectors that would leave a GPU ask no device, then judge every GPU request."""
    if not view.devices_known or not gpu_asks:
        return Fit()
    findings: list[tuple[str, str]] = []
    held: set[str] = set()
    for ask in gpu_asks:
        if ask.has_selectors:
            continue
        own = _class_selectors(view, ask.device_class)
        if own is None:
            continue
        kept = [e for source, e in placed.get(ask.device_class, ()) if source not in defaulted]
        if _verdict(ask, [*own, *kept], view) is not True:
            continue  # unsatisfiable (or unknown) before the defaults: the request is reported below
        for source, expression in placed.get(ask.device_class, ()):
            if source not in defaulted or source in held:
                continue
            if _verdict(ask, [*own, *kept, expression], view) is False:
                held.add(source)
                findings.append(("gpu-class-skipped", _held_message(claim, ask, source, expression, view)))
            else:
                kept.append(expression)
    for request in claim.requests:
        if not all(a in gpu_asks for a in request.asks):
            continue  # no GPU ask, or an alternative of another kind of device: not ours to judge
        problems = []
        for alternative in request.asks:
            problem = _problem(claim, alternative, view, _carried(alternative, placed, held))
            if problem is None:
                break  # this alternative can be allocated (or is not known): the request can
            problems.append(problem)
        else:
            findings.append((RULE, _joined(claim, request.name, problems) if request.alternatives else problems[0]))
    return Fit(tuple(findings), frozenset(held))


def _carried(ask: DeviceAsk, placed: Placed, held: set[str]) -> list[str]:
    """The selectors the ask will carry: the author's, or the class's that are not held back."""
    if ask.has_selectors:
        return list(ask.selectors)
    return [e for source, e in placed.get(ask.device_class, ()) if source not in held]


def _class_selectors(view: DraView, name: str) -> tuple[str, ...] | None:
    found = view.device_class(name)
    return found.selectors if found is not None else None


def _nodes_with(expressions: Sequence[str], count: int, view: DraView) -> DeviceSummary | None:
    query = query_of(tuple(expressions))
    return view.nodes_with(query, count) if query is not None else None


def _summary(ask: DeviceAsk, expressions: Sequence[str], view: DraView) -> DeviceSummary | None:
    return _nodes_with(expressions, ask.count or 1, view)


def _verdict(ask: DeviceAsk, expressions: Sequence[str], view: DraView) -> bool | None:
    summary = _summary(ask, expressions, view)
    return None if summary is None else summary.nodes > 0


def _problem(claim: Claim, ask: DeviceAsk, view: DraView, carried: Sequence[str]) -> str | None:
    """Why the ask cannot be allocated, or None when it can (or the answer is not known)."""
    what = f"{claim.describe()}: {ask.where()}"
    own = _class_selectors(view, ask.device_class)
    if own is None:
        known = ", ".join(view.device_classes()) or "none"
        return (f"{what} asks for DeviceClass {ask.device_class}, which does not exist in the cluster (it has: "
                f"{known}), so the scheduler cannot allocate it and a Pod using it stays Pending; use a DeviceClass "
                f"that exists, or create {ask.device_class}")
    expressions = [*own, *carried]
    summary = _summary(ask, expressions, view)
    if summary is None or summary.nodes > 0:
        return None
    selecting = _describe_selectors(own, carried)
    need = ask.count or 1
    if summary.devices:
        return (f"{what} asks for {need} devices of DeviceClass {ask.device_class} matching {selecting}, but no "
                f"node has that many: {summary.devices} match, at most {summary.largest} on one node; a Pod using "
                f"it stays Pending; ask for {summary.largest} or fewer, or split the work")
    return (f"{what} can be allocated on no node: no device of DeviceClass {ask.device_class} matches "
            f"{selecting}, so a Pod using it stays Pending; the cluster has "
            f"{_instead(view, ask.device_class, carried)}; "
            "change the selector or the claim's class label")


def _describe_selectors(own: Sequence[str], carried: Sequence[str]) -> str:
    parts = [f"the DeviceClass's selector {' && '.join(map(shown, own))}"] if own else []
    if carried:
        parts.append(f"the request's selector {' && '.join(map(shown, carried))}")
    return " and ".join(parts) or "any device (no selector)"


def _instead(view: DraView, device_class: str, carried: Sequence[str]) -> str:
    """What the devices of the class's drivers offer for the attributes the selectors read: values with how many
    nodes and devices have each (the most widespread first)."""
    found = view.device_class(device_class)
    own, drivers = (found.selectors, set(found.drivers)) if found is not None else ((), set())
    attributes = dict.fromkeys((m.group(2), m.group(3)) for e in carried for m in _ATTRIBUTE.finditer(e))
    said = []
    for domain, name in attributes:
        for driver in sorted(drivers or {domain}):
            values = view.values(driver, f"{domain}/{name}")
            if values:
                listed = ", ".join(f"{v.value} ({v.nodes} node{'s' if v.nodes != 1 else ''}, {v.devices} "
                                   f"device{'s' if v.devices != 1 else ''})" for v in values[:SHOWN_VALUES])
                more = f" and {len(values) - SHOWN_VALUES} more" if len(values) > SHOWN_VALUES else ""
                said.append(f"{name} {listed}{more}")
    if said:
        return "; ".join(said)
    matching = _nodes_with(own, 1, view)
    if matching is None or not matching.devices:
        return "no device of that DeviceClass at all (is its DRA driver running?)"
    return f"{matching.devices} devices of that DeviceClass on {matching.nodes} nodes"


def _held_message(claim: Claim, ask: DeviceAsk, source: str, expression: str, view: DraView) -> str:
    need = ask.count or 1
    matching = "matches no device" if need == 1 else f"leaves no node with {need} devices"
    return (f"{source} (from the defaults) not applied to {claim.describe()} {ask.where()}: its selector "
            f"{shown(expression)} {matching} of DeviceClass {ask.device_class}, so the claim could never be "
            f"allocated; the cluster has {_instead(view, ask.device_class, [expression])}; label the claim, or "
            "change the default in the rules")


def _joined(claim: Claim, name: str, problems: Sequence[str]) -> str:
    """One message for a `firstAvailable` request none of whose subrequests can be allocated."""
    return (f"{claim.describe()}: request {shown(name)}: none of its firstAvailable subrequests can be allocated: "
            + " | ".join(problems))


def explain(claim: Claim, gpu_asks: Sequence[DeviceAsk], view: DraView) -> tuple[list[str], list[str]]:
    """For `doctor`: per GPU request of a claim a Pod waits on, how many devices pass each stage of its selection
    (the DeviceClass's selectors, then the request's own) and the most on one node against the count it needs.
    (problems, evidence): a problem is a request no node can satisfy, said as `dra-unsatisfiable` says it."""
    problems: list[str] = []
    evidence: list[str] = []
    if not view.devices_known:
        return problems, ["the ResourceSlices and DeviceClasses were not listed (no DRA, or not readable)"]
    for ask in gpu_asks:
        own = _class_selectors(view, ask.device_class)
        where = f"{claim.describe()} {ask.where()}"
        if own is None:
            problems.append(_problem(claim, ask, view, ask.selectors) or where)
            continue
        stages = [("its DeviceClass's selectors", list(own))]
        if ask.selectors:
            stages.append(("and the request's selectors", [*own, *ask.selectors]))
        said = []
        for label, expressions in stages:
            summary = _summary(ask, expressions, view)
            if summary is None:
                said.append(f"{label}: not known (a selector fails on some device or does not compile)")
                break
            said.append(f"{label}: {summary.devices} devices, at most {summary.largest} on one node")
        evidence.append(f"{where} needs {ask.count or 1} on one node; {'; '.join(said)}")
        problem = _problem(claim, ask, view, ask.selectors)
        if problem is not None:
            problems.append(problem)
    return problems, evidence
