"""DRA ResourceClaims and ResourceClaimTemplates: what they ask of GPU DeviceClasses, judged and placed.

A claim's device requests (`spec.devices.requests[]`; a template's at `spec.spec.devices.requests[]`) each
ask in one of two forms: `exactly` (resource.k8s.io/v1 and v1beta2), or `firstAvailable[]`, alternatives of
which the scheduler takes the first it can satisfy, so each subrequest is judged. v1beta1 keeps the `exactly`
fields on the request itself. Objects come from users and may hold any JSON type in any field: a field of the
wrong type is ignored here (the API server refuses the object, naming it), never a crash.

The checks (rule ids in `webhook.policy.rules.RULES`), for each request or subrequest of a GPU DeviceClass
(`Policy.dra`): the namespace may use the class (`dra-class-not-allowed`); `allocationMode: All` only where
allowed (`dra-allocation-all`); `adminAccess: true` only in the admin-access namespaces (`dra-admin-access`);
its count, and the claim's total, within the class's `maxGPUsPerPod`, the DeviceClass's and the namespace's
`maxDevices` (`dra-claim-max`); an own selector that is another class value's, never its own class's
(`dra-selector-conflict`). Placement: a request of a class whose chosen value has a `deviceSelectors` entry for
its DeviceClass, and no selector of its own, gets that selector appended (mutating endpoint, CREATE only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.policy.dra_rules import IMPLICIT_PREFIX
from webhook.policy.findings import Edit
from webhook.policy.pods import ContainerRef, Path, effective_count, mapping, render_path
from webhook.policy.rules import Policy

GROUP = "resource.k8s.io"
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
# A claim the resource-claim controller made from a Pod's template, and one kube-scheduler made for a Pod's
# extended resources (KEP-5004): the template (or the Pod) was judged; the copy is never refused or changed.
GENERATED_ANNOTATIONS = ("resource.kubernetes.io/pod-claim-name", "resource.kubernetes.io/extended-resource-claim")
EXTENDED_PREFIX = IMPLICIT_PREFIX  # the implicit extended resource of a DeviceClass
_SHOWN = 80  # at most this many characters of a name or expression the author wrote, in a message


def shown(value: Any) -> str:
    """What the author wrote, quoted and escaped (JSON string syntax), cut to a readable length."""
    text = value if isinstance(value, str) else json.dumps(value)
    quoted = json.dumps(text[:_SHOWN])
    return quoted if len(text) <= _SHOWN else quoted[:-1] + '..."'


@dataclass(frozen=True)
class DeviceAsk:
    """One `exactly` request, or one subrequest of `firstAvailable`: what it asks of one DeviceClass.

    `count` is None for `allocationMode: All` (every matching device of a node) and when the count is not an
    integer (the API server refuses that). `path` is where its fields are (`selectors` is added there)."""

    label: str  # `request "gpu"`, `request "gpu", subrequest "h100"`
    path: Path
    device_class: str
    count: int | None
    all_devices: bool
    admin_access: bool
    selectors: tuple[str, ...]  # the CEL expressions given (strings only)
    has_selectors: bool  # `selectors` holds anything but an empty list: the author's, never added to

    def where(self) -> str:
        return f"{self.label} ({render_path(self.path)})"


@dataclass(frozen=True)
class Request:
    """One entry of `devices.requests[]`: its name and the asks it makes (one, or one per alternative)."""

    name: str
    asks: tuple[DeviceAsk, ...]
    alternatives: bool  # firstAvailable: the scheduler takes one of the asks


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim or ResourceClaimTemplate, as much of it as the policy reads."""

    kind: str
    name: str
    requests: tuple[Request, ...]
    labels: Mapping[str, str]
    generated: bool = False

    def describe(self) -> str:
        return f"{self.kind} {shown(self.name)}"

    def gpu_asks(self, policy: Policy) -> list[DeviceAsk]:
        return [a for r in self.requests for a in r.asks if policy.dra.is_gpu_class(a.device_class)]

    def gpu_devices(self, policy: Policy) -> int:
        """The most GPU devices the claim can be allocated: per request its largest GPU alternative, summed (an
        `All` request, or a count that is not a number, adds nothing: it is judged by its own rule)."""
        total = 0
        for request in self.requests:
            counts = [a.count for a in request.asks if policy.dra.is_gpu_class(a.device_class) and a.count]
            total += max(counts, default=0)
        return total


def is_claim(obj: Mapping[str, Any]) -> bool:
    api_version = obj.get("apiVersion")
    return (obj.get("kind") in CLAIM_KINDS and isinstance(api_version, str)
            and api_version.startswith(GROUP + "/"))


def parse(obj: Mapping[str, Any]) -> Claim:
    """The claim or template in `obj` (`is_claim(obj)`), whatever types its fields hold."""
    kind = str(obj.get("kind"))
    metadata = mapping(obj.get("metadata"))
    spec_path: Path = ("spec", "spec") if kind == "ResourceClaimTemplate" else ("spec",)
    spec = mapping(obj.get("spec"))
    labels = _labels(metadata.get("labels"))
    if kind == "ResourceClaimTemplate":
        spec = mapping(spec.get("spec"))
        labels = {**_labels(mapping(mapping(obj.get("spec")).get("metadata")).get("labels")), **labels}
    devices_path: Path = (*spec_path, "devices", "requests")
    requests = []
    raw_requests = mapping(spec.get("devices")).get("requests")
    for index, raw in enumerate(raw_requests if isinstance(raw_requests, list) else ()):
        request = _request(mapping(raw), (*devices_path, index))
        if request is not None:
            requests.append(request)
    annotations = mapping(metadata.get("annotations"))
    name = metadata.get("name") or metadata.get("generateName") or "?"
    return Claim(kind, str(name), tuple(requests), labels, any(a in annotations for a in GENERATED_ANNOTATIONS))


def _labels(value: Any) -> dict[str, str]:
    return {k: v for k, v in mapping(value).items() if isinstance(k, str) and isinstance(v, str)}


def _request(raw: Mapping[str, Any], path: Path) -> Request | None:
    given = raw.get("name")
    name = given if isinstance(given, str) else "?"
    label = f"request {shown(name)}"
    exactly = raw.get("exactly")
    if isinstance(exactly, dict):
        ask = _ask(exactly, (*path, "exactly"), label)
        return Request(name, (ask,) if ask else (), False)
    alternatives = raw.get("firstAvailable")
    if isinstance(alternatives, list) and alternatives:
        asks = []
        for index, sub in enumerate(alternatives):
            sub = mapping(sub)
            sub_given = sub.get("name")
            sub_name = sub_given if isinstance(sub_given, str) else str(index)
            ask = _ask(sub, (*path, "firstAvailable", index), f"{label}, subrequest {shown(sub_name)}")
            if ask:
                asks.append(ask)
        return Request(name, tuple(asks), True)
    ask = _ask(raw, path, label)  # v1beta1: the exact request's fields on the request itself
    return Request(name, (ask,), False) if ask else None


def _ask(raw: Mapping[str, Any], path: Path, label: str) -> DeviceAsk | None:
    device_class = raw.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class:
        return None
    all_devices = raw.get("allocationMode") == "All"
    count = raw.get("count", 1)
    number = count if isinstance(count, int) and not isinstance(count, bool) else None
    selectors = raw.get("selectors")
    listed = selectors if isinstance(selectors, list) else []
    expressions = tuple(e for s in listed if isinstance(e := mapping(mapping(s).get("cel")).get("expression"), str))
    # Any value but an absent or empty list is the author's (even one the API server will refuse): never added to.
    written = "selectors" in raw and selectors != []
    return DeviceAsk(label, path, device_class, None if all_devices else number, all_devices,
                     raw.get("adminAccess") is True, expressions, written)


@dataclass(frozen=True)
class ClaimClass:
    """What the engine chose for a claim: the class's name, its GPU maximum (and who set it), and per GPU
    DeviceClass the selectors its values mean ((source, CEL) pairs); `others`: the selectors of values not
    chosen, per DeviceClass, to spot a claim that names another value's."""

    name: str
    cap: tuple[int, str] | None
    selectors: Mapping[str, tuple[tuple[str, str], ...]]
    others: Mapping[str, Mapping[str, str]]  # DeviceClass -> CEL -> `gpu-type h100`


def limits(policy: Policy, namespace: str, ns_dra_max: int | None, device_class: str,
           chosen: ClaimClass | None) -> list[tuple[int, str]]:
    """Every maximum that holds for devices of `device_class`: (most, set by whom)."""
    found: list[tuple[int, str]] = []
    rule = policy.dra.device_classes.get(device_class)
    if rule is not None and rule.max_devices is not None:
        found.append((rule.max_devices, f"dra.deviceClasses.{device_class}.maxDevices"))
    if ns_dra_max is not None:
        found.append((ns_dra_max, f"namespace {namespace} dra.maxDevices"))
    if chosen is not None and chosen.cap is not None and (not device_class or policy.dra.is_classed(device_class)):
        found.append((chosen.cap[0], f"class {chosen.name} maxGPUsPerPod ({chosen.cap[1]})"))
    return found


def check(policy: Policy, claim: Claim, namespace: str, allowed_classes: Sequence[str] | None, ns_max: int | None,
          ns_allow_all: bool, chosen: ClaimClass | None) -> list[tuple[str, str]]:
    """(rule, message) for every problem of the claim's GPU requests."""
    found: list[tuple[str, str]] = []
    what = claim.describe()
    admin_ok = namespace in policy.dra.admin_access_namespaces
    for ask in claim.gpu_asks(policy):
        device_class = ask.device_class
        rule = policy.dra.device_classes[device_class]
        if allowed_classes is not None and device_class not in allowed_classes:
            found.append(("dra-class-not-allowed",
                          f"{what}: {ask.where()} asks for DeviceClass {device_class}, which namespace {namespace} "
                          f"may not use; use one of: {', '.join(allowed_classes) or '(none)'}"))
        if ask.all_devices and not (rule.allow_all or ns_allow_all):
            found.append(("dra-allocation-all",
                          f"{what}: {ask.where()} sets allocationMode: All on GPU DeviceClass {device_class}, which "
                          f"takes every matching GPU of a node; set allocationMode: ExactCount with a count (or allow "
                          f"it with dra.deviceClasses.{device_class}.allowAllocationModeAll, or the namespace's "
                          "dra.allowAllocationModeAll)"))
        if ask.admin_access and not admin_ok:
            found.append(("dra-admin-access",
                          f"{what}: {ask.where()} sets adminAccess: true on GPU DeviceClass {device_class}: access "
                          f"to GPUs other workloads are using, not allowed in namespace {namespace}; remove "
                          "adminAccess (monitoring tools belong in a namespace listed in dra.adminAccessNamespaces)"))
        over = [(most, source) for most, source in limits(policy, namespace, ns_max, device_class, chosen)
                if ask.count is not None and ask.count > most]
        if over:
            most, source = min(over)  # the tightest limit: its fix satisfies every one
            found.append(("dra-claim-max",
                          f"{what}: {ask.where()} asks for {ask.count} {device_class} devices but at most "
                          f"{most} are allowed (set by {source}); set count to {most} or fewer"))
        other = (chosen.others.get(device_class, {}) if chosen else {})
        for expression in ask.selectors:
            if expression in other and chosen is not None:
                own = chosen.selectors.get(device_class)
                fix = (f'use the selector of class {chosen.name} ({shown(own[0][1])}), or remove yours to get it'
                       if own else f"remove it, or set the class labels to {other[expression]}")
                found.append(("dra-selector-conflict",
                              f"{what}: {ask.where()} selects the devices of {other[expression]} ({shown(expression)}) "
                              f"but the claim's class is {chosen.name}; {fix}"))
    found.extend(_check_total(policy, claim, namespace, ns_max, chosen))
    return found


def _check_total(policy: Policy, claim: Claim, namespace: str, ns_max: int | None,
                 chosen: ClaimClass | None) -> list[tuple[str, str]]:
    """The claim's GPU devices over all its requests, against the maxima that hold for every GPU class."""
    if sum(1 for r in claim.requests if any(policy.dra.is_gpu_class(a.device_class) for a in r.asks)) < 2:
        return []  # one request: judged above
    total = claim.gpu_devices(policy)
    single = max((a.count or 0 for a in claim.gpu_asks(policy)), default=0)
    over = [(most, source) for most, source in _common_limits(policy, claim, namespace, ns_max, chosen)
            if total > most >= single]  # a request over a limit on its own is reported as that request
    if not over:
        return []
    most, source = min(over)
    return [("dra-claim-max",
             f"{claim.describe()}: its GPU requests ({', '.join(shown(r.name) for r in claim.requests)}) ask for up "
             f"to {total} devices together but at most {most} are allowed (set by {source}); ask for fewer, or split "
             "the work")]


def _common_limits(policy: Policy, claim: Claim, namespace: str, ns_max: int | None,
                   chosen: ClaimClass | None) -> list[tuple[int, str]]:
    """The namespace's and the class's maxima (they hold for GPU devices of any class), and a DeviceClass's own
    when every GPU request is of that one class."""
    classes = {a.device_class for a in claim.gpu_asks(policy)}
    only = next(iter(classes)) if len(classes) == 1 else ""
    return limits(policy, namespace, ns_max, only, chosen)


def placement_edits(policy: Policy, claim: Claim, chosen: ClaimClass) -> list[Edit]:
    """The class's selectors for each GPU request or subrequest that has none of its own."""
    edits = []
    for ask in claim.gpu_asks(policy):
        if ask.has_selectors:
            continue  # never over what the author wrote
        for _, expression in chosen.selectors.get(ask.device_class, ()):
            edits.append(Edit("append", (*ask.path, "selectors"), None, {"cel": {"expression": expression}}))
    return edits


# --------------------------------------------------------------------------------------------- Pods


def pod_devices(policy: Policy, templates: Sequence[Claim]) -> int:
    """GPU devices a Pod's claims (the templates it names) ask for together."""
    return sum(t.gpu_devices(policy) for t in templates)


@dataclass(frozen=True)
class ExtendedAsk:
    """A container resource that kube-scheduler serves from DRA devices of a GPU DeviceClass (KEP-5004: the class's
    implicit name, or its `extendedResourceName`), counted over the Pod as the scheduler counts it."""

    name: str
    device_class: str
    count: int
    where: str  # the first container asking for it
    implicit: bool  # `deviceclass.resource.kubernetes.io/<class>`: never a device plugin's

    def describe(self) -> str:
        return f"{self.name}: {self.count} ({self.where})"


def extended_asks(policy: Policy, per_resource: Mapping[str, Sequence[tuple[ContainerRef, int]]]) -> list[ExtendedAsk]:
    """The Pod's resources that DRA devices of a GPU DeviceClass serve, each with its effective count (> 0)."""
    found = []
    for name, counts in per_resource.items():
        resource = policy.gpu_resource(name)
        if resource is None or resource.device_class is None:
            continue
        count = effective_count(list(counts))
        if count == 0:
            continue
        where = next(cref.where() for cref, n in counts if n > 0)
        found.append(ExtendedAsk(name, resource.device_class, count, where, resource.implicit))
    return found


def check_extended(asks: Sequence[ExtendedAsk], namespace: str,
                   allowed_classes: Sequence[str] | None) -> list[tuple[str, str]]:
    """dra-class-not-allowed for a DRA-served resource of a DeviceClass the namespace may not use."""
    if allowed_classes is None:
        return []
    allowed = ", ".join(IMPLICIT_PREFIX + c for c in allowed_classes) or "(none)"
    return [("dra-class-not-allowed",
             f"{ask.where}: asks for {ask.name}: {ask.count}, which kube-scheduler serves from devices of "
             f"DeviceClass {ask.device_class} (KEP-5004), and namespace {namespace} may not use that class; ask "
             f"for GPUs of a class it may use: {allowed}")
            for ask in asks if ask.device_class not in allowed_classes]


def check_pod_total(policy: Policy, spec_where: str, namespace: str, ns_max: int | None, chosen: ClaimClass,
                    templates: Sequence[tuple[str, Claim]], asks: Sequence[ExtendedAsk],
                    gpus: int) -> list[tuple[str, str]]:
    """dra-pod-max: the GPU devices of the Pod's claim templates and of its DRA-served resources together, within
    the class's, the DeviceClass's (when they are all of one) and the namespace's maxima. The class maximum
    is left to gpu-class-max when the Pod's GPU resources alone exceed it (`gpus`)."""
    total = pod_devices(policy, [t for _, t in templates]) + sum(a.count for a in asks)
    classes = {a.device_class for _, t in templates for a in t.gpu_asks(policy)} | {a.device_class for a in asks}
    only = next(iter(classes)) if len(classes) == 1 else ""
    told = chosen.cap is not None and gpus > chosen.cap[0]
    over = [(most, source) for most, source in limits(policy, namespace, ns_max, only, chosen)
            if total > most and not (told and source.startswith(f"class {chosen.name} "))]
    if not over:
        return []
    most, source = min(over)
    if not asks:
        names = ", ".join(shown(name) for name, _ in templates)
        return [("dra-pod-max",
                 f"{spec_where}.resourceClaims ({names}) ask for up to {total} GPU devices together but at most "
                 f"{most} are allowed (set by {source}); use fewer claims, or ask for fewer devices in their "
                 "templates and ResourceClaims")]
    parts = [f"claim {shown(name)} ({t.describe()})" for name, t in templates]
    parts += [a.describe() for a in asks]
    return [("dra-pod-max",
             f"{spec_where} asks for {total} GPU devices through DRA ({'; '.join(parts)}) but at most {most} are "
             f"allowed (set by {source}); ask for fewer")]


