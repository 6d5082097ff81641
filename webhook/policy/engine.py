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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, NamedTuple

from webhook.policy import checks, claims, dra_fit, inventory, pods, selection
from webhook.policy.claims import Claim
from webhook.policy.dra_rules import NamespaceDRA
from webhook.policy.findings import Edit, Finding, Mode, Operation, Verdict
from webhook.policy.inventory import Snapshot
from webhook.policy.pods import ContainerRef, PodSpecRef, render_path
from webhook.policy.resources import is_glob, offered
from webhook.policy.rules import (
    ANNOTATION_PREFIX,
    Axis,
    Contribution,
    Expression,
    NamespacePolicy,
    Policy,
)
from webhook.policy.selection import NO_SELECTION, Term

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
CLASS_ANNOTATION = ANNOTATION_PREFIX + "class"
RULES_ANNOTATION = ANNOTATION_PREFIX + "rules"
DEFAULT_SCHEDULER = "default-scheduler"


class Context(NamedTuple):
    """Where an object is being admitted: the authoritative namespace, the operation, and which endpoint asks.

    `old_object` is the stored object on UPDATE: a workload whose pod template did not change is not
    re-judged, so scaling or relabelling an existing Deployment is never blocked by a newer rule.
    `namespace_labels` are the namespace's labels when the cluster is known (for `namespaceSelectors`).
    `inventory` is the live cluster (nodes, runtime classes, namespaces, claim templates) when the server
    watches it: GPU pod specs are then also checked against it. None (no cluster access): those checks are off.
    `claims` holds claim templates and ResourceClaims known without a cluster (the files `check` was given): with no
    `inventory`, a Pod's claims are read from it, and nothing else is.
    """

    namespace: str | None
    operation: Operation = "CREATE"
    mode: Mode = "mutate"
    old_object: Mapping[str, Any] | None = None
    namespace_labels: Mapping[str, str] | None = None
    inventory: Snapshot | None = None
    claims: Snapshot | None = None

    def pod_claims(self, policy: Policy, namespace: str, spec: Mapping[str, Any]) -> list[tuple[str, Claim]]:
        """A Pod's claims of GPU devices (`inventory.gpu_claim_templates`), from the cluster, then the given files."""
        if self.inventory is None and self.claims is None:
            return []  # the admission server without cluster awareness
        found: dict[str, Claim] = {}
        for source in (self.inventory, self.claims):
            if source is not None:
                for name, claim in inventory.gpu_claim_templates(policy, source, namespace, spec):
                    found.setdefault(name, claim)
        return list(found.items())


@dataclass
class _Collector:
    """Findings, edits and the classes chosen, gathered while one object is evaluated."""

    policy: Policy
    findings: list[Finding] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    classes: list[ChosenClass] = field(default_factory=list)

    def add(self, rule: str, message: str) -> None:
        level = self.policy.enforcement_of(rule)
        if level != "off":
            self.findings.append(Finding(rule, message, level))


class Pick(NamedTuple):
    """One axis's value, how it was chosen, and whether its nodeSelector is injected: not when the Pod's own
    selection already places it, nor when the live nodes show it would leave the Pod no node."""

    axis: Axis
    value: str
    how: str
    inject: bool = True
    defaulted: bool = False  # chosen by a default, not by the Pod's label, selection or resources


class ChosenClass(NamedTuple):
    """The class a GPU Pod runs in: one `Pick` per axis that contributes, its name, and the axes left out."""

    picks: tuple[Pick, ...]
    name: str  # `workload=inference,gpu-type=t4`, or "default" when the policy has no axes
    skipped: tuple[str, ...] = ()  # `gpu-type: left out: why`
    plan_key: str = ""  # the memo key of its plan: the name, and the axes whose placement is not injected

    @classmethod
    def of(cls, picks: Sequence[Pick], skipped: Sequence[str] = ()) -> ChosenClass:
        name = _class_name(tuple([(p.axis.name, p.value) for p in picks]))
        held = [p.axis.name for p in picks if not p.inject]
        return cls(tuple(picks), name, tuple(skipped), f"{name}/without:{','.join(held)}" if held else name)

    def contributions(self) -> list[tuple[str, Contribution, bool]]:
        """(source, contribution, whether its node placement is injected) per pick."""
        return [(f"{p.axis.name} {p.value}", p.axis.values[p.value], p.inject) for p in self.picks]

    def explain(self) -> list[str]:
        """How each axis was chosen or why it was left out, for `check` and `test`."""
        told = [f"{p.axis.name}={p.value} from the {p.how}" + ("" if p.inject else " (nodeSelector not added)")
                for p in self.picks]
        return told + list(self.skipped)


@lru_cache(maxsize=1024)
def _class_name(pairs: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{axis}={value}" for axis, value in pairs) or "default"


def evaluate(policy: Policy, obj: Mapping[str, Any] | None, ctx: Context) -> Verdict:
    """Decide on one object (a Pod, a workload with a pod template, or anything else: allowed untouched)."""
    if not isinstance(obj, dict) or ctx.operation in ("DELETE", "CONNECT"):
        return Verdict()
    namespace = ctx.namespace or pods.string(pods.mapping(obj.get("metadata")).get("namespace")) or "default"
    if namespace in policy.exempt_namespaces:
        return Verdict(notes=(f"namespace {namespace} is exempt",))
    kind = obj.get("kind")
    if claims.is_claim(obj):
        return _evaluate_claim(policy, obj, namespace, ctx)
    if kind == "Pod" and ctx.operation == "UPDATE":
        return Verdict(notes=("Pod updates cannot change placement or resources; not judged",))
    specs = pods.pod_specs(obj)
    if ctx.operation == "UPDATE" and ctx.old_object is not None and _templates_unchanged(specs, ctx.old_object):
        return Verdict(notes=("pod template unchanged by this update; not judged",))
    collector = _Collector(policy)
    gpu_class: str | None = None
    total = 0
    for ref in specs:
        result = _evaluate_spec(policy, obj, ref, namespace, ctx, collector)
        if result is not None:
            gpu_class = result[0] or gpu_class
            total += result[1]
    classes = tuple(collector.classes)
    if not collector.findings:  # the usual case: nothing to sort
        return Verdict(edits=tuple(collector.edits), gpu_class=gpu_class, gpus=total, classes=classes)
    violations = tuple(f for f in collector.findings if f.enforcement == "deny")
    warnings = tuple(f for f in collector.findings if f.enforcement == "warn")
    edits = () if violations else tuple(collector.edits)
    return Verdict(violations=violations, warnings=warnings, edits=edits, gpu_class=gpu_class, gpus=total,
                   classes=classes)


def _placed_by_classes(policy: Policy, name: str) -> bool:
    resource = policy.gpu_resource(name)
    return resource is not None and resource.classes


def _templates_unchanged(specs: Sequence[PodSpecRef], old: Mapping[str, Any]) -> bool:
    return bool(specs) and all(
        pods.get(old, ref.spec_path) == ref.spec and (pods.get(old, ref.metadata_path) or {}) == ref.metadata
        for ref in specs
    )


def _evaluate_spec(policy: Policy, obj: Mapping[str, Any], ref: PodSpecRef, namespace: str, ctx: Context,
                   out: _Collector) -> tuple[str | None, int] | None:
    """Check one pod spec; returns (class name or None, GPU count) for a GPU pod spec, None otherwise.

    A spec whose GPU quantities are wrong is still a GPU spec: its class is judged too, so that every
    independent problem is reported in one answer."""
    before = len(out.findings)
    per_resource = checks.check_containers(policy, ref, out)
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
        checks.check_unaccounted_access(policy, ref, out)
        return None
    if not claims and not placed:
        return None, gpus
    chosen = _choose_class(policy, ref, namespace, ctx, per_resource, out)
    if chosen is None:
        return None, gpus
    _check_class_fit(policy, ref, chosen, per_resource, gpus, out)
    if policy.gpu_device_classes:
        _check_pod_claims(policy, ref, namespace, ctx, chosen, per_resource, gpus, claims, out)
    if ref.spec_path == ("spec",) and isinstance(ref.spec.get("nodeName"), str) and ref.spec.get("nodeName"):
        out.add("gpu-node-name-preset",
                f"spec.nodeName={ref.spec['nodeName']!r} bypasses the scheduler's GPU accounting; remove it "
                "(the class nodeSelector places the Pod)")
    if MIRROR_ANNOTATION in pods.mapping(pods.mapping(obj.get("metadata")).get("annotations")):
        return chosen.name, gpus  # the kubelet's mirror of a static Pod: immutable, never patched
    edits = _class_edits(policy, ref, chosen)  # what the class adds: injected, checked or required below
    keep_runtime = True
    if ctx.inventory is not None:
        chosen, edits, keep_runtime = _check_inventory(policy, ref, chosen, edits, per_resource, ctx.inventory,
                                                       ctx.mode, out)
    out.classes.append(chosen)
    if ctx.mode == "mutate":
        if (not ref.is_template or policy.mutate_templates) and obj.get("kind") in pods.KNOWN_KINDS:
            out.edits.extend(edits if keep_runtime else [e for e in edits if not _is_runtime_edit(ref, e)])
    elif not ref.is_template and not any(f.enforcement == "deny" for f in out.findings):
        # Only once the Pod is otherwise fine: a Pod denied for its quantities is fixed first.
        _require_class(ref, chosen, edits, out)
    return chosen.name, gpus


def _check_inventory(policy: Policy, ref: PodSpecRef, chosen: ChosenClass, edits: list[Edit],
                     per_resource: Mapping[str, list[tuple[ContainerRef, int]]], snapshot: Snapshot, mode: Mode,
                     out: _Collector) -> tuple[ChosenClass, list[Edit], bool]:
    """The live-cluster checks of a GPU pod spec with its class `edits` (webhook.policy.inventory): the class with
    the axes whose nodeSelector would leave the Pod no node held back, its edits, and False when
    runtimeClassName must not be injected."""
    if not snapshot.synced:
        out.add("gpu-inventory-unavailable",
                f"the cluster inventory is not synced ({snapshot.reason or 'starting'}): the checks against GPU "
                "nodes and runtime classes were skipped; nothing to change in the Pod")
        return chosen, edits, True
    placed = {name: pods.effective_count(counts) for name, counts in per_resource.items()
              if _placed_by_classes(policy, name)}
    # The names DRA may serve (a GPU DeviceClass's implicit or mapped name) count for the capacity checks only,
    # which read the DRA devices too; the device plugins' node checks leave them out.
    dra_served = frozenset(name for name in placed if checks.is_dra_served(policy, name))
    requests = {name: count for name, count in placed.items() if name not in dra_served}
    spared = _spare_nodes(ref, chosen, snapshot, [name for name, count in requests.items() if count > 0], out)
    if spared is not chosen:
        chosen, edits = spared, _class_edits(policy, ref, spared)
    judged = edits if mode == "mutate" else [e for e in edits if not _is_runtime_edit(ref, e)]
    result = inventory.assess(snapshot, inventory.placement(ref.spec, ref.spec_path, judged), placed, chosen.name,
                              dra_served)
    for rule, message in result.findings:
        out.add(rule, message)
    _check_shared_gpus(policy, snapshot, result.final, requests, per_resource, out)
    return chosen, edits, result.keep_runtime_class


def _check_shared_gpus(policy: Policy, snapshot: Snapshot, where: inventory.Placement, requests: Mapping[str, int],
                       per_resource: Mapping[str, list[tuple[ContainerRef, int]]], out: _Collector) -> None:
    """gpu-time-sliced-max for each container; one already over its resource's `maxPerContainer` is
    `gpu-per-container-max`'s (nvidia.com/gpu.shared in the packaged rules)."""
    for name, count in requests.items():
        resource = policy.gpu_resource(name)
        cap = resource.max_per_container if resource is not None else None
        containers = [(cref.where(), n) for cref, n in per_resource[name] if cap is None or n <= cap]
        for rule, message in inventory.time_sliced_findings(snapshot, where, name, count, containers):
            out.add(rule, message)


def _spare_nodes(ref: PodSpecRef, chosen: ChosenClass, snapshot: Snapshot, resources: Sequence[str],
                 out: _Collector) -> ChosenClass:
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


# --------------------------------------------------------------------------------------------- classes


def _choose_class(policy: Policy, ref: PodSpecRef, namespace: str, ctx: Context,
                  per_resource: Mapping[str, list[tuple[ContainerRef, int]]], out: _Collector) -> ChosenClass | None:
    """One value per axis (see the module docstring for the order), or None when a label or the namespace
    policy refuses the class; every axis is judged, so each refusal is reported."""
    labels = pods.mapping(ref.metadata.get("labels"))
    ns_labels = ctx.namespace_labels
    if ns_labels is None and ctx.inventory is not None:
        ns_labels = ctx.inventory.namespace_labels(namespace)
    ns_policy = policy.namespace_policy(namespace, labels=ns_labels)
    terms = selection.terms_of(ref.spec, ref.spec_path)
    limits = _resource_limits(policy, per_resource)
    plain = terms is NO_SELECTION and not limits and not any(labels.get(a.label) is not None for a in policy.axes)
    if plain:  # the usual GPU Pod: its class depends on the rules and its namespace alone
        memo = policy.plain_classes.get(namespace)
        if memo is not None and memo[0] is ns_policy:
            return memo[1]  # type: ignore[no-any-return]
    before = len(out.findings)
    picked: dict[str, Pick] = {}
    skipped: list[str] = []
    undecided: list[Axis] = []
    ok = True
    for axis in policy.axes:  # first what the Pod itself says: its label, its selection, its resources
        if terms is NO_SELECTION and labels.get(axis.label) is None and axis.name not in limits:
            undecided.append(axis)  # the usual Pod says nothing about its class
            continue
        said = _said_by_pod(ref, axis, labels, terms, limits.get(axis.name), out, skipped)
        if said == "open":
            undecided.append(axis)
        elif isinstance(said, Pick) and _allowed(axis, said, namespace, ns_policy, out):
            kept = selection.keep_terms(axis, said.value, terms)
            if terms is not NO_SELECTION and _strands(policy, terms, kept):
                # As when they exclude each other outright: a label that does is refused, a resource is left out.
                stranded = _stranded(policy, axis, said, terms)
                if labels.get(axis.label) is not None:
                    out.add("gpu-class-conflict", f"{stranded}; make them agree: change the label or that selector")
                    ok = False
                else:
                    _skip(axis, out, skipped, f"{stranded}, so {axis.name} is left as the Pod chose it; select a GPU "
                          "that has the resource, or ask for another resource")
                continue
            picked[axis.name] = said
            terms = kept
        elif said != "left out":
            ok = False
    for axis in undecided:  # then the defaults, within what the Pod's selection and resources admit
        selected = _selected(axis, terms)
        admits = _within(selected, limits.get(axis.name))
        # A default above may have narrowed the Pod's selection to one value of this axis: the Pod's own choice
        # then, as /validate reads the patched Pod.
        own = _own_pick(axis, terms, selected) if admits == selected else None
        pick = own or _default(axis, picked, ns_policy, namespace, admits)
        if not isinstance(pick, Pick):
            if pick and admits is not None:
                skipped.append(f"{axis.name}: left out: no default is one of the values the Pod admits "
                               f"({', '.join(sorted(admits))})")
            continue
        kept = selection.keep_terms(axis, pick.value, terms)
        if terms is not NO_SELECTION and _strands(policy, terms, kept):  # a plain Pod has no terms to lose
            _skip(axis, out, skipped, f"{axis.name} default {pick.value} would drop every term of the Pod's node "
                  f"selection that the rules cover, so {axis.name} is left as the Pod chose it; to use a class, "
                  f"set the label {axis.label}")
            continue
        if _allowed(axis, pick, namespace, ns_policy, out):
            picked[axis.name] = pick
            terms = kept
        else:
            ok = False
    if not ok:
        return None
    chosen = ChosenClass.of([picked[a.name] for a in policy.axes if a.name in picked], skipped)
    if plain and len(out.findings) == before and len(policy.plain_classes) < 1024:
        policy.plain_classes[namespace] = (ns_policy, chosen)  # only a choice that said nothing: no finding to repeat
    return chosen


def _placeable(policy: Policy, term: Term) -> bool:
    """Whether some class of the rules can hold the term's nodes: no axis finds it admits none of its values."""
    return all(selection.admitted(axis, term) != frozenset() for axis in policy.axes)


def _strands(policy: Policy, terms: tuple[Term, ...], kept: tuple[Term, ...]) -> bool:
    """Whether a value drops every one of the Pod's terms that the class map can place, keeping only terms
    whose nodes no class holds: the Pod would lose every node it selected that the rules know of."""
    return any(_placeable(policy, t) for t in terms) and not any(_placeable(policy, t) for t in kept)


def _stranded(policy: Policy, axis: Axis, pick: Pick, terms: tuple[Term, ...]) -> str:
    """Why a label's or resource's value cannot stand: it keeps only the Pod's terms that no class holds."""
    covered: set[str] = set()
    for term in terms:
        if _placeable(policy, term):
            covered |= selection.admitted(axis, term) or set(axis.values)
    return (f"{pick.how} chooses {axis.name} {pick.value}, but the Pod's own node selection "
            f"{selection.describe(axis, terms)} admits only {axis.name} {', '.join(sorted(covered))} on the nodes the "
            "rules class (its other terms select nodes no class has)")


# The values a resource exists on, its name, who asks, and what each value offers of its family (for messages).
_Limit = tuple[frozenset[str], str, ContainerRef, str]
_Unsaid = Literal["open", "refused", "left out"]


def _resource_limits(policy: Policy, per_resource: Mapping[str, list[tuple[ContainerRef, int]]]) -> dict[str, _Limit]:
    """Per axis, the values every GPU resource of the spec exists on (`validFor`), the resource and a container
    that asks for it."""
    limits: dict[str, _Limit] = {}
    for name, counts in per_resource.items():
        resource = policy.gpu_resource(name)
        if resource is None or not resource.valid_for:
            continue
        for axis_name, values in resource.valid_for.items():
            known = limits.get(axis_name)
            family = resource.pattern.split("*")[0] if is_glob(resource.pattern) else name
            axis_values = next((list(a.values) for a in policy.axes if a.name == axis_name), [])
            offers = offered(policy.resources, axis_name, axis_values, family) if not values else ""
            limits[axis_name] = (values if known is None else known[0] & values, name, counts[0][0], offers)
    return limits


def _selected(axis: Axis, terms: tuple[Term, ...]) -> frozenset[str] | None:
    """The values the Pod's own node selection admits for the axis (None: it selects no nodes)."""
    return None if terms is NO_SELECTION else selection.candidates(axis, terms)


def _own_pick(axis: Axis, terms: tuple[Term, ...], selected: frozenset[str] | None) -> Pick | None:
    """The value the Pod's own selection names when it names exactly one: the Pod's choice, and no nodeSelector
    is injected for it (its own selector already places it)."""
    if selected is None or len(selected) != 1:
        return None
    return Pick(axis, next(iter(selected)), f"Pod's own selection {selection.describe(axis, terms)}", False)


def _within(selected: frozenset[str] | None, limit: _Limit | None) -> frozenset[str] | None:
    """The values the selection admits that the resources exist on (None: no bound from either)."""
    if limit is None:
        return selected
    return limit[0] if selected is None else selected & limit[0]


def _said_by_pod(ref: PodSpecRef, axis: Axis, labels: Mapping[str, Any], terms: tuple[Term, ...],
                 limit: _Limit | None, out: _Collector, skipped: list[str]) -> Pick | _Unsaid:
    """The axis value the Pod's label, own selection or resources determine, else "open" when they leave it
    to the defaults, "refused" when they contradict each other or the rules (reported), "left out" when
    the Pod names a GPU the axis does not cover (warned)."""
    selected = _selected(axis, terms)
    label_value = labels.get(axis.label)
    if label_value is not None:
        value = str(label_value)
        label_at = f"{render_path((*ref.metadata_path, 'labels'))}[{axis.label}]"
        if value not in axis.values:
            out.add("gpu-class-unknown",
                    f'{label_at}: "{value}" is not a {axis.name} class; choose one of: {", ".join(axis.values)}')
            return "refused"
        if selected is not None and value not in selected:
            names = f"{axis.name} {', '.join(sorted(selected))}" if selected else f"no {axis.name} value of the rules"
            out.add("gpu-class-conflict",
                    f'{label_at} is "{value}" but the Pod\'s own selection {selection.describe(axis, terms)} '
                    f"admits {names}; remove the label or that selector, so that only one of them names the GPU")
            return "refused"
        if limit is not None and value not in limit[0]:
            where = (f"exists only on {axis.name} {', '.join(sorted(limit[0]))}; set the label to one of those"
                     if limit[0] else f"no {axis.name} value of the rules offers ({limit[3]}); "
                     "remove the label")
            out.add("gpu-class-conflict", f'{label_at} is "{value}" but {limit[2].where()} asks for {limit[1]}, '
                    f"which {where}, or ask for another resource")
            return "refused"
        return Pick(axis, value, f"label {axis.label}")
    admits = _within(selected, limit)
    if selected is not None and not selected:
        _skip(axis, out, skipped, f"{selection.describe(axis, terms)} selects a GPU that no {axis.name} value of the "
              f"rules covers ({', '.join(axis.values)}), so {axis.name} is left as the Pod chose it (to use a class "
              f"instead, replace that selector with the label {axis.label}); to class this GPU, add it to the rules' "
              "aliases")
        return "left out"
    if limit is not None and not limit[0]:
        _skip(axis, out, skipped, f"{limit[2].where()} asks for {limit[1]}, which no {axis.name} value of the rules "
              f"offers ({limit[3]}), so no {axis.name} is implied and the Pod goes where the scheduler finds it; ask "
              "for what a value offers, or add its GPU to the rules")
        return "left out"
    if admits is not None and not admits and limit is not None:
        _skip(axis, out, skipped, f"{selection.describe(axis, terms)} selects {axis.name} "
              f"{', '.join(sorted(selected or ()))} but {limit[2].where()} asks for {limit[1]}, which exists only on "
              f"{axis.name} {', '.join(sorted(limit[0]))}: no node has both; select a GPU with {limit[1]} or "
              "another resource")
        return "left out"
    own = _own_pick(axis, terms, selected)
    if own is not None:
        return own
    if admits is not None and len(admits) == 1 and limit is not None:
        return Pick(axis, next(iter(admits)), f"resource {limit[1]} ({limit[2].where()})")
    return "open"


def _skip(axis: Axis, out: _Collector, skipped: list[str], message: str) -> None:
    out.add("gpu-class-skipped", message)
    skipped.append(f"{axis.name}: left out: {message.split('; ')[0]}")


def _default(axis: Axis, picked: Mapping[str, Pick], ns_policy: NamespacePolicy | None, namespace: str,
             admits: frozenset[str] | None) -> Pick | bool:
    """The first default the Pod admits, for an axis it left open: the one a chosen value of another axis sets,
    the namespace's, the cluster's. Else whether there was a default at all (the Pod excluded them)."""
    offered = False
    for other in picked.values():
        value = other.axis.values[other.value].defaults.get(axis.name)
        if value is not None:
            if admits is None or value in admits:
                return Pick(axis, value, f"default of {other.axis.name} {other.value}", True, True)
            offered = True
    if ns_policy and axis.name in ns_policy.defaults:
        value = ns_policy.defaults[axis.name]
        if admits is None or value in admits:
            via = f" (namespaceSelectors.{ns_policy.name})" if ns_policy.match_labels else ""
            return Pick(axis, value, f"namespace {namespace} default{via}", True, True)
        offered = True
    if axis.default is not None:
        if admits is None or axis.default in admits:
            return Pick(axis, axis.default, "cluster default", True, True)
        offered = True
    return offered


def _allowed(axis: Axis, pick: Pick, namespace: str, ns_policy: NamespacePolicy | None, out: _Collector) -> bool:
    """Whether the namespace may use the value (reported when not)."""
    allowed = ns_policy.allowed.get(axis.name) if ns_policy else None
    if allowed is None or pick.value in allowed:
        return True
    out.add("gpu-class-not-allowed",
            f"namespace {namespace} may not use {axis.name} {pick.value} (from the {pick.how}); set the label "
            f"{axis.label} to one of: {', '.join(allowed)}")
    return False


def _check_class_fit(policy: Policy, ref: PodSpecRef, chosen: ChosenClass,
                     per_resource: Mapping[str, list[tuple[ContainerRef, int]]], gpus: int, out: _Collector) -> None:
    plan = _plan(policy, chosen)
    if plan.cap and gpus > plan.cap[0]:
        cap, source = plan.cap
        out.add("gpu-class-max",
                f"the Pod needs {gpus} GPUs ({', '.join(per_resource)}: containers and sidecars, or the largest init "
                f"container) but class {chosen.name} allows at most {cap} (set by {source}); ask for fewer, or pick a "
                "class that allows more with the class labels")
    spec, spec_path = ref.spec, ref.spec_path
    for key, wanted, source in plan.required:
        mine = spec.get(key)
        defaulted = key == "schedulerName" and mine == DEFAULT_SCHEDULER
        if isinstance(mine, str) and mine and mine != wanted and not defaulted:
            out.add("gpu-class-conflict",
                    f'{render_path((*spec_path, key))} is "{mine}" but class {chosen.name} ({source}) '
                    f'requires "{wanted}"; remove it from the Pod or pick the class you meant')


def _class_fields(contribution: Contribution) -> list[tuple[str, str]]:
    """The single-valued pod spec fields a class axis value requires."""
    fields = [
        ("runtimeClassName", contribution.runtime_class_name),
        ("priorityClassName", contribution.priority_class_name),
        ("schedulerName", contribution.scheduler_name),
    ]
    return [(name, value) for name, value in fields if value]


# --------------------------------------------------------------------------------------------- edits


@dataclass(frozen=True)
class ClassPlan:
    """Everything a class adds to a GPU Pod, merged once per class: `common` first, then each axis value."""

    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    fields: tuple[tuple[str, str], ...]
    node_affinity: Mapping[str, Any] | None
    match_expressions: tuple[Expression, ...]  # added to every required nodeSelectorTerm of the Pod
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    cap: tuple[int, str] | None  # the class maximum and the axis value that sets it
    required: tuple[tuple[str, str, str], ...]  # (field, value, source): the single-valued fields axis values require


def _plan(policy: Policy, chosen: ChosenClass) -> ClassPlan:
    """The merged plan of a class, memoised on the (immutable) policy."""
    key = chosen.plan_key
    plan: ClassPlan | None = policy.plans.get(key)
    if plan is not None:
        return plan
    contributions = [policy.common, *(c for _, c, _ in chosen.contributions())]
    placing = [policy.common, *(c for _, c, inject in chosen.contributions() if inject)]
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    fields: dict[str, str] = {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for c in placing:
        for label, value in c.node_selector.items():
            selector.setdefault(label, value)
    for c in contributions:
        tolerations.extend(t for t in c.tolerations if not _covered(tolerations, t))
        for name, wanted in _class_fields(c):
            fields[name] = wanted  # an axis value's requirement wins over `common`'s default
        for name, value in c.labels.items():
            labels.setdefault(name, value)
        for name, value in c.annotations.items():
            annotations.setdefault(name, value)
    affinity = next((c.node_affinity for c in placing if c.node_affinity), None)
    expressions = tuple(dict.fromkeys(e for c in placing for e in c.match_expressions))
    caps = [(c.max_gpus_per_pod, source) for source, c, _ in chosen.contributions() if c.max_gpus_per_pod]
    required = [(k, v, source) for source, c, _ in chosen.contributions() for k, v in _class_fields(c)]
    plan = ClassPlan(selector, tuple(tolerations), tuple(fields.items()), affinity, expressions, labels, annotations,
                     min(caps) if caps else None, tuple(required))
    if len(policy.plans) < 1024:
        policy.plans[key] = plan
    return plan


def _class_edits(policy: Policy, ref: PodSpecRef, chosen: ChosenClass) -> list[Edit]:
    """Everything the class adds that the spec does not already have, as edits; never over a written value."""
    plan = _plan(policy, chosen)
    spec, path = ref.spec, ref.spec_path
    edits: list[Edit] = []
    selector = pods.mapping(spec.get("nodeSelector"))
    selector_path = (*path, "nodeSelector")
    for key, wanted_value in plan.node_selector.items():
        if key not in selector:
            edits.append(Edit("set", selector_path, key, wanted_value))
    current = spec.get("tolerations")
    existing = current if isinstance(current, list) else ()
    for tol in plan.tolerations:
        if not _covered(existing, tol):
            edits.append(Edit("append", (*path, "tolerations"), None, tol))  # operations() copies the rules' dict
    for field_name, wanted in plan.fields:
        value = spec.get(field_name)
        if value in (None, "") or (field_name == "schedulerName" and value == DEFAULT_SCHEDULER != wanted):
            edits.append(Edit("set", path, field_name, wanted))
            if field_name == "priorityClassName" and not ref.is_template:
                # The Priority plugin refuses a Pod whose integer priority was computed before the class name
                # was set; dropping it lets the plugin recompute both on reinvocation.
                edits.extend(Edit("remove", path, f) for f in ("priority", "preemptionPolicy") if f in spec)
    if plan.match_expressions:
        edits.extend(_affinity_edits(spec, path, plan))
    elif plan.node_affinity and "nodeAffinity" not in pods.mapping(spec.get("affinity")):
        edits.append(Edit("set", (*path, "affinity"), "nodeAffinity", dict(plan.node_affinity)))
    for part, wanted_map in (("labels", plan.labels), ("annotations", plan.annotations)):
        if wanted_map:
            have = pods.mapping(ref.metadata.get(part))
            edits.extend(Edit("set", (*ref.metadata_path, part), k, v) for k, v in wanted_map.items() if k not in have)
    if edits:
        annotations = pods.mapping(ref.metadata.get("annotations"))
        annotations_path = (*ref.metadata_path, "annotations")
        if CLASS_ANNOTATION not in annotations:
            edits.append(Edit("set", annotations_path, CLASS_ANNOTATION, chosen.name))
        if RULES_ANNOTATION not in annotations:
            edits.append(Edit("set", annotations_path, RULES_ANNOTATION, policy.digest))
    return edits


def _affinity_edits(spec: Mapping[str, Any], path: pods.Path, plan: ClassPlan) -> list[Edit]:
    """The class's matchExpressions in every required nodeSelectorTerm of the Pod, as edits that keep what the Pod
    wrote: a Pod without node affinity gets the class's (its `affinity` too, if any) with the expressions in each
    term; one without required terms gets a term of them; each of its terms gets the expressions it lacks.
    Idempotent: an expression a term already has is not added again."""
    node_affinity = pods.mapping(spec.get("affinity")).get("nodeAffinity")
    affinity_path = (*path, "affinity")
    if not isinstance(node_affinity, dict):
        return [Edit("set", affinity_path, "nodeAffinity",
                     inventory.with_expressions(plan.node_affinity, plan.match_expressions))]
    required = node_affinity.get(inventory.REQUIRED)
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    required_path = (*affinity_path, "nodeAffinity", inventory.REQUIRED)
    if not isinstance(terms, list) or not terms:
        merged = inventory.with_expressions(None, plan.match_expressions)[inventory.REQUIRED]
        if isinstance(required, dict):
            return [Edit("set", required_path, "nodeSelectorTerms", merged["nodeSelectorTerms"])]
        return [Edit("set", required_path[:-1], inventory.REQUIRED, merged)]
    edits: list[Edit] = []
    wanted = [e.to_api() for e in plan.match_expressions]
    for index, term in enumerate(terms):
        if not isinstance(term, dict) or not (term.get("matchExpressions") or term.get("matchFields")):
            continue  # an empty term matches no node: it stays so
        have: list[Any] = term.get("matchExpressions") or []
        edits.extend(Edit("append", (*required_path, "nodeSelectorTerms", index, "matchExpressions"), None, e)
                     for e in wanted if not any(inventory.same_expression(h, e) for h in have))
    return edits


def _covered(present: Sequence[Any], want: Mapping[str, Any]) -> bool:
    """Whether one of the `present` tolerations (items that are not objects are skipped) covers `want`.

    A loop, not `any()` over a generator: this runs on every GPU Pod's review.
    """
    for have in present:  # noqa: SIM110 (see above)
        if isinstance(have, dict) and _covers(have, want):
            return True
    return False


def _covers(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether an existing toleration already tolerates everything `want` does (Kubernetes semantics)."""
    if have.get("effect") not in (None, "", want.get("effect")):
        return False
    if have.get("tolerationSeconds") is not None and have.get("tolerationSeconds") != want.get("tolerationSeconds"):
        return False
    have_op = have.get("operator") or "Equal"
    if have_op == "Exists":
        return not have.get("key") or have.get("key") == want.get("key")
    want_op = want.get("operator") or "Equal"
    return want_op == "Equal" and have.get("key") == want.get("key") and (have.get("value") or "") == (
        want.get("value") or "")


def _require_class(ref: PodSpecRef, chosen: ChosenClass, edits: Sequence[Edit], out: _Collector) -> None:
    """At /validate: what the mutating webhook would have added must already be there."""
    selectors = [f"{e.key}={e.value}" for e in edits if e.path[-1:] == ("nodeSelector",)]
    missing = [f"nodeSelector {', '.join(selectors)}"] if selectors else []
    if any(e.path[len(ref.spec_path):][:1] == ("affinity",) for e in edits):
        wanted = dict.fromkeys(e for _, c, inject in chosen.contributions() if inject for e in c.match_expressions)
        missing.append("in every required node affinity term: " + (", ".join(map(str, wanted)) or "the class's"))
    for edit in edits:
        if edit.path[len(ref.spec_path):][:1] == ("affinity",):
            continue
        if edit.kind == "append":
            tol = edit.value
            missing.append(f"toleration {tol.get('key', '*')}{'=' + tol['value'] if tol.get('value') else ''}"
                           f":{tol.get('effect') or '*'}")
    if missing:
        out.add("gpu-class-missing",
                f"the Pod lacks what class {chosen.name} requires: {', '.join(missing)}; the mutating webhook "
                "mutate.gpu-webhook.io adds these and was skipped (it fails open): re-create the Pod, or add "
                "them to its spec")


# --------------------------------------------------------------------------------------------- DRA claims


def _evaluate_claim(policy: Policy, obj: Mapping[str, Any], namespace: str, ctx: Context) -> Verdict:
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
    out = _Collector(policy)
    ref = PodSpecRef(("spec",), ("metadata",), {}, {"labels": claim.labels}, claim.kind == "ResourceClaimTemplate")
    classed = any(policy.dra.is_classed(a.device_class) for a in claim.gpu_asks(policy))
    chosen = _choose_class(policy, ref, namespace, ctx, {}, out) if classed else None
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
                 snapshot: Snapshot, out: _Collector) -> tuple[ChosenClass | None, claims.ClaimClass | None]:
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
    return claims.ClaimClass(chosen.name, _plan(policy, chosen).cap, {k: tuple(v) for k, v in mine.items()}, others)


def _check_pod_claims(policy: Policy, ref: PodSpecRef, namespace: str, ctx: Context, chosen: ChosenClass,
                      per_resource: Mapping[str, list[tuple[ContainerRef, int]]], gpus: int,
                      templates: Sequence[tuple[str, Claim]], out: _Collector) -> None:
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
