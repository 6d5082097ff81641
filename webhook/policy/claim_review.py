"""The DRA side of a review (`webhook.policy.claims`, `webhook.policy.dra_fit`): a ResourceClaim or
ResourceClaimTemplate judged and placed by class as a Pod is, and a GPU Pod's claims and DRA-served resources
counted together. Part of `webhook.policy.engine`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.policy import claims, dra_fit
from webhook.policy.chosen import ChosenClass, Collector, Context
from webhook.policy.claims import Claim
from webhook.policy.class_choice import choose_class
from webhook.policy.class_edits import plan_of
from webhook.policy.dra_rules import NamespaceDRA
from webhook.policy.findings import Verdict
from webhook.policy.inventory import Snapshot
from webhook.policy.pods import ContainerRef, PodSpecRef, render_path
from webhook.policy.rules import Policy


def evaluate_claim(policy: Policy, obj: Mapping[str, Any], namespace: str, ctx: Context) -> Verdict:
    """A ResourceClaim or ResourceClaimTemplate (`webhook.policy.claims`): its class is chosen as a Pod's is (its
    labels, then the defaults), its GPU requests judged, and at CREATE the class's selectors added."""
    claim = claims.parse(obj)
    if claim.generated:
        return Verdict(notes=(f"{claim.describe()} was generated for a Pod (its template or the Pod was judged); "
                              "not judged",))
    if ctx.operation == "UPDATE" and ctx.old_object is not None and ctx.old_object.get("spec") == obj.get("spec"):
        return Verdict(notes=("the claim's spec is unchanged by this update; not judged",))
    if not claim.gpu_asks(policy):
        return Verdict()
    out = Collector(policy)
    ref = PodSpecRef(("spec",), ("metadata",), {}, {"labels": claim.labels}, claim.kind == "ResourceClaimTemplate")
    classed = any(policy.dra.is_classed(a.device_class) for a in claim.gpu_asks(policy))
    chosen = choose_class(policy, ref, namespace, ctx, {}, out) if classed else None
    view = _claim_class(policy, chosen) if chosen is not None else None
    ns_dra = _namespace_dra(policy, namespace, ctx)
    for rule, message in claims.check(policy, claim, namespace, ns_dra.device_classes, ns_dra.max_devices,
                                      ns_dra.allow_all, view):
        out.add(rule, message)
    if ctx.inventory is not None and ctx.inventory.synced:
        chosen, view = _fit_devices(policy, claim, chosen, view, ctx.inventory, out)
    if chosen is not None and view is not None:
        out.classes.append(chosen)
        if ctx.mode == "mutate" and ctx.operation == "CREATE":
            out.edits.extend(claims.placement_edits(policy, claim, view))
    violations = tuple(f for f in out.findings if f.enforcement == "deny")
    return Verdict(violations=violations, warnings=tuple(f for f in out.findings if f.enforcement == "warn"),
                   edits=() if violations else tuple(out.edits), gpu_class=chosen.name if chosen else None,
                   gpus=claim.gpu_devices(policy), classes=tuple(out.classes))


def _fit_devices(policy: Policy, claim: claims.Claim, chosen: ChosenClass | None, view: claims.ClaimClass | None,
                 snapshot: Snapshot, out: Collector) -> tuple[ChosenClass | None, claims.ClaimClass | None]:
    """`dra-unsatisfiable` against the live devices (`webhook.policy.dra_fit`), holding back a default whose selector
    would leave a request no device: the class and its view without it."""
    defaulted = frozenset(f"{p.axis.name} {p.value}" for p in chosen.picks if p.defaulted) if chosen else frozenset()
    fit = dra_fit.assess(claim, claim.gpu_asks(policy), snapshot.dra, view.selectors if view else {}, defaulted)
    for rule, message in fit.findings:
        out.add(rule, message)
    if chosen is None or not fit.held:
        return chosen, view
    kept = ChosenClass.of([p._replace(inject=False) if f"{p.axis.name} {p.value}" in fit.held else p
                           for p in chosen.picks], chosen.skipped)
    return kept, _claim_class(policy, kept)


def _namespace_dra(policy: Policy, namespace: str, ctx: Context) -> NamespaceDRA:
    ns_labels = ctx.namespace_labels
    if ns_labels is None and ctx.inventory is not None:
        ns_labels = ctx.inventory.namespace_labels(namespace)
    ns_policy = policy.namespace_policy(namespace, labels=ns_labels)
    return ns_policy.dra if ns_policy is not None else NamespaceDRA()


def _claim_class(policy: Policy, chosen: ChosenClass) -> claims.ClaimClass:
    """The chosen class as `webhook.policy.claims` reads it: its cap, and the selectors of its values and others'."""
    mine: dict[str, list[tuple[str, str]]] = {}
    for source, contribution, placed in chosen.contributions():
        for device_class, expression in contribution.device_selectors.items():
            if placed:  # a default held back (no device would match) adds nothing
                mine.setdefault(device_class, []).append((source, expression))
    picked = {(p.axis.name, p.value) for p in chosen.picks}
    others: dict[str, dict[str, str]] = {}
    for axis in policy.axes:
        for value, contribution in axis.values.items():
            if (axis.name, value) in picked:
                continue
            for device_class, expression in contribution.device_selectors.items():
                if expression not in {e for _, e in mine.get(device_class, ())}:
                    others.setdefault(device_class, {})[expression] = f"{axis.name} {value}"
    return claims.ClaimClass(chosen.name, plan_of(policy, chosen).cap, {k: tuple(v) for k, v in mine.items()}, others)


def check_pod_claims(policy: Policy, ref: PodSpecRef, namespace: str, ctx: Context, chosen: ChosenClass,
                      per_resource: Mapping[str, list[tuple[ContainerRef, int]]], gpus: int,
                      templates: Sequence[tuple[str, Claim]], out: Collector) -> None:
    """A GPU Pod's DRA side: GPUs asked for as extended resources and also through DRA (a claim template of a GPU
    class, known from the inventory, or a class's implicit name: one GPU handed out twice), the DeviceClasses of
    its DRA-served resources (KEP-5004), and its DRA devices together within the maxima (`webhook.policy.claims`).
    `templates` are the Pod's GPU claims (`Context.pod_claims`)."""
    asks = claims.extended_asks(policy, per_resource)
    if not templates and not asks:
        return  # the usual GPU Pod: extended resources a device plugin hands out, and nothing else
    implicit = [a for a in asks if a.implicit]
    plain = gpus - sum(a.count for a in implicit)  # the GPUs a device plugin may hand out
    if plain > 0 and (templates or implicit):
        via = [f"claim {claims.shown(name)} ({t.describe()})" for name, t in templates]
        via += [a.name for a in implicit]
        out.add("dra-double-allocation",
                f"{render_path(ref.spec_path)} asks for GPUs as extended resources ({plain}) and also for GPU devices "
                f"through {', '.join(via)}: the device plugin and the DRA driver may hand out the same GPU, or the "
                "Pod gets more GPUs than meant; ask for GPUs one way only (the claims, or the resource)")
    ns_dra = _namespace_dra(policy, namespace, ctx)
    found = claims.check_extended(asks, namespace, ns_dra.device_classes)
    found += claims.check_pod_total(policy, render_path(ref.spec_path), namespace, ns_dra.max_devices,
                                    _claim_class(policy, chosen), templates, asks, gpus)
    for rule, message in found:
        out.add(rule, message)
