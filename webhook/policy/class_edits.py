"""What a GPU Pod's class adds to it: the plan of a class (its nodeSelector, tolerations, node affinity, runtime
class and other fields, memoised per class on the loaded rules), the edits that apply it without overwriting what
the author wrote and their JSON Patch (memoised per class and pod spec shape, `class_changes`), and, at the
validating endpoint, the violation when they are missing. Part of `webhook.policy.engine`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.policy import inventory, pods
from webhook.policy.chosen import ChosenClass, Collector
from webhook.policy.findings import Edit, Patch
from webhook.policy.patch import patch_of
from webhook.policy.pods import PodSpecRef
from webhook.policy.rules import ANNOTATION_PREFIX, Contribution, Expression, Policy

CLASS_ANNOTATION = ANNOTATION_PREFIX + "class"
RULES_ANNOTATION = ANNOTATION_PREFIX + "rules"
DEFAULT_SCHEDULER = "default-scheduler"
MEMO_SIZE = 1024  # entries of the per-policy memo of class changes; a full memo takes no more


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
    field_names: tuple[str, ...] = ()  # the names in `fields`, in order


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
                     min(caps) if caps else None, tuple(required), tuple(fields))
    if len(policy.plans) < 1024:
        policy.plans[key] = plan
    return plan


class ClassChanges(NamedTuple):
    """What a class adds to one pod spec: its edits and, on the object the spec is in, their JSON Patch (None when
    not memoised: the patch is then built only where it is needed, with `patch.operations`).

    Shared between reviews through the memo of `class_changes`: neither the tuples nor the operations' dicts
    are ever changed once made (a caller that would change them copies them first)."""

    edits: tuple[Edit, ...]
    patch: Patch | None


def class_changes(policy: Policy, obj: Mapping[str, Any], ref: PodSpecRef, chosen: ChosenClass) -> ClassChanges:
    """`class_edits` and their `patch.operations` on `obj`, memoised on the (immutable) policy by `_shape`: the
    second Pod of a class and shape gets the first one's, made once."""
    # plan_of's own memo read inline: calling it costs about 2,300 more instructions per GPU review.
    plan = policy.plans.get(chosen.plan_key) or plan_of(policy, chosen)
    key = _shape(obj, ref, chosen, plan)
    if key is None:
        return ClassChanges(tuple(class_edits(policy, ref, chosen)), None)
    memo: dict[tuple[Any, ...], ClassChanges] = policy.class_changes
    try:
        found = memo.get(key)
    except TypeError:  # an unhashable value where a field belongs (a manifest's, never the API server's): no memo
        return ClassChanges(tuple(class_edits(policy, ref, chosen)), None)
    if found is None:
        edits = tuple(class_edits(policy, ref, chosen))
        if len(memo) >= MEMO_SIZE:
            return ClassChanges(edits, None)
        found = memo[key] = ClassChanges(edits, patch_of(obj, edits))
    return found


def _shape(obj: Mapping[str, Any], ref: PodSpecRef, chosen: ChosenClass, plan: ClassPlan) -> tuple[Any, ...] | None:
    """The memo key of a pod spec's class changes: all that `class_edits` and `patch.operations` read of the
    object for this plan, and nothing more, so that Pods of one class that differ elsewhere share an entry.

    It holds: the class (its plan key and name; the policy, with its digest, holds the memo); where the spec and
    its metadata are, and whether it is a template (the Priority fields are removed only from Pods); the type of
    the metadata in the object (absent, it is added whole; `ref.metadata` is that object's when not empty); the
    keys of the nodeSelector, node affinity and labels where the plan adds to them, and of the annotations (the
    class's and the rules' are added when missing), None when not an object, their values never being read;
    which of the class's tolerations the Pod's already cover (None when its tolerations are not a list); the
    values of the fields the plan sets; whether `priority` and `preemptionPolicy` are present. Values compare as
    Python compares them, as `class_edits` does. None (not memoised) when the plan adds match expressions: those
    edits read the whole node affinity. This runs on every GPU Pod: each part is one or two C calls where it can
    be (a tuple costs about as much as a Python call)."""
    if plan.match_expressions:
        return None
    spec, metadata = ref.spec, ref.metadata
    selector = spec.get("nodeSelector") if plan.node_selector else None
    tolerations = spec.get("tolerations") if plan.tolerations else None
    affinity = spec.get("affinity") if plan.node_affinity else None
    labels = metadata.get("labels") if plan.labels else None
    annotations = metadata.get("annotations")
    return (
        chosen.plan_key, chosen.name, ref.spec_path, ref.metadata_path, ref.is_template,
        dict if metadata else type(pods.get(obj, ref.metadata_path)),
        tuple(selector) if isinstance(selector, dict) else None,
        _coverage(tolerations, plan.tolerations) if isinstance(tolerations, list) else None,
        tuple(map(spec.get, plan.field_names)),
        "priority" in spec, "preemptionPolicy" in spec,
        tuple(affinity) if isinstance(affinity, dict) else None,
        tuple(labels) if isinstance(labels, dict) else None,
        tuple(annotations) if isinstance(annotations, dict) else None,
    )


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
    for tol, covered in zip(plan.tolerations, _coverage(existing, plan.tolerations), strict=True):
        if not covered:
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


def _coverage(present: Sequence[Any], wanted: Sequence[Mapping[str, Any]]) -> tuple[bool, ...]:
    """For each of the `wanted` tolerations, whether one of the `present` ones covers it (`_covered`).

    One call for all of them, and a toleration of another effect is passed over without a call to `_covers`
    (the usual case: the API server's NoExecute tolerations of every Pod): this runs on every GPU Pod."""
    found = []
    for want in wanted:
        effect = want.get("effect")
        for have in present:
            if isinstance(have, dict) and have.get("effect") in (None, "", effect) and _covers(have, want):
                found.append(True)
                break
        else:
            found.append(False)
    return tuple(found)


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
