"""The policy engine: one decision path for the admission server, `check`, `test` and `audit`.

`evaluate(policy, object, context)` returns a `Verdict`: violations (denials), warnings and edits. It reads
nothing but its arguments. The checks, in the order a person would fix them:

1. per container: GPU quantities parse, are whole and non-negative, are set in limits, and requests equal
   limits (the API server's own rules, said earlier and with a fix); per-container maxima;
2. no GPUs in pod-level `spec.resources`;
3. the Pod's class, one value per axis, chosen in this order: the Pod's class label; what its own
   nodeSelector and required node affinity select (`webhook.policy.selection`, through the rules' aliases); what
   its GPU resources exist on (`validFor`); the default another chosen value sets; the namespace default;
   the cluster default. A value the Pod's own selection excludes is never chosen: the axis is then left
   out, with a warning when the Pod names a GPU no value covers. The class must exist, the namespace may
   use it, the effective GPU count fits it, and what the developer wrote agrees with it;
4. GPU access the scheduler does not see (GPU env, runtime class or taint toleration without a request);
5. with cluster awareness (`Context.inventory`): defaults no live GPU node satisfies are held back, then
   the class is checked against the nodes (`webhook.policy.inventory`: capacity, runtime class, time-sliced GPUs);
6. then, for GPU Pods on CREATE: the class's nodeSelector, tolerations and other fields as edits (the
   mutating endpoint), or, at the validating endpoint, a violation when they are missing.

This module holds the path itself and the live-cluster checks; its parts are in modules of their own:
`webhook.policy.chosen` (the context, the collector, the chosen class), `webhook.policy.class_choice` (step 3),
`webhook.policy.class_edits` (step 6) and `webhook.policy.claim_review` (ResourceClaims, ResourceClaimTemplates and
a Pod's DRA side).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.policy import checks, claims, inventory, pods
from webhook.policy.chosen import ChosenClass, Collector, Context, Pick
from webhook.policy.claim_review import check_pod_claims, evaluate_claim
from webhook.policy.class_choice import check_class_fit, choose_class
from webhook.policy.class_edits import CLASS_ANNOTATION, RULES_ANNOTATION, ClassChanges, class_changes, require_class
from webhook.policy.findings import Edit, Mode, Verdict
from webhook.policy.inventory import Snapshot
from webhook.policy.pods import ContainerRef, PodSpecRef
from webhook.policy.rules import Expression, Policy

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

__all__ = ["CLASS_ANNOTATION", "RULES_ANNOTATION", "Context", "evaluate"]


def evaluate(policy: Policy, obj: Mapping[str, Any] | None, ctx: Context) -> Verdict:
    """Decide on one object (a Pod, a workload with a pod template, or anything else: allowed untouched)."""
    if not isinstance(obj, dict) or ctx.operation in ("DELETE", "CONNECT"):
        return Verdict()
    namespace = ctx.namespace or pods.string(pods.mapping(obj.get("metadata")).get("namespace")) or "default"
    if namespace in policy.exempt_namespaces:
        return Verdict(notes=(f"namespace {namespace} is exempt",))
    kind = obj.get("kind")
    if claims.is_claim(obj):
        return evaluate_claim(policy, obj, namespace, ctx)
    if kind == "Pod" and ctx.operation == "UPDATE":
        return Verdict(notes=("Pod updates cannot change placement or resources; not judged",))
    specs = pods.pod_specs(obj)
    if ctx.operation == "UPDATE" and ctx.old_object is not None and _templates_unchanged(specs, ctx.old_object):
        return Verdict(notes=("pod template unchanged by this update; not judged",))
    collector = Collector(policy)
    gpu_class: str | None = None
    total = 0
    for ref in specs:
        result = _evaluate_spec(policy, obj, ref, namespace, ctx, collector)
        if result is not None:
            gpu_class = result[0] or gpu_class
            total += result[1]
    classes = tuple(collector.classes)
    if not collector.findings:  # the usual case: nothing to sort
        return Verdict(edits=tuple(collector.edits), gpu_class=gpu_class, gpus=total, classes=classes,
                       patch=collector.patch)
    violations = tuple(f for f in collector.findings if f.enforcement == "deny")
    warnings = tuple(f for f in collector.findings if f.enforcement == "warn")
    if violations:
        return Verdict(violations=violations, warnings=warnings, gpu_class=gpu_class, gpus=total, classes=classes)
    return Verdict(warnings=warnings, edits=tuple(collector.edits), gpu_class=gpu_class, gpus=total, classes=classes,
                   patch=collector.patch)


def _placed_by_classes(policy: Policy, name: str) -> bool:
    resource = policy.gpu_resource(name)
    return resource is not None and resource.classes


def _templates_unchanged(specs: Sequence[PodSpecRef], old: Mapping[str, Any]) -> bool:
    return bool(specs) and all(
        pods.get(old, ref.spec_path) == ref.spec and (pods.get(old, ref.metadata_path) or {}) == ref.metadata
        for ref in specs
    )


def _evaluate_spec(policy: Policy, obj: Mapping[str, Any], ref: PodSpecRef, namespace: str, ctx: Context,
                   out: Collector) -> tuple[str | None, int] | None:
    """Check one pod spec; returns (class name or None, GPU count) for a GPU pod spec, None otherwise.

    A spec whose GPU quantities are wrong is still a GPU spec: its class is judged too, so that every
    independent problem is reported in one answer."""
    before = len(out.findings)
    containers = pods.containers(ref)  # made once: a spec without GPUs reads them twice
    per_resource = checks.check_containers(policy, ref, out, containers)
    checks.check_pod_level(policy, ref, out)
    flawed = len(out.findings) > before  # some GPU quantity is wrong: the spec asks for GPUs all the same
    gpus = 0
    placed = False  # some container asks for a resource that the classes place
    for name, counts in per_resource.items():
        count = pods.effective_count(counts)
        gpus += count
        placed = placed or ((count > 0 or flawed) and _placed_by_classes(policy, name))
    claims = ctx.pod_claims(policy, namespace, ref.spec)
    if gpus == 0 and not claims and not flawed:
        checks.check_unaccounted_access(policy, ref, out, containers)
        return None
    if not claims and not placed:
        return None, gpus
    chosen = choose_class(policy, ref, namespace, ctx, per_resource, out)
    if chosen is None:
        return None, gpus
    check_class_fit(policy, ref, chosen, per_resource, gpus, out)
    if policy.gpu_device_classes:
        check_pod_claims(policy, ref, namespace, ctx, chosen, per_resource, gpus, claims, out)
    if ref.spec_path == ("spec",) and isinstance(ref.spec.get("nodeName"), str) and ref.spec.get("nodeName"):
        out.add("gpu-node-name-preset",
                f"spec.nodeName={ref.spec['nodeName']!r} bypasses the scheduler's GPU accounting; remove it "
                "(the class nodeSelector places the Pod)")
    if MIRROR_ANNOTATION in pods.mapping(pods.mapping(obj.get("metadata")).get("annotations")):
        return chosen.name, gpus  # the kubelet's mirror of a static Pod: immutable, never patched
    changes = class_changes(policy, obj, ref, chosen)  # what the class adds: injected, checked or required below
    keep_runtime = True
    if ctx.inventory is not None:
        chosen, changes, keep_runtime = _check_inventory(policy, obj, ref, chosen, changes, per_resource,
                                                         ctx.inventory, ctx.mode, out)
    out.classes.append(chosen)
    if ctx.mode == "mutate":
        if (not ref.is_template or policy.mutate_templates) and obj.get("kind") in pods.KNOWN_KINDS:
            # The memoised patch is the object's only while these edits are all of its edits.
            out.patch = changes.patch if keep_runtime and not out.edits else None
            out.edits.extend(changes.edits if keep_runtime else
                             [e for e in changes.edits if not _is_runtime_edit(ref, e)])
    elif not ref.is_template and not any(f.enforcement == "deny" for f in out.findings):
        # Only once the Pod is otherwise fine: a Pod denied for its quantities is fixed first.
        require_class(ref, chosen, changes.edits, out)
    return chosen.name, gpus


def _check_inventory(policy: Policy, obj: Mapping[str, Any], ref: PodSpecRef, chosen: ChosenClass,
                     changes: ClassChanges, per_resource: Mapping[str, list[tuple[ContainerRef, int]]],
                     snapshot: Snapshot, mode: Mode, out: Collector) -> tuple[ChosenClass, ClassChanges, bool]:
    """The live-cluster checks of a GPU pod spec with its class `changes` (webhook.policy.inventory): the class
    with the axes whose nodeSelector would leave the Pod no node held back, its changes, and False when
    runtimeClassName must not be injected."""
    if not snapshot.synced:
        out.add("gpu-inventory-unavailable",
                f"the cluster inventory is not synced ({snapshot.reason or 'starting'}): the checks against GPU "
                "nodes and runtime classes were skipped; nothing to change in the Pod")
        return chosen, changes, True
    placed = {name: pods.effective_count(counts) for name, counts in per_resource.items()
              if _placed_by_classes(policy, name)}
    # The names DRA may serve (a GPU DeviceClass's implicit or mapped name) count for the capacity checks only,
    # which read the DRA devices too; the device plugins' node checks leave them out.
    dra_served = frozenset(name for name in placed if checks.is_dra_served(policy, name))
    requests = {name: count for name, count in placed.items() if name not in dra_served}
    spared = _spare_nodes(ref, chosen, snapshot, [name for name, count in requests.items() if count > 0], out)
    if spared is not chosen:
        chosen, changes = spared, class_changes(policy, obj, ref, spared)
    edits = changes.edits
    judged = edits if mode == "mutate" else [e for e in edits if not _is_runtime_edit(ref, e)]
    result = inventory.assess(snapshot, inventory.placement(ref.spec, ref.spec_path, judged), placed, chosen.name,
                              dra_served)
    for rule, message in result.findings:
        out.add(rule, message)
    _check_shared_gpus(policy, snapshot, result.final, requests, per_resource, out)
    return chosen, changes, result.keep_runtime_class


def _check_shared_gpus(policy: Policy, snapshot: Snapshot, where: inventory.Placement, requests: Mapping[str, int],
                       per_resource: Mapping[str, list[tuple[ContainerRef, int]]], out: Collector) -> None:
    """gpu-time-sliced-max for each container; one already over its resource's `maxPerContainer` is
    `gpu-per-container-max`'s (nvidia.com/gpu.shared in the packaged rules)."""
    for name, count in requests.items():
        resource = policy.gpu_resource(name)
        cap = resource.max_per_container if resource is not None else None
        containers = [(cref.where(), n) for cref, n in per_resource[name] if cap is None or n <= cap]
        for rule, message in inventory.time_sliced_findings(snapshot, where, name, count, containers):
            out.add(rule, message)


def _spare_nodes(ref: PodSpecRef, chosen: ChosenClass, snapshot: Snapshot, resources: Sequence[str],
                 out: Collector) -> ChosenClass:
    """No harm on the live nodes: hold back, axis by axis, a default's nodeSelector that would leave the Pod
    none of the Ready GPU nodes it could use: those its own selection matches, or, for a Pod that chose no
    nodes, every Ready node that advertises its GPU resource (and say so). A value the Pod chose itself is kept
    (a class label that matches no node is `gpu-class-no-node`'s to report), and so is every default some of
    those nodes satisfy. The class, unchanged when nothing is held."""
    written = inventory.placement(ref.spec, ref.spec_path)
    if not inventory.gpu_nodes(snapshot, written, resources, ready=True).count:
        return chosen  # no Ready node advertises the GPU, or the Pod as written matches none: the capacity checks
    plain = not written.node_selector and not written.node_affinity
    selector = dict(written.node_selector)
    expressions: list[Expression] = []
    picks: list[Pick] = []
    held = False
    for pick in chosen.picks:
        value = pick.axis.values[pick.value]
        wanted = {k: v for k, v in value.node_selector.items() if k not in selector}
        if not pick.defaulted or not pick.inject or not (wanted or value.match_expressions):
            picks.append(pick)  # the Pod's own choice is kept: its label
            continue
        affinity = (inventory.with_expressions(written.node_affinity, [*expressions, *value.match_expressions])
                    if value.match_expressions or expressions else written.node_affinity)
        trial = inventory.Placement({**selector, **wanted}, written.tolerations, affinity, written.runtime_class,
                                    written.runtime_class_injected)
        if inventory.gpu_nodes(snapshot, trial, resources, ready=True).count:
            selector.update(wanted)
            expressions.extend(value.match_expressions)
            picks.append(pick)
            continue
        held = True
        picks.append(pick._replace(inject=False))
        matched = list(inventory.hosting_nodes(snapshot, written, resources))  # for the message only
        out.add("gpu-class-skipped", _held_back(pick, wanted, matched, plain))
    return ChosenClass.of(picks, chosen.skipped) if held else chosen


def _held_back(pick: Pick, wanted: Mapping[str, str], matched: Sequence[inventory.Node], plain: bool) -> str:
    """Why a default's nodeSelector was not applied: the value, the GPUs the live nodes have, and the fix."""
    axis = pick.axis
    shown = ", ".join(n.name for n in matched[:3])
    nodes = f"{len(matched)} GPU node{'s' if len(matched) != 1 else ''} ({shown})"
    placing = [*(f"{k}={v}" for k, v in sorted(wanted.items())), *map(str, axis.values[pick.value].match_expressions)]
    wanted_text = ", ".join(placing)
    theirs = [v for v, c in axis.values.items() if (c.node_selector or c.match_expressions) and any(
        inventory.value_selects(n, c.node_selector, c.match_expressions) for n in matched)]
    if not plain:
        fix = (f"label the Pod {axis.label}={' or '.join(theirs)}" if theirs else
               f"label those nodes {wanted_text}")
        return (f"{axis.name} {pick.value} (from the {pick.how}) was not applied: its nodeSelector {wanted_text} "
                f"would leave the Pod no node, while as written it matches {nodes}; {fix}")
    gpus = inventory.describe_products(matched)
    # kubectl shows a warning's first and last words: what was held back first, the fix last.
    head = (f"{axis.name} {pick.value} not applied (from the {pick.how}): no Ready node that advertises the Pod's "
            f"GPU resource has {wanted_text}, so the Pod would stay Pending; it may go to any of the {nodes}, which "
            f"have {gpus}")
    if theirs:
        return head + (f"; or label the Pod {axis.label}={' or '.join(theirs)}; "
                       f"set {_default_field(pick)}: {theirs[0]}")
    product = inventory.product_of(matched[0])
    if inventory.PRODUCT_LABEL in axis.keys and product:
        slug = inventory.product_slug(product)
        return head + (f"; GPU feature discovery's label selects them: spec.classes.axes.{axis.name}.values.{slug}: "
                       f"{{nodeSelector: {{{inventory.PRODUCT_LABEL}: {product}}}}}; add {axis.name} value {slug} to "
                       f"the rules, as the default")
    return head + f"; or change {_default_field(pick)} in the rules; label those nodes {wanted_text}"


def _default_field(pick: Pick) -> str:
    """The rule-file field that set a default `pick` (see `_default`)."""
    axis = pick.axis.name
    if pick.how.startswith("default of "):
        other, value = pick.how.removeprefix("default of ").split(" ", 1)
        return f"spec.classes.axes.{other}.values.{value}.defaults.{axis}"
    if "(namespaceSelectors." in pick.how:
        return f"spec.namespaceSelectors.{pick.how.split('(namespaceSelectors.')[1].rstrip(')')}.defaults.{axis}"
    if pick.how.startswith("namespace "):
        return f"spec.namespaces.{pick.how.split(' ')[1]}.defaults.{axis}"
    return f"spec.classes.axes.{axis}.default"


def _is_runtime_edit(ref: PodSpecRef, edit: Edit) -> bool:
    return edit.path == ref.spec_path and edit.key == "runtimeClassName"
