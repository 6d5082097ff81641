"""What a GPU Pod's class adds to it: the plan of a class (its nodeSelector, tolerations, node affinity, runtime
class and other fields, memoised per class on the loaded rules), the edits that apply it without overwriting what
the author wrote, and, at the validating endpoint, the violation when they are missing. Part of
`webhook.policy.engine`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.policy import inventory, pods
from webhook.policy.chosen import ChosenClass, Collector
from webhook.policy.findings import Edit
from webhook.policy.pods import PodSpecRef
from webhook.policy.rules import ANNOTATION_PREFIX, Contribution, Expression, Policy

CLASS_ANNOTATION = ANNOTATION_PREFIX + "class"
RULES_ANNOTATION = ANNOTATION_PREFIX + "rules"
DEFAULT_SCHEDULER = "default-scheduler"


def class_fields(contribution: Contribution) -> list[tuple[str, str]]:
    """The single-valued pod spec fields a class axis value requires."""
    fields = [
        ("runtimeClassName", contribution.runtime_class_name),
        ("priorityClassName", contribution.priority_class_name),
        ("schedulerName", contribution.scheduler_name),
    ]
    return [(name, value) for name, value in fields if value]



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


def plan_of(policy: Policy, chosen: ChosenClass) -> ClassPlan:
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
        for name, wanted in class_fields(c):
            fields[name] = wanted  # an axis value's requirement wins over `common`'s default
        for name, value in c.labels.items():
            labels.setdefault(name, value)
        for name, value in c.annotations.items():
            annotations.setdefault(name, value)
    affinity = next((c.node_affinity for c in placing if c.node_affinity), None)
    expressions = tuple(dict.fromkeys(e for c in placing for e in c.match_expressions))
    caps = [(c.max_gpus_per_pod, source) for source, c, _ in chosen.contributions() if c.max_gpus_per_pod]
    required = [(k, v, source) for source, c, _ in chosen.contributions() for k, v in class_fields(c)]
    plan = ClassPlan(selector, tuple(tolerations), tuple(fields.items()), affinity, expressions, labels, annotations,
                     min(caps) if caps else None, tuple(required))
    if len(policy.plans) < 1024:
        policy.plans[key] = plan
    return plan


def class_edits(policy: Policy, ref: PodSpecRef, chosen: ChosenClass) -> list[Edit]:
    """Everything the class adds that the spec does not already have, as edits; never over a written value."""
    plan = plan_of(policy, chosen)
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


def require_class(ref: PodSpecRef, chosen: ChosenClass, edits: Sequence[Edit], out: Collector) -> None:
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
