"""The class of a GPU Pod (or of a claim): one value per axis, from the Pod's class label, what its own nodeSelector
and required node affinity select, what its GPU resources exist on (`validFor`), the defaults, the namespace's
default and the cluster's; a value the Pod's own selection excludes is never chosen. And whether the class exists,
the namespace may use it, the Pod's GPU count fits it and what the developer wrote agrees with it
(`check_class_fit`). Part of `webhook.policy.engine`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from webhook.policy import pods, selection
from webhook.policy.chosen import ChosenClass, Collector, Context, Pick
from webhook.policy.class_edits import DEFAULT_SCHEDULER, plan_of
from webhook.policy.pods import ContainerRef, PodSpecRef, render_path
from webhook.policy.resources import is_glob, offered
from webhook.policy.rules import Axis, NamespacePolicy, Policy
from webhook.policy.selection import NO_SELECTION, Term


def choose_class(policy: Policy, ref: PodSpecRef, namespace: str, ctx: Context,
                  per_resource: Mapping[str, list[tuple[ContainerRef, int]]], out: Collector) -> ChosenClass | None:
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
                 limit: _Limit | None, out: Collector, skipped: list[str]) -> Pick | _Unsaid:
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


def _skip(axis: Axis, out: Collector, skipped: list[str], message: str) -> None:
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


def _allowed(axis: Axis, pick: Pick, namespace: str, ns_policy: NamespacePolicy | None, out: Collector) -> bool:
    """Whether the namespace may use the value (reported when not)."""
    allowed = ns_policy.allowed.get(axis.name) if ns_policy else None
    if allowed is None or pick.value in allowed:
        return True
    out.add("gpu-class-not-allowed",
            f"namespace {namespace} may not use {axis.name} {pick.value} (from the {pick.how}); set the label "
            f"{axis.label} to one of: {', '.join(allowed)}")
    return False


def check_class_fit(policy: Policy, ref: PodSpecRef, chosen: ChosenClass,
                     per_resource: Mapping[str, list[tuple[ContainerRef, int]]], gpus: int, out: Collector) -> None:
    plan = plan_of(policy, chosen)
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
