"""The rule files compiled to Kubernetes' in-process admission policies (native mode).

`render(policy, mode)` turns a loaded `Policy` into plain Kubernetes objects, with no I/O:

- a CustomResourceDefinition `GPUClassMap` (gpu-webhook.io/v1alpha1, cluster-scoped) and one `GPUClassMap`
  named `gpu-webhook`: the **params**. It carries the data of the rules: the class table, what each class
  adds, the GPU resources, the aliases, the namespaces and the enforcement levels. A rule edit changes only
  this object (`kubectl apply` of a re-render); the policies below stay byte-identical.
- a `MutatingAdmissionPolicy` + binding that injects the class into GPU Pods on CREATE, with JSONPatch: the
  class's nodeSelector keys the Pod lacks, each toleration no existing one covers (so a second pass adds
  nothing: `reinvocationPolicy: IfNeeded` is safe), the default `runtimeClassName` and the other single-valued
  fields when absent, labels and annotations when absent (a class value with node affinity is refused);
- two `ValidatingAdmissionPolicy`s + bindings, one bound with `validationActions: [Deny]` and one with
  `[Warn, Audit]`. Both carry the same validations; each fires only for the rules whose enforcement in the
  params is its level, so moving a rule from deny to warn is again a data change.

Why a CRD and not a ConfigMap for the params: a ConfigMap holds only strings, and CEL in the API server cannot
parse JSON, so tolerations and node selectors would have to be re-assembled from flat strings in every
expression. And the API server estimates the cost of every expression from the params' schema: a ConfigMap's
data has no bounds, while the CRD's schema gives typed fields with `maxItems`/`maxLength` bounds (with them the
policies pass the estimation; a ConfigMap variant was not tried).

How a class is chosen in CEL: the engine's order (label, own selection through the aliases, value defaults,
namespace default, cluster default) is not re-implemented. Each axis is reduced to a token (the label's value,
the set of values the Pod's own nodeSelector admits through the aliases, and the values its `validFor` GPU
resource exists on), and the compiler runs the engine
itself on a Pod for every combination of tokens and every namespace policy; the table maps the tokens to what
the engine decided (the class and its plan, or the findings). So native and webhook agree by construction on
what the table covers, and the differential e2e proves it on the real API server.

What stays with the webhook (`WEBHOOK_ONLY`, shown by `gpu-webhook rules`): decisions from the live inventory,
and class choices from what the table cannot key on (required node affinity, two `validFor` families in one
Pod, DRA claims). The native policies give such Pods no class (the `deferred` variable, or no table entry);
in hybrid mode the narrowed mutating webhook sees them (`hybrid_match_conditions`).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from webhook.policy import class_edits, engine, native_cel
from webhook.policy.dra_rules import IMPLICIT_PREFIX
from webhook.policy.findings import Verdict
from webhook.policy.resources import GPUResource
from webhook.policy.rules import RULES, Axis, LabelValues, Policy

Mode = Literal["native", "hybrid"]
Json = dict[str, Any]

GROUP = "gpu-webhook.io"
PARAMS_VERSION = "v1alpha1"
PARAMS_KIND = "GPUClassMap"
PARAMS_PLURAL = "gpuclassmaps"
PARAMS_NAME = "gpu-webhook"
POLICY_PREFIX = "gpu-webhook.io-"
MAX_TABLE = 20000  # entries of the class table; more axes and values than this are refused with the count

# Where each rule runs, and why a rule cannot be native.
NATIVE = "native"
WEBHOOK = "webhook"
BOTH = "both"
WEBHOOK_ONLY: dict[str, str] = {
    "gpu-never-schedulable": "needs the live nodes (the largest Ready node of the class); CEL sees only the request",
    "gpu-class-no-node": "needs the live nodes' labels and allocatable GPUs",
    "gpu-time-sliced-max": "needs the live nodes' GFD sharing labels (every node the Pod can land on)",
    "gpu-runtime-class-missing": "needs the live RuntimeClasses; CEL cannot read other objects",
    "gpu-inventory-unavailable": "is about the webhook's own inventory cache",
    "gpu-class-missing": "guards against the mutating webhook being skipped (failurePolicy Ignore); the mutating "
                         "policy runs in-process and fails closed, so there is nothing to guard",
    # DRA (docs/dra.md): not compiled yet. The per-request checks could be CEL on resourceclaims and
    # resourceclaimtemplates with the params; the Pod-level ones read the Pod's claim templates, another object.
    "dra-claim-max": "judged on ResourceClaims and ResourceClaimTemplates, which no native policy matches yet",
    "dra-allocation-all": "judged on ResourceClaims and ResourceClaimTemplates, which no native policy matches yet",
    "dra-admin-access": "judged on ResourceClaims and ResourceClaimTemplates, which no native policy matches yet",
    "dra-class-not-allowed": "judged on ResourceClaims and ResourceClaimTemplates, which no native policy matches "
                             "yet",
    "dra-selector-conflict": "judged on ResourceClaims and ResourceClaimTemplates, which no native policy matches "
                             "yet",
    "dra-pod-max": "needs the Pod's ResourceClaimTemplates and ResourceClaims; CEL cannot read other objects",
    "dra-unsatisfiable": "needs the live ResourceSlices and DeviceClasses; CEL cannot read other objects",
    "dra-double-allocation": "needs the Pod's ResourceClaimTemplates and ResourceClaims (CEL cannot read other "
                             "objects)",
}
# Class choices the table cannot key on: Pods with these go to the webhook (hybrid) or get no class (native).
DEFERRED = {
    "affinity": "the Pod's required node affinity chooses its class (terms, operators, globs: the engine decides)",
    "validFor": "the Pod asks for two GPU resources that exist only on some values (validFor)",
}
# What native mode counts differently from the webhook, where both refuse the Pod (docs/dra.md): a GPU resource
# in a container's requests without a limit (allowed for the implicit DeviceClass names) is counted by the webhook
# as the scheduler allocates it, and refused by both as gpu-limits-required; native mode counts limits only.
COUNTED_FROM_LIMITS = ("native mode counts GPUs from limits only; the webhook also counts a DRA-served name "
                       "requested without a limit, as kube-scheduler allocates it")
# Rules judged natively but where the API server's own validation answers first for Pods (it runs after the
# mutating stage and before the validating one): the native message is then the API server's.
API_VALIDATED = ("gpu-limits-required", "gpu-requests-equal-limits", "gpu-whole-number", "gpu-quantity-invalid",
                 "gpu-pod-level-resources")


class NativeError(ValueError):
    """Rules that cannot be compiled; the message says which part and what to do."""


def placement_of(rule: str) -> tuple[str, str]:
    """(where the rule runs in hybrid mode, why), for `gpu-webhook rules`."""
    if rule in WEBHOOK_ONLY:
        return WEBHOOK, WEBHOOK_ONLY[rule]
    if rule == "gpu-quantity-invalid":
        return NATIVE, "the API server itself refuses a value that is not a quantity, before any admission stage"
    if rule in API_VALIDATED:
        return NATIVE, "CEL on Pods and pod templates (for Pods the API server's own validation answers first)"
    if rule in ("gpu-class-conflict", "gpu-class-skipped", "gpu-class-unknown", "gpu-class-not-allowed"):
        return BOTH, ("CEL through the class table; the webhook for Pods whose class comes from required node "
                      "affinity or validFor resources")
    return NATIVE, "CEL on Pods and pod templates"


# --------------------------------------------------------------------------------------------- params


def _regex(values: LabelValues) -> str:
    """A full-match RE2 pattern for the literals and `*`/`?` globs of an alias (label values: no metacharacters
    other than `.`)."""
    alternatives = []
    for pattern in values.patterns:
        alternatives.append("".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern))
    return "^(" + "|".join(alternatives) + ")$"


def _is_pattern(name: str) -> bool:
    return "*" in name or "?" in name


def _kind(resource: GPUResource) -> str:
    """How the classes treat a GPU resource: placed, validFor (placed within some values) or checked only."""
    if not resource.classes:
        return "checked"
    return "validFor" if resource.valid_for else "placed"


def _resource_regex(pattern: str) -> str:
    return "^" + "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern) + "$"


@dataclass(frozen=True)
class _Token:
    """What a Pod says about one axis: its label value ("" none) and the values its nodeSelector admits
    (None: its nodeSelector does not touch the axis's keys)."""

    label: str
    selected: tuple[str, ...] | None

    def key(self) -> str:
        return f"{self.label}={'*' if self.selected is None else ','.join(self.selected)}"


def _tokens(axis: Axis) -> list[_Token]:
    labels = ["", *axis.values]
    subsets: list[tuple[str, ...] | None] = [None]
    names = list(axis.values)  # the order CEL's filter keeps
    for size in range(len(names) + 1):
        subsets.extend(itertools.combinations(names, size))
    return [_Token(label, sel) for label in labels for sel in subsets]


def _limit_token(axis: Axis, resource: GPUResource | None) -> str:
    """The values of `axis` a validFor resource exists on, in the axis's order ("*": no bound)."""
    if resource is None or axis.name not in resource.valid_for:
        return "*"
    return ",".join(v for v in axis.values if v in resource.valid_for[axis.name])


def _synthetic_pod(policy: Policy, namespace: str, tokens: Sequence[_Token], resource: str) -> Json | None:
    """A Pod asking for one `resource` that says exactly `tokens` about the axes (None: the tokens cannot be
    said with nodeSelector entries the engine reads the same way)."""
    labels: dict[str, str] = {}
    selector: dict[str, str] = {}
    for axis, token in zip(policy.axes, tokens, strict=True):
        if token.label:
            labels[axis.label] = token.label
        if token.selected is None:
            continue
        if len(token.selected) == 1:
            own = axis.values[token.selected[0]].node_selector
            if not own:
                return None
            for k, v in own.items():
                if selector.get(k, v) != v:
                    return None
                selector[k] = v
        elif not token.selected:
            key = sorted(axis.keys)[0] if axis.keys else None
            if key is None:
                return None
            selector[key] = "gpu-webhook-native-no-such-value"
        else:
            return None  # several values admitted: said only by affinity; such Pods are deferred
    pod: Json = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "native-table", "namespace": namespace, "labels": labels},
                 "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]}}
    if selector:
        pod["spec"]["nodeSelector"] = selector
    return pod


def _probe_resource(policy: Policy) -> str:
    for resource in policy.resources:
        if resource.classes and not resource.valid_for and "*" not in resource.pattern and "?" not in resource.pattern:
            return resource.pattern
    raise NativeError("no exact GPU resource name placed by the classes (gpuResources without validFor or "
                      "classes: false); native mode needs one, e.g. nvidia.com/gpu: {}")


def _templated(message: str, pod: Json, limiting: str | None) -> tuple[str, str]:
    """Paths, selection and `validFor` resource of the synthetic Pod as placeholders the CEL fills in for the
    real Pod or template; and the axis whose selection the message quotes ("" none)."""
    if limiting is not None:
        message = message.replace("spec.containers[0] (c)", "{limitWhere}").replace(limiting, "{limitResource}")
    quoted = ""
    for k, v in (pod["spec"].get("nodeSelector") or {}).items():
        said = f"spec.nodeSelector[{k}]={v}"
        if said in message:
            message = message.replace(said, "{selection}")
            quoted = k
    message = message.replace("metadata.labels[", "{meta}.labels[")
    message = message.replace("spec.nodeSelector[", "{spec}.nodeSelector[")
    return message, quoted


def _plan_of(verdict: Verdict, policy: Policy, pod: Json, limiting: str | None) -> Json:
    """What the engine's verdict on a synthetic Pod means for any Pod with the same tokens."""
    findings = []
    for finding in (*verdict.violations, *verdict.warnings):
        message, key = _templated(finding.message, pod, limiting)
        axis = next((a.name for a in policy.axes if key in a.keys), "")
        findings.append({"rule": finding.rule, "message": message, "axis": axis})
    plan: Json = {"findings": findings}
    if verdict.classes:
        chosen = verdict.classes[0]
        plan["className"] = getattr(chosen, "name", "")
        caps = [(c.max_gpus_per_pod, f"{p.axis.name} {p.value}") for p in getattr(chosen, "picks", ())
                if (c := p.axis.values[p.value]).max_gpus_per_pod]
        if caps:
            plan["maxGPUs"], plan["maxGPUsSource"] = min(caps)
        required = [{"field": k, "value": v, "source": f"{p.axis.name} {p.value}"}
                    for p in getattr(chosen, "picks", ()) for k, v in class_edits.class_fields(p.axis.values[p.value])]
        if required:
            plan["required"] = required
    selector: dict[str, str] = {}
    tolerations: list[Json] = []
    for edit in verdict.edits:
        if edit.path == ("spec", "nodeSelector") and edit.kind == "set":
            selector[str(edit.key)] = str(edit.value)
        elif edit.path == ("spec", "tolerations") and edit.kind == "append":
            tolerations.append(dict(edit.value))
        elif edit.path == ("spec",) and edit.kind == "set" and edit.key in ("runtimeClassName", "priorityClassName",
                                                                            "schedulerName"):
            plan[str(edit.key)] = edit.value
        elif edit.path == ("spec", "affinity") and edit.key == "nodeAffinity":
            raise NativeError("a class value sets affinity.nodeAffinity; the native policies do not inject node "
                              "affinity yet: use nodeSelector for the class, or deploy in webhook mode")
        elif edit.path == ("metadata", "labels") and edit.kind == "set":
            plan.setdefault("labels", {})[str(edit.key)] = str(edit.value)
        elif edit.path == ("metadata", "annotations") and edit.kind == "set" and edit.key not in (
                engine.CLASS_ANNOTATION, engine.RULES_ANNOTATION):
            plan.setdefault("annotations", {})[str(edit.key)] = str(edit.value)
    if selector:
        plan["nodeSelector"] = selector
    if tolerations:
        plan["tolerations"] = tolerations
    return plan


def params(policy: Policy) -> Json:
    """The `GPUClassMap` spec: the rules as data for the policies' CEL."""
    if policy.mutate_templates:
        raise NativeError("templates.mutate is true, but the native policies inject into Pods only (pod templates "
                          "are validated); set templates.mutate: false, or deploy in webhook mode")
    namespaces = {"*": None, **{f"ns:{name}": name for name in policy.namespaces}}
    # The resource the synthetic Pod asks for: the placed one, or one of each validFor family (a name of its
    # glob that no earlier family claims); Pods asking for two validFor families are not in the table.
    limiting: list[tuple[str, GPUResource | None]] = [(_probe_resource(policy), None)]
    for resource in policy.resources:
        name = resource.pattern.replace("*", "x").replace("?", "x")
        if resource.valid_for and resource.classes and policy.gpu_resource(name) is resource:
            limiting.append((name, resource))
    combos = len(limiting)
    token_lists = [_tokens(axis) for axis in policy.axes]
    for tokens in token_lists:
        combos *= len(tokens)
    if combos * len(namespaces) > MAX_TABLE:
        raise NativeError(f"the class table would have {combos * len(namespaces)} entries (axes x values x "
                          f"namespaces), more than {MAX_TABLE}; deploy in webhook mode, or use fewer values")
    table: dict[str, str] = {}
    plans: dict[str, Json] = {}
    digests: dict[str, str] = {}
    for ns_id, ns_name in namespaces.items():
        namespace = ns_name or "gpu-webhook-native-any-namespace"
        for (resource_name, bound), combo in itertools.product(limiting, itertools.product(*token_lists)):
            pod = _synthetic_pod(policy, namespace, combo, resource_name)
            if pod is None:
                continue
            verdict = engine.evaluate(policy, pod, engine.Context(namespace))
            plan = _plan_of(verdict, policy, pod, resource_name if bound else None)
            if ns_name is None:
                plan["findings"] = [{**f, "message": f["message"].replace(namespace, "{namespace}")}
                                    for f in plan["findings"]]
            text = json.dumps(plan, sort_keys=True)
            plan_id = digests.setdefault(text, f"p{len(digests)}")
            plans[plan_id] = plan
            table["#".join([ns_id, *(f"{t.key()}/{_limit_token(axis, bound)}"
                                     for axis, t in zip(policy.axes, combo, strict=True))])] = plan_id
    by_name = {a.name: a for a in policy.axes}
    exact = {**{IMPLICIT_PREFIX + c: "placed" if rule.classes else "checked"
                for c, rule in policy.dra.device_classes.items()},
             **{r.pattern: _kind(r) for r in policy.resources if not _is_pattern(r.pattern)}}
    globs = [{"regex": _resource_regex(r.pattern), "kind": _kind(r)} for r in policy.resources
             if _is_pattern(r.pattern)]
    # A glob family does not hold the exact names listed before it (`webhook.policy.resources.ordered`).
    families: list[Json] = [{"regex": _resource_regex(r.pattern),
                              "values": {a: [v for v in by_name[a].values if v in vs]
                                         for a, vs in r.valid_for.items()},
                              "shadowed": [e.pattern for e in policy.resources if not _is_pattern(e.pattern)
                                           and _is_pattern(r.pattern) and r.matches(e.pattern)]}
                             for r in policy.resources if r.valid_for and r.classes]
    aliases = {
        f"{axis.name}|{value}|{key}": _regex(found)
        for axis in policy.axes for value, contribution in axis.values.items()
        for key, found in contribution.aliases.items()
    }
    return {
        "rulesDigest": policy.digest,
        "exemptNamespaces": sorted(policy.exempt_namespaces),
        "axes": [{"name": a.name, "label": a.label, "values": list(a.values), "keys": sorted(a.keys)}
                 for a in policy.axes],
        "aliases": aliases,
        "namespaces": {name: f"ns:{name}" for name in policy.namespaces},
        "table": table,
        "plans": plans,
        "resources": [{"name": r.pattern, "regex": _resource_regex(r.pattern),
                       "maxPerContainer": r.max_per_container or 0, "reason": r.reason or "",
                       "classes": r.classes, "validFor": bool(r.valid_for)} for r in policy.resources],
        "gpuExact": exact,
        "gpuGlobs": globs,
        "validFor": families,
        # Names whose answer is known without a regex (the CEL compiles a pattern from params on every call).
        "notGPU": [n for n in native_cel.CORE_RESOURCES if not any(re.search(g["regex"], n) for g in globs)],
        "notFamily": [n for n in sorted({*exact, *native_cel.CORE_RESOURCES})
                      if not any(re.search(f["regex"], n) and n not in f["shadowed"] for f in families)],
        "uncapped": [n for n in sorted({*exact, *native_cel.CORE_RESOURCES})
                     if not any(r.max_per_container and re.search(_resource_regex(r.pattern), n)
                                for r in policy.resources)],
        "levels": _levels(policy, table, plans, list(namespaces)),
        "ownSel": _own_selectors(policy, aliases),
        "gpuRuntimeClasses": sorted(policy.gpu_runtime_classes),
        "gpuTaintKeys": sorted(policy.gpu_taint_keys),
        "enforcement": {rule: policy.enforcement_of(rule) for rule in RULES},
    }


def _own_selectors(policy: Policy, aliases: dict[str, str]) -> dict[str, str]:
    """`axis|key=value` -> the axis value, for each entry of a value's own nodeSelector that admits that value alone
    through the aliases: what the MAP injects, read back by the validating policies without a regex."""
    out = {}
    for axis in policy.axes:
        for name, contribution in axis.values.items():
            for key, value in contribution.node_selector.items():
                admitted = {v for v in axis.values if (pattern := aliases.get(f"{axis.name}|{v}|{key}")) is not None
                            and re.fullmatch(pattern, value)}
                if admitted == {name}:
                    out[f"{axis.name}|{key}={value}"] = name
    return out


def _levels(policy: Policy, table: dict[str, str], plans: dict[str, Json], namespaces: Sequence[str]) -> Json:
    """The enforcement levels of each group of rules (`native_cel.level_guard`), and `plain`: the levels of the
    selection rules' findings in the table entries of the Pods that say at most one value per axis, in agreement
    (no label or a value's, no selection or one value's; `native_cel._plainly_placed`), in any namespace."""
    always = [r for r in native_cel.GPU_RULES if r not in (*native_cel.SELECTION_RULES, *native_cel.NODE_NAME_RULES)]
    groups = (("gpu", native_cel.GPU_RULES), ("unaccounted", native_cel.UNACCOUNTED_RULES), ("gpuAlways", always),
              ("selection", native_cel.SELECTION_RULES), ("nodeName", native_cel.NODE_NAME_RULES))
    out = {group: sorted({policy.enforcement_of(r) for r in rules} - {"off"}) for group, rules in groups}
    per_axis = [["=*/*", *(f"={v}/*" for v in axis.values), *(f"{v}=*/*" for v in axis.values),
                 *(f"{v}={v}/*" for v in axis.values)] for axis in policy.axes]
    found = {policy.enforcement_of(f["rule"]) for ns_id in namespaces for tokens in itertools.product(*per_axis)
             if (plan_id := table.get("#".join([ns_id, *tokens]))) is not None for f in plans[plan_id]["findings"]
             if f["rule"] in native_cel.SELECTION_RULES}
    out["plain"] = sorted(found - {"off"})
    return out


# --------------------------------------------------------------------------------------------- objects


def _bounded_string(max_length: int = 253) -> Json:
    return {"type": "string", "maxLength": max_length}


def _string_map(max_properties: int, max_length: int = 253) -> Json:
    return {"type": "object", "maxProperties": max_properties, "additionalProperties": _bounded_string(max_length)}


_TOLERATION = {"type": "object", "properties": {
    "key": _bounded_string(), "operator": _bounded_string(16), "value": _bounded_string(63),
    "effect": _bounded_string(32), "tolerationSeconds": {"type": "integer"}}}
_FINDING = {"type": "object", "required": ["rule", "message"],
            "properties": {"rule": _bounded_string(63), "message": _bounded_string(2048), "axis": _bounded_string(63)}}
_PLAN = {"type": "object", "properties": {
    "className": _bounded_string(512), "nodeSelector": _string_map(32, 63),
    "tolerations": {"type": "array", "maxItems": 32, "items": _TOLERATION},
    "runtimeClassName": _bounded_string(), "priorityClassName": _bounded_string(), "schedulerName": _bounded_string(),
    "labels": _string_map(32, 63), "annotations": _string_map(32, 512),
    "maxGPUs": {"type": "integer"}, "maxGPUsSource": _bounded_string(),
    "required": {"type": "array", "maxItems": 8, "items": {"type": "object", "properties": {
        "field": _bounded_string(32), "value": _bounded_string(), "source": _bounded_string()}}},
    "findings": {"type": "array", "maxItems": 16, "items": _FINDING}}}


def _applied_map(schema: Json) -> Json:
    """A map of the params that `params()` always sets, defaulted to `{}`. Server-side apply (Helm 4's upgrade,
    Flux, `kubectl apply --server-side`) of an empty map over one with keys removes the keys and leaves null,
    which the type `object` refuses ("must be of type object: null"); the API server prunes that null and
    applies the default instead."""
    return {**schema, "default": {}}


def crd() -> Json:
    """The CustomResourceDefinition of the params, with the bounds the CEL cost estimation relies on."""
    spec_schema = {"type": "object", "properties": {
        "rulesDigest": _bounded_string(64),
        "exemptNamespaces": {"type": "array", "maxItems": 256, "items": _bounded_string(63)},
        "axes": {"type": "array", "maxItems": 8, "items": {"type": "object", "properties": {
            "name": _bounded_string(63), "label": _bounded_string(),
            "values": {"type": "array", "maxItems": 32, "items": _bounded_string(63)},
            "keys": {"type": "array", "maxItems": 64, "items": _bounded_string()}}}},
        "aliases": _applied_map(_string_map(4096, 4096)),
        "namespaces": _applied_map(_string_map(1024, 70)),
        "table": _applied_map(_string_map(MAX_TABLE, 16)),
        "plans": _applied_map({"type": "object", "maxProperties": 1024, "additionalProperties": _PLAN}),
        "resources": {"type": "array", "maxItems": 64, "items": {"type": "object", "properties": {
            "name": _bounded_string(), "regex": _bounded_string(1024),
            "maxPerContainer": {"type": "integer"}, "reason": _bounded_string(512),
            "classes": {"type": "boolean"}, "validFor": {"type": "boolean"}}}},
        "validFor": {"type": "array", "maxItems": 16, "items": {"type": "object", "properties": {
            "regex": _bounded_string(1024), "values": {"type": "object", "maxProperties": 8, "additionalProperties": {
                "type": "array", "maxItems": 32, "items": _bounded_string(63)}},
            "shadowed": {"type": "array", "maxItems": 64, "items": _bounded_string()}}}},
        "gpuExact": _applied_map(_string_map(256, 16)),
        "gpuGlobs": {"type": "array", "maxItems": 64, "items": {"type": "object", "properties": {
            "regex": _bounded_string(1024), "kind": _bounded_string(16)}}},
        "notGPU": {"type": "array", "maxItems": 8, "items": _bounded_string()},
        "notFamily": {"type": "array", "maxItems": 512, "items": _bounded_string()},
        "uncapped": {"type": "array", "maxItems": 512, "items": _bounded_string()},
        "ownSel": _applied_map(_string_map(1024, 63)),
        "levels": {"type": "object", "properties": {
            group: {"type": "array", "maxItems": 2, "items": _bounded_string(8)}
            for group in ("gpu", "unaccounted", "gpuAlways", "selection", "nodeName", "plain")}},
        "gpuRuntimeClasses": {"type": "array", "maxItems": 64, "items": _bounded_string()},
        "gpuTaintKeys": {"type": "array", "maxItems": 64, "items": _bounded_string()},
        "enforcement": _applied_map(_string_map(64, 8)),
    }}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PARAMS_PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP, "scope": "Cluster",
            "names": {"kind": PARAMS_KIND, "plural": PARAMS_PLURAL, "singular": "gpuclassmap", "listKind":
                      f"{PARAMS_KIND}List"},
            "versions": [{"name": PARAMS_VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object", "description": "gpu-webhook's rules as data for its admission policies "
                "(rendered by `gpu-webhook policies render`; do not edit by hand)",
                "properties": {"spec": spec_schema}}}}],
        },
    }


def params_object(policy: Policy) -> Json:
    return {"apiVersion": f"{GROUP}/{PARAMS_VERSION}", "kind": PARAMS_KIND,
            "metadata": {"name": PARAMS_NAME, "labels": {"app.kubernetes.io/name": "gpu-webhook"}},
            "spec": params(policy)}


def hybrid_match_conditions(policy: Policy) -> list[Json]:
    """The matchConditions that narrow the *mutating* webhook, in hybrid mode, to the Pods native mode defers (and
    anything not a Pod, as DRA claims and templates):
    required node affinity on a Pod that may ask for a GPU (a resource other than cpu, memory, ephemeral-storage,
    hugepages-*, or DRA claims: the engine leaves any other Pod unplaced), or a GPU resource with `validFor`
    (compiled from the rules: a webhook's match conditions cannot read params)."""
    patterns = [_resource_regex(r.pattern) for r in policy.resources if r.valid_for]
    resources = " || ".join(f"r.matches(r'{p}')" for p in patterns) or "false"  # CEL raw strings
    deferred = (
        # Not a Pod (a DRA claim or template, placed by the webhook alone): always sent; CEL's `||` is true when
        # either side is, so the Pod fields below, absent from a claim, are not an error then.
        "request.resource.resource != 'pods' || "
        "(has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
        "has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) && "
        f"({native_cel.resources_guard('object.spec')})) || "
        "(object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])).exists(c, "
        f"has(c.resources) && has(c.resources.limits) && c.resources.limits.exists(r, {resources}))")
    return [{"name": "deferred-by-native-mode", "expression": deferred}]


def hybrid_validating_conditions() -> list[Json]:
    """The matchCondition that narrows the *validating* webhook in hybrid mode to what the policies cannot judge
    alone: GPU Pods and workloads (the rules that need the live cluster), Pods with DRA claims, and DRA claims.
    A Pod or workload that asks for no resource that may be a GPU is the policies' alone (its only rules are the
    three *-without-request warnings), so it never makes the hop. The same for every rule set."""
    return [native_cel.webhook_guard()]


def render(policy: Policy, mode: Mode = "native") -> list[Json]:
    """Every object of native (or hybrid) mode, in apply order: CRD, params, policies, bindings."""
    return [crd(), params_object(policy), *native_cel.policies()]
