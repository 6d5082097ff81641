"""`gpu-webhook doctor`: what to conclude about one GPU Pod from plain API data.

`diagnose(policy, facts)` walks the path a GPU Pod takes and returns steps in plain words, each with its
evidence: what the Pod asks for, which nodes advertise it, whether the device plugin runs on the GPU nodes,
which nodes match the Pod's selector and tolerate its taints and how many GPUs they have free, where the Pod
landed, its events (and its owners'), its RuntimeClass, and what this webhook decides for it. The reads are
in `webhook.cluster.reads.read_doctor_facts`; nothing here touches the network.

A step is `ok`, `info`, `warn` or `fail`; any `fail` is where the Pod's path breaks.

A node that advertises a GPU resource is the evidence that a device plugin works there, whatever runs it. What
the kubelet, the container runtime and the scheduler wrote (the Pod's status, its containers' states, its
events, matched to it by `involvedObject.uid`) is explained by `webhook.cluster.explanations.EXPLANATIONS`, a table
of real texts (pattern -> meaning and fix): add a row when a new real text turns up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.cluster.explanations import SEVERITY, Clues, Status, explain
from webhook.policy import checking, dra_fit, inventory
from webhook.policy.checks import gpu_requests
from webhook.policy.dra_extended import served_devices
from webhook.policy.dra_inventory import SHOWN
from webhook.policy.inventory import Node, Placement, Snapshot
from webhook.policy.pods import mapping
from webhook.policy.rules import Policy

Json = Mapping[str, Any]
_SHOWN = 8  # nodes listed as evidence


@dataclass(frozen=True)
class Facts:
    """What `doctor` reads: the Pod, its controller chain, their events, every DaemonSet, the cluster's
    non-terminated Pods (for free GPUs and device plugin Pods) and the inventory snapshot."""

    pod: Json
    owners: tuple[Json, ...] = ()
    events: tuple[Json, ...] = ()
    daemonsets: tuple[Json, ...] = ()
    pods: tuple[Json, ...] = ()
    snapshot: Snapshot = dataclasses.field(default_factory=Snapshot)


@dataclass(frozen=True)
class Step:
    title: str
    status: Status
    summary: str
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"step": self.title, "status": self.status, "summary": self.summary, "evidence": list(self.evidence)}


@dataclass(frozen=True)
class Report:
    pod: str
    steps: tuple[Step, ...]

    @property
    def broken(self) -> bool:
        return any(s.status == "fail" for s in self.steps)

    @property
    def conclusion(self) -> str:
        for status in ("fail", "warn"):
            step = next((s for s in self.steps if s.status == status), None)
            if step is not None:
                return f"{step.title}: {step.summary}"
        return "nothing on this Pod's path is broken"

    def to_json(self) -> dict[str, Any]:
        return {"pod": self.pod, "broken": self.broken, "conclusion": self.conclusion,
                "steps": [s.to_json() for s in self.steps]}


def _name(obj: Json) -> str:
    return str(mapping(obj.get("metadata")).get("name") or "?")


def _namespace(obj: Json) -> str:
    return str(mapping(obj.get("metadata")).get("namespace") or "default")


def diagnose(policy: Policy, facts: Facts) -> Report:
    """Every step of the Pod's path, in order."""
    pod, snapshot = facts.pod, facts.snapshot
    spec = mapping(pod.get("spec"))
    asks = gpu_requests(policy, spec)
    claims = inventory.gpu_claims(policy, snapshot, _namespace(pod), spec)
    steps = [_request_step(asks, claims)]
    where = inventory.with_runtime_class(inventory.placement(spec, ("spec",)),
                                         snapshot.runtime_classes.get(str(spec.get("runtimeClassName") or "")))
    waits = False  # unscheduled because the GPUs of the nodes it can land on are in use
    if asks:  # extended resources: a device plugin on a node that advertises them (DRA claims: the step below)
        used = _used(policy, facts.pods, exclude=_name(pod), namespace=_namespace(pod))
        served = {r: found for r in asks if (found := served_devices(snapshot.dra, r)) is not None}  # KEP-5004
        steps.append(_advertised_step(snapshot, asks, served))
        by_dra = {r: device_class for r, (device_class, _) in served.items() if not snapshot.index.offers(r)}
        steps.append(_device_plugin_step(policy, facts) if len(by_dra) < len(asks) else Step(
            "Device plugin", "info", "not needed for this Pod: " + "; ".join(
                f"DeviceClass {c} serves {r} through DRA (its extendedResourceName)" for r, c in sorted(by_dra.items()))
            + "; a device plugin advertising it on a node would take it over there"))
        dra = {r: per_node for r, (_, per_node) in served.items()}  # counted on the nodes with no plugin for r
        matching = _matching_step(snapshot, where, asks, used, scheduled=bool(spec.get("nodeName")), dra=dra)
        steps.append(matching)
        waits = matching.status == "warn"
    if claims:
        steps.append(_devices_step(policy, snapshot, pod))
    clues = Clues.of([n for n in snapshot.nodes if not _why_not(n, where)], asks)
    steps.append(_landing_step(pod, clues, waits))
    steps.append(_events_step(facts, clues))
    steps.append(_runtime_class_step(snapshot, spec, gpu=bool(asks or claims)))
    steps.append(_webhook_step(policy, facts))
    return Report(f"{_namespace(pod)}/{_name(pod)}", tuple(steps))


# --------------------------------------------------------------------------------------------- steps


def _request_step(asks: Mapping[str, int], claims: Sequence[str]) -> Step:
    parts = [f"{count} {name}" for name, count in sorted(asks.items())]
    parts += [f"resource claim {c}" for c in claims]
    if not parts:
        return Step("GPU request", "info", "the Pod asks for no GPU (no GPU resource in limits, no GPU claim)")
    return Step("GPU request", "ok", f"the Pod asks for {', '.join(parts)}")


def _advertised_step(snapshot: Snapshot, asks: Mapping[str, int],
                     served: Mapping[str, tuple[str, Mapping[str, int]]]) -> Step:
    """`served`: resource -> the DeviceClass that serves it through DRA and its devices per node."""
    evidence: list[str] = []
    missing: list[str] = []
    for resource in sorted(asks):
        offering = [n for n in snapshot.nodes if n.offers(resource) > 0]
        if offering:
            shown = ", ".join(f"{n.name} ({n.offers(resource)})" for n in offering[:_SHOWN])
            evidence.append(f"{resource} allocatable on {len(offering)} node(s): {shown}")
        elif resource in served:
            device_class, per_node = served[resource]
            evidence.append(f"{resource}: no device plugin advertises it; DeviceClass {device_class} serves it through "
                            f"DRA (its extendedResourceName): {sum(per_node.values())} device(s) on {len(per_node)} "
                            f"node(s): {', '.join(sorted(per_node)[:SHOWN])}")
        else:
            missing.append(resource)
            reason = inventory.no_node_reason(snapshot, inventory.Placement({}, (), None, None, False), resource)
            evidence.append(f"{resource}: {reason}")
    if missing:
        return Step("Advertised", "fail", f"no node advertises {', '.join(missing)} in allocatable", tuple(evidence))
    return Step("Advertised", "ok", "nodes advertise the requested resources", tuple(evidence))


def _is_device_plugin(ds: Json) -> bool:
    template = mapping(mapping(mapping(ds.get("spec")).get("template")).get("spec"))
    images = [str(mapping(c).get("image") or "") for c in template.get("containers") or []]
    return "device-plugin" in _name(ds) or any("device-plugin" in image for image in images)


def _gpu_nodes(policy: Policy, snapshot: Snapshot) -> list[Node]:
    """Nodes with a GPU: labelled so by NFD (`nvidia.com/gpu.present`) or GFD (`nvidia.com/gpu.product`), or
    advertising a GPU resource."""
    return [n for n in snapshot.nodes
            if n.labels.get(inventory.GPU_PRESENT_LABEL) == "true" or inventory.product_of(n)
            or any(v > 0 and policy.gpu_resource(r) for r, v in n.allocatable.items())]


def _ready(pod: Json) -> bool:
    conditions = mapping(pod.get("status")).get("conditions") or []
    return any(mapping(c).get("type") == "Ready" and mapping(c).get("status") == "True" for c in conditions)


def _advertising(policy: Policy, snapshot: Snapshot) -> list[Node]:
    """Ready nodes whose allocatable shows a GPU resource: the evidence that a device plugin works there,
    whatever runs it (a DaemonSet of any name, the GPU Operator, a host service)."""
    return [n for n in snapshot.nodes if n.ready and any(v > 0 and policy.gpu_resource(r)
                                                         for r, v in n.allocatable.items())]


def _device_plugin_step(policy: Policy, facts: Facts) -> Step:
    plugins = [ds for ds in facts.daemonsets if _is_device_plugin(ds)]
    gpu_nodes = _gpu_nodes(policy, facts.snapshot)
    working = {n.name for n in _advertising(policy, facts.snapshot)}
    evidence: list[str] = []
    covered: set[str] = set()
    for ds in plugins:
        status = mapping(ds.get("status"))
        ns, name = _namespace(ds), _name(ds)
        evidence.append(f"DaemonSet {ns}/{name}: {status.get('desiredNumberScheduled', 0)} desired, "
                        f"{status.get('numberReady', 0)} ready")
        for pod in facts.pods:
            owners = mapping(pod.get("metadata")).get("ownerReferences") or []
            if _namespace(pod) == ns and any(mapping(o).get("kind") == "DaemonSet" and mapping(o).get("name") == name
                                             for o in owners):
                node_name = str(mapping(pod.get("spec")).get("nodeName") or "")
                if _ready(pod) and node_name:
                    covered.add(node_name)
    if covered:
        evidence.append(f"a ready device plugin Pod runs on: {', '.join(sorted(covered)[:_SHOWN])}")
    silent = [n for n in gpu_nodes if n.name not in covered and n.name not in working]
    for node in silent[:_SHOWN]:
        offers = ", ".join(f"{r}={v}" for r, v in sorted(node.allocatable.items()) if v) or "no GPU resource"
        state = "is not Ready" if not node.ready else "advertises no GPU resource"
        evidence.append(f"GPU node {node.name} has no ready device plugin Pod and {state} (allocatable: {offers})")
    elsewhere = sorted(working - covered)
    if elsewhere:
        evidence.append(f"advertised without a device plugin Pod found (a plugin works there: a host service, "
                        f"another name, the GPU Operator): {', '.join(elsewhere[:_SHOWN])}")
    if silent:
        names = ", ".join(n.name for n in silent[:_SHOWN])
        if not plugins and not working:
            return Step("Device plugin", "fail",
                        f"no node advertises a GPU resource and no device plugin DaemonSet was found (none is named or "
                        f"runs an image with 'device-plugin'); GPU nodes: {names}; install the NVIDIA device plugin "
                        "(or the GPU Operator) on them", tuple(evidence))
        return Step("Device plugin", "warn", f"the device plugin is not running on {len(silent)} GPU node(s): "
                    f"{names}; their GPUs are not (or no longer) advertised: check the plugin's Pod or service "
                    "there", tuple(evidence))
    if not working and not covered:
        return Step("Device plugin", "fail" if not gpu_nodes else "warn",
                    "no device plugin DaemonSet found (none is named or runs an image with 'device-plugin') and no "
                    "node advertises a GPU resource; install the NVIDIA device plugin (or the GPU Operator) on the "
                    "GPU nodes", tuple(evidence))
    return Step("Device plugin", "ok", f"a device plugin works on every GPU node ({len(working | covered)} "
                "advertise GPUs or run a ready plugin Pod)", tuple(evidence))


def _used(policy: Policy, running: Sequence[Json], exclude: str, namespace: str) -> dict[str, dict[str, int]]:
    """GPU resources held on each node by the other non-terminated Pods."""
    used: dict[str, dict[str, int]] = {}
    for pod in running:
        spec = mapping(pod.get("spec"))
        node = spec.get("nodeName")
        phase = mapping(pod.get("status")).get("phase")
        if not node or phase in ("Succeeded", "Failed") or (_name(pod), _namespace(pod)) == (exclude, namespace):
            continue
        for resource, count in gpu_requests(policy, spec).items():
            per_node = used.setdefault(str(node), {})
            per_node[resource] = per_node.get(resource, 0) + count
    return used


def _matching_step(snapshot: Snapshot, where: Placement, asks: Mapping[str, int],
                   used: Mapping[str, Mapping[str, int]], scheduled: bool,
                   dra: Mapping[str, Mapping[str, int]] | None = None) -> Step:
    """`dra`: resource -> node -> the devices that serve it there through DRA (KEP-5004), for the resources no device
    plugin advertises."""
    dra = dra or {}

    def offers(node: Node, resource: str) -> int:
        return node.offers(resource) or dra.get(resource, {}).get(node.name, 0)

    def offered(node: Node, resource: str) -> str:
        have = node.offers(resource)
        return f"{have} {resource} allocatable" if have or resource not in dra else (
            f"{offers(node, resource)} {resource} through DRA")

    evidence = [f"nodeSelector {where.describe_selector()}; tolerations: "
                + (", ".join(_toleration(t) for t in where.tolerations) or "(none)")]
    fits: list[str] = []
    capable: list[str] = []
    rejected: list[str] = []
    silent: list[str] = []  # candidates that advertise none of what the Pod asks for
    for node in snapshot.nodes:
        why = _why_not(node, where)
        if why:
            rejected.append(f"{node.name}: {why}")
            continue
        if not any(offers(node, r) for r in asks):
            silent.append(node.name)
        free = {r: offers(node, r) - used.get(node.name, {}).get(r, 0) for r in asks}
        evidence.append(f"{node.name}: " + ", ".join(f"{offered(node, r)}, {free[r]} free" for r in sorted(asks)))
        if all(offers(node, r) >= n for r, n in asks.items()):
            capable.append(node.name)
            if all(free[r] >= n for r, n in asks.items()):
                fits.append(node.name)
    evidence += [f"not a candidate: {line}" for line in rejected[:_SHOWN]]
    if len(rejected) > _SHOWN:
        evidence.append(f"... and {len(rejected) - _SHOWN} more node(s) that do not match")
    matching = len(snapshot.nodes) - len(rejected)
    if fits:
        return Step("Matching nodes", "ok", f"{matching} node(s) match; {len(fits)} have enough free GPUs now: "
                    f"{', '.join(fits[:_SHOWN])}", tuple(evidence))
    status: Status = "info" if scheduled else "fail"
    if capable:
        status = "info" if scheduled else "warn"
        return Step("Matching nodes", status, f"{matching} node(s) match and {len(capable)} could hold the Pod, "
                    "but none has enough free GPUs now: it waits until GPUs are released (or the cluster grows)",
                    tuple(evidence))
    if matching and len(silent) == matching:
        return Step("Matching nodes", status, f"{matching} node(s) match but none advertises "
                    f"{', '.join(sorted(asks))}: the device plugin is not running (or not registered) on "
                    f"{', '.join(silent[:_SHOWN])}; start it there and the Pod schedules (see Device plugin)",
                    tuple(evidence))
    if matching:
        return Step("Matching nodes", status, f"{matching} node(s) match but none offers enough of "
                    f"{', '.join(sorted(asks))}: the Pod can never be scheduled as written", tuple(evidence))
    return Step("Matching nodes", status, "no Ready node matches the Pod's nodeSelector, affinity and tolerations",
                tuple(evidence))


def _toleration(tol: Mapping[str, Any]) -> str:
    key = tol.get("key") or "*"
    value = f"={tol['value']}" if tol.get("value") else ""
    return f"{key}{value}:{tol.get('effect') or '*'}"


def _why_not(node: Node, where: Placement) -> str:
    if not node.ready:
        return "not Ready"
    mismatches = inventory.selector_mismatches(node, where.node_selector)
    if mismatches:
        return "nodeSelector " + ", ".join(mismatches)
    if not inventory.affinity_matches(node, where.node_affinity):
        return "node affinity does not match"
    taints = inventory.untolerated(node, where.tolerations, transient=True)
    if taints:
        return "untolerated taint " + ", ".join(map(str, taints))
    if node.unschedulable:
        return "cordoned (unschedulable)"
    return ""


def _landing_step(pod: Json, clues: Clues, waits: bool = False) -> Step:
    """Where the Pod is and what its node said. An unscheduled Pod fails here; with `waits` (Matching nodes found
    nodes that could hold it, their GPUs in use) the summary says it is queued for a GPU."""
    spec, status = mapping(pod.get("spec")), mapping(pod.get("status"))
    phase = str(status.get("phase") or "Unknown")
    node = spec.get("nodeName")
    if node:
        told = _node_texts(status)
        explained = [(found, text) for text in told if (found := explain(text, clues)) is not None]
        if explained:
            (level, meaning), _ = explained[0]
            return Step("Placement", level, f"the Pod is on node {node} (phase {phase}), and {meaning}",
                        tuple(text for _, text in explained))
        if phase == "Failed":
            return Step("Placement", "fail", f"the Pod is on node {node} and Failed", tuple(told))
        return Step("Placement", "ok" if phase in ("Running", "Succeeded") else "info",
                    f"the Pod is on node {node} (phase {phase})", tuple(told))
    conditions = [mapping(c) for c in status.get("conditions") or []]
    scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
    message = str(scheduled.get("message") or "")
    evidence = (f"PodScheduled={scheduled.get('status')} {scheduled.get('reason') or ''}: {message}".strip(),) \
        if scheduled else ()
    if waits:
        return Step("Placement", "fail", f"the Pod is not scheduled (phase {phase}): the nodes it can land on have "
                    "no GPU free now, and the scheduler places it when one is released; free one (or add nodes) "
                    "if it cannot wait (see Matching nodes)", evidence)
    return Step("Placement", "fail", f"the Pod is not scheduled (phase {phase})", evidence)


def _node_texts(status: Json) -> list[str]:
    """What the kubelet and the runtime said on the node: the Pod's reason and message, and each container's
    waiting or terminated reason and message (`reason: message`)."""
    texts: list[str] = []
    if status.get("reason") or status.get("message"):
        texts.append(f"{status.get('reason') or ''}: {status.get('message') or ''}".strip(": "))
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            container = mapping(container)
            for part in ("state", "lastState"):
                for phase in ("waiting", "terminated"):
                    said = mapping(mapping(container.get(part)).get(phase))
                    if said.get("message"):
                        texts.append(f"container {container.get('name')}: {said.get('reason') or phase}: "
                                     f"{said.get('message')}")
    return texts


def _events_step(facts: Facts, clues: Clues) -> Step:
    warnings = [e for e in _own_events(facts) if e.get("type") == "Warning"]
    evidence: list[str] = []
    status: Status = "ok"
    meanings: list[tuple[Status, str]] = []
    for event in sorted(warnings, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")):
        involved = mapping(event.get("involvedObject"))
        reason, message = str(event.get("reason") or ""), str(event.get("message") or "")
        count = f" (x{event['count']})" if isinstance(event.get("count"), int) and event["count"] > 1 else ""
        evidence.append(f"{involved.get('kind')}/{involved.get('name')} {reason}{count}: {message}")
        found = explain(f"{reason}: {message}", clues)
        if found is not None:
            meanings.append(found)
        if "Insufficient" in message or reason in ("FailedCreate", "UnexpectedAdmissionError", "FailedScheduling"):
            status = "warn"
    if not warnings:
        return Step("Events", "ok", "no warning events for the Pod or its owners")
    if meanings:
        worst = min(meanings, key=lambda m: SEVERITY.index(m[0]))
        return Step("Events", worst[0] if worst[0] != "info" else status, worst[1], tuple(evidence))
    return Step("Events", status, f"{len(warnings)} warning event(s): "
                f"{', '.join(sorted({str(e.get('reason') or '') for e in warnings}))}", tuple(evidence))


def _own_events(facts: Facts) -> list[Json]:
    """The events of this Pod and its owners: an event names its object by uid (`involvedObject.uid`); the events
    of an earlier Pod of the same name, which the API server keeps, are not this Pod's. An event without a uid
    is kept."""
    uids = {str(mapping(o.get("metadata")).get("uid") or "") for o in (facts.pod, *facts.owners)} - {""}
    return [e for e in facts.events
            if not uids or not mapping(e.get("involvedObject")).get("uid")
            or str(mapping(e.get("involvedObject")).get("uid")) in uids]


def _devices_step(policy: Policy, snapshot: Snapshot, pod: Json) -> Step:
    """DRA: whether the devices of the Pod's GPU claims exist on some node (webhook.policy.dra_fit), unless the
    claims are allocated already (then the scheduler has placed them)."""
    spec = mapping(pod.get("spec"))
    statuses = mapping(pod.get("status")).get("resourceClaimStatuses")
    names = {str(s.get("name")): s.get("resourceClaimName") for s in map(mapping, statuses or ())}  # generated
    names |= {str(c.get("name")): c.get("resourceClaimName") for c in map(mapping, spec.get("resourceClaims") or ())
              if c.get("resourceClaimName")}  # by name
    problems: list[str] = []
    evidence: list[str] = []
    for name, claim in inventory.gpu_claim_templates(policy, snapshot, _namespace(pod), spec):
        made = names.get(name)
        allocated = snapshot.dra.claim(_namespace(pod), str(made)) if made else None
        if allocated is not None and allocated.allocated:
            evidence.append(f"claim {name} ({made}) is allocated: {allocated.devices} device(s)")
            continue
        found, said = dra_fit.explain(claim, claim.gpu_asks(policy), snapshot.dra)
        problems += found
        evidence += said
    if problems:
        return Step("DRA devices", "fail", problems[0], tuple(evidence + problems[1:]))
    if not snapshot.dra.devices_known:
        return Step("DRA devices", "info", "the devices were not read: the claims' selectors were not checked",
                    tuple(evidence))
    return Step("DRA devices", "ok", "some node has the devices each GPU claim asks for", tuple(evidence))


def _runtime_class_step(snapshot: Snapshot, spec: Json, gpu: bool) -> Step:
    name = spec.get("runtimeClassName")
    if not name:
        detail = ("no runtimeClassName: the node's default runtime must expose GPUs (CDI, or the NVIDIA runtime "
                  "as default)") if gpu else "no runtimeClassName"
        return Step("RuntimeClass", "info", detail)
    found = snapshot.runtime_classes.get(str(name))
    if found is None:
        return Step("RuntimeClass", "fail",
                    f'RuntimeClass "{name}" not found: new Pods naming it are rejected; create it (the GPU '
                    "Operator installs it) or remove runtimeClassName from the Pod's template",
                    (f"RuntimeClasses: {', '.join(sorted(snapshot.runtime_classes)) or '(none)'}",))
    scheduling = ", ".join(f"{k}={v}" for k, v in sorted(found.node_selector.items()))
    evidence = (f"handler {found.handler}" + (f"; scheduling.nodeSelector {scheduling}" if scheduling else ""),)
    return Step("RuntimeClass", "ok", f"RuntimeClass {name} exists", evidence)


def _webhook_step(policy: Policy, facts: Facts) -> Step:
    outcome = checking.decide(policy, for_review(facts.pod), _namespace(facts.pod), inventory=facts.snapshot)
    verdict = outcome.verdict
    evidence = tuple(f"{f.enforcement}: {f.render()}" for f in (*verdict.violations, *verdict.warnings))
    evidence += tuple(verdict.notes)
    where = f" (class {verdict.gpu_class})" if verdict.gpu_class else ""
    if not verdict.allowed:
        return Step("This webhook", "fail", f"would deny this Pod if it were created now{where}", evidence)
    if verdict.warnings:
        return Step("This webhook", "warn", f"would allow this Pod with warnings{where}", evidence)
    return Step("This webhook", "ok", f"would allow this Pod{where}", evidence)


def for_review(obj: Json) -> dict[str, Any]:
    """A stored object as it would be submitted again: without status, and a Pod without the node the
    scheduler bound it to (so a running Pod is not mistaken for one that bypasses the scheduler)."""
    copy = {k: v for k, v in obj.items() if k != "status"}
    if obj.get("kind") == "Pod" and isinstance(obj.get("spec"), dict):
        copy["spec"] = {k: v for k, v in obj["spec"].items() if k != "nodeName"}
    return copy
