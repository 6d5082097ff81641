"""The rule-file model: already-read YAML text in, one frozen `Policy` out.

A rule directory holds one or more files, each with one or more `GPUPolicy` documents. Each document is
validated on its own against the published JSON Schema (`webhook/schema/gpu-policy.schema.json`), so an
error names the file, the document, the line and the field. Documents are then merged in file-name order,
then document order:

- maps merge key by key, at every depth (axes, axis values, namespaces, gpuResources, enforcement, ...);
- lists of strings (exemptNamespaces, gpuRuntimeClasses, allowed values) are unioned, first seen first;
- any other value defined twice must be equal: two documents that disagree are refused, naming both.

So the result never depends on which of two conflicting files happens to be read last.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib.resources import files
from typing import Any, cast

import jsonschema
import yaml

from webhook.policy.dra_rules import DRARules, NamespaceDRA, check_selectors, dra_rules, namespace_dra
from webhook.policy.findings import Enforcement
from webhook.policy.manifests_io import yaml_documents
from webhook.policy.pods import render_path
from webhook.policy.resources import GPUResource, find, ordered
from webhook.policy.resources import check as check_resources
from webhook.policy.usage import UsageRules, usage_rules

API_VERSION = "gpu-webhook.io/v1alpha1"
KIND = "GPUPolicy"
ANNOTATION_PREFIX = "gpu-webhook.io/"

# Every check the engine makes: stable id -> (default enforcement, what it guards).
RULES: dict[str, tuple[Enforcement, str]] = {
    "gpu-limits-required": ("deny", "a GPU is in requests but not in limits"),
    "gpu-requests-equal-limits": ("deny", "GPU requests differ from limits"),
    "gpu-whole-number": ("deny", "a GPU quantity is not a whole number"),
    "gpu-quantity-invalid": ("deny", "a GPU quantity is negative or not a quantity"),
    "gpu-pod-level-resources": ("deny", "GPUs in pod-level spec.resources"),
    "gpu-per-container-max": ("deny", "more of a GPU resource in one container than it allows"),
    "gpu-class-max": ("deny", "more GPUs in the Pod than its class allows"),
    "gpu-class-unknown": ("deny", "a class label value the rules do not define"),
    "gpu-class-not-allowed": ("deny", "a class the namespace may not use"),
    "gpu-class-conflict": ("deny", "a class label, or the class, contradicts the Pod's own selection, GPU resource "
                                   "or runtimeClassName"),
    "gpu-class-skipped": ("warn", "a class axis left out: the Pod selects a GPU no value covers, or the value "
                                  "would leave it no node"),
    "gpu-class-missing": ("deny", "a GPU Pod at /validate lacks what its class requires"),
    "gpu-env-without-request": ("warn", "NVIDIA_VISIBLE_DEVICES set without a GPU request"),
    "gpu-runtime-without-request": ("warn", "a GPU runtime class without a GPU request"),
    "gpu-toleration-without-request": ("warn", "the GPU taint is tolerated without a GPU request"),
    "gpu-node-name-preset": ("warn", "a GPU Pod with spec.nodeName set bypasses the scheduler"),
    "gpu-never-schedulable": ("deny", "no Ready node of the Pod's class could ever hold its GPU request"),
    "gpu-time-sliced-max": ("deny", "more than 1 of a GPU resource in a container where every node the Pod can "
                                    "land on shares its GPUs by time-slicing or MPS"),
    "gpu-class-no-node": ("warn", "the class's nodeSelector matches no node advertising the requested GPU"),
    "gpu-runtime-class-missing": ("warn", "the default runtime class is missing or contradicts the class"),
    "gpu-inventory-unavailable": ("warn", "cluster inventory not synced: inventory checks skipped"),
    # DRA (resource.k8s.io ResourceClaims, ResourceClaimTemplates and the Pods that use them): docs/dra.md
    "dra-claim-max": ("deny", "more GPU devices in a claim request, or a claim, than its class, DeviceClass or "
                              "namespace allows"),
    "dra-pod-max": ("deny", "more GPU devices over a Pod's claims than its class, DeviceClass or namespace allows"),
    "dra-allocation-all": ("deny", "allocationMode: All (every GPU of a node) on a GPU DeviceClass where the rules "
                                   "do not allow it"),
    "dra-admin-access": ("deny", "adminAccess: true on a GPU DeviceClass outside the exempt and admin-access "
                                 "namespaces"),
    "dra-class-not-allowed": ("deny", "a GPU DeviceClass the namespace may not use"),
    "dra-selector-conflict": ("deny", "a claim's selector is another class value's selector, not its own class's"),
    "dra-double-allocation": ("deny", "a Pod asks for a GPU extended resource and also claims a GPU DeviceClass"),
    "dra-unsatisfiable": ("warn", "a GPU request of a claim or template that no node's devices can satisfy (its "
                                  "DeviceClass's selectors and its own, or a DeviceClass that does not exist)"),
}


class RuleError(ValueError):
    """A rule file that cannot be used; the message names the file, the document, the field and the fix."""


@dataclass(frozen=True)
class LabelValues:
    """The values one node label key has on the nodes of an axis value: literals and `*`/`?` globs, compiled
    once when the rules load. `certain`: every node of the value carries the key (the value's own
    nodeSelector); an alias key may be missing on some of its nodes (a GKE node has no Karpenter label)."""

    key: str
    patterns: tuple[str, ...]
    certain: bool = False
    literals: frozenset[str] = frozenset()
    globs: re.Pattern[str] | None = None
    expressions: tuple[Expression, ...] = ()  # the value's matchExpressions on the key (then no patterns)

    @classmethod
    def of(cls, key: str, patterns: Sequence[str], certain: bool = False) -> LabelValues:
        literals = frozenset(p for p in patterns if not _is_glob(p))
        globbed = [fnmatch.translate(p) for p in patterns if _is_glob(p)]
        return cls(key, tuple(patterns), certain, literals, re.compile("|".join(globbed)) if globbed else None)

    @classmethod
    def of_expressions(cls, key: str, expressions: Sequence[Expression]) -> LabelValues:
        """The key's values on the nodes a value's matchExpressions select: its `In` values when it lists some
        (every node of the value then carries one of them), else whatever the expressions admit."""
        listed = [frozenset(e.values) for e in expressions if e.operator == "In"]
        literals = frozenset.intersection(*listed) if listed else frozenset()
        certain = any(e.operator in ("In", "Exists", "Gt", "Lt") for e in expressions)
        return cls(key, (), certain, literals, None, tuple(expressions))

    def matches(self, value: str) -> bool:
        """A literal or glob of the key's patterns (a value placed by expressions: `webhook.policy.selection`)."""
        return value in self.literals or (self.globs is not None and self.globs.match(value) is not None)


def _is_glob(pattern: str) -> bool:
    return "*" in pattern or "?" in pattern


@dataclass(frozen=True)
class Expression:
    """One node selector requirement (`key operator values`) of a class value's `matchExpressions`."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()

    def to_api(self) -> dict[str, Any]:
        """As a Pod's nodeSelectorTerms hold it (no `values` for Exists and DoesNotExist)."""
        found: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.operator not in ("Exists", "DoesNotExist"):
            found["values"] = list(self.values)
        return found

    def __str__(self) -> str:
        return f"{self.key} {self.operator}{' [' + ', '.join(self.values) + ']' if self.values else ''}"


@dataclass(frozen=True)
class Contribution:
    """What a class axis value (or every GPU Pod, for `common`) adds to a Pod. Treat as read-only."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_affinity: Mapping[str, Any] | None = None
    match_expressions: tuple[Expression, ...] = ()  # added to every nodeSelectorTerm of the Pod
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    max_gpus_per_pod: int | None = None
    aliases: Mapping[str, LabelValues] = field(default_factory=dict)  # node label key -> values (own selector too)
    defaults: Mapping[str, str] = field(default_factory=dict)  # other axis -> its default when this value is chosen
    device_selectors: Mapping[str, str] = field(default_factory=dict)  # GPU DeviceClass -> CEL meaning this value


@dataclass(frozen=True)
class Axis:
    """One dimension of the class map: the Pod label that picks it, its default and its values.

    `keys` are the node label keys that say which value a node is (`nodeLabels`, every value's aliases and
    nodeSelector keys): a Pod whose own selection constrains one of them has chosen, or excluded, values.
    """

    name: str
    label: str
    default: str | None
    values: Mapping[str, Contribution]
    keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class NamespacePolicy:
    """A namespace's default class values and the values it may use, by axis name.

    `match_labels` is set for a policy chosen by namespace labels (`namespaceSelectors`) and names it there.
    """

    defaults: Mapping[str, str] = field(default_factory=dict)
    allowed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    match_labels: Mapping[str, str] = field(default_factory=dict)
    name: str = ""
    dra: NamespaceDRA = field(default_factory=NamespaceDRA)


@dataclass(frozen=True)
class Policy:
    """The merged, validated rules. Built only by `parse_sources`; never changed afterwards."""

    resources: tuple[GPUResource, ...]
    axes: tuple[Axis, ...]
    common: Contribution
    namespaces: Mapping[str, NamespacePolicy]
    namespace_selectors: tuple[NamespacePolicy, ...]
    exempt_namespaces: frozenset[str]
    gpu_runtime_classes: frozenset[str]
    gpu_device_classes: frozenset[str]
    enforcement: Mapping[str, Enforcement]
    mutate_templates: bool
    digest: str
    sources: tuple[str, ...] = ()
    usage: UsageRules = field(default_factory=UsageRules)  # `spec.usage`: what `gpu-webhook usage` calls idle
    dra: DRARules = field(default_factory=DRARules)  # GPU DeviceClasses and what claims may ask (`spec.dra`)
    _resource_cache: dict[str, GPUResource | None] = field(default_factory=dict, compare=False, repr=False)
    plans: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # the engine's per-class memo
    # The engine's memo of the class of a Pod that says nothing about it (no class label, no node selection, no
    # resource bound to a value), by namespace: (the namespace's NamespacePolicy, the class).
    plain_classes: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # The engine's memo of what a class adds to a pod spec (`class_edits.class_changes`), by class and spec shape.
    class_changes: dict[tuple[Any, ...], Any] = field(default_factory=dict, compare=False, repr=False)

    def namespace_policy(self, namespace: str, labels: Mapping[str, str] | None = None) -> NamespacePolicy | None:
        """The policy of a namespace: its entry by name, else the first selector its labels match."""
        named = self.namespaces.get(namespace)
        if named is not None or not labels:
            return named
        for selector in self.namespace_selectors:
            if all(labels.get(k) == v for k, v in selector.match_labels.items()):
                return selector
        return None

    def enforcement_of(self, rule: str) -> Enforcement:
        return self.enforcement.get(rule, RULES[rule][0])

    def gpu_resource(self, name: str) -> GPUResource | None:
        """The GPU family entry for a resource name, or None when the name is not a GPU (memoised per name):
        `gpuResources`, and the names GPU DeviceClasses serve (`webhook.policy.resources`)."""
        try:
            return self._resource_cache[name]
        except KeyError:
            found = find(self.resources, self.dra, name)
            if len(self._resource_cache) < 4096:
                self._resource_cache[name] = found
            return found

    @cached_property
    def gpu_taint_keys(self) -> frozenset[str]:
        """Taint keys that mark GPU nodes: the common tolerations' keys and the exact GPU resource names
        (computed once per Policy: every Pod without GPUs is checked against them)."""
        keys = {str(t.get("key")) for t in self.common.tolerations if t.get("key")}
        keys.update(r.pattern for r in self.resources if "*" not in r.pattern)
        return frozenset(keys)


@cache
def schema() -> dict[str, Any]:
    """The published JSON Schema of one rule document."""
    text = files("webhook").joinpath("schema/gpu-policy.schema.json").read_text()
    return cast(dict[str, Any], json.loads(text))


@cache
def _validator() -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema())
    validator: jsonschema.protocols.Validator = cls(schema())
    return validator


# --------------------------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class _Doc:
    file: str
    index: int
    name: str
    body: Mapping[str, Any]
    node: yaml.Node | None

    def where(self) -> str:
        named = f' (GPUPolicy "{self.name}")' if self.name else ""
        return f"{self.file}: document {self.index}{named}"

    def line_of(self, path: Sequence[str | int]) -> int | None:
        return _line_of(self.node, path)


def parse_sources(sources: Sequence[tuple[str, str]]) -> Policy:
    """Parse [(file name, YAML text)] into one merged Policy, or raise RuleError naming file/document/field."""
    docs: list[_Doc] = []
    for name, text in sorted(sources, key=lambda s: s[0]):
        docs.extend(_read_file(name, text))
    if not docs:
        raise RuleError("no GPUPolicy documents found: add a rule file (see rules/gpu-policy.yaml)")
    merged, origin = _merge(docs)
    return _build(merged, origin, tuple(d.file for d in docs))


def _read_file(name: str, text: str) -> list[_Doc]:
    try:
        documents = list(yaml_documents(text))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RuleError(f"{name}:{line}: not valid YAML: {problem}; fix the syntax (safe YAML only, no tags)") from None
    docs = []
    for index, (node, body) in enumerate(documents, start=1):
        if body is None:
            continue
        meta = body.get("metadata") if isinstance(body, dict) else None
        doc_name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
        doc = _Doc(name, index, doc_name, body, node)
        _check_schema(doc)
        docs.append(doc)
    return docs


def _check_schema(doc: _Doc) -> None:
    errors = sorted(_validator().iter_errors(doc.body), key=lambda e: (len(e.absolute_path), list(map(str, e.path))))
    if not errors:
        return
    lines = [_describe(doc, err) for err in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    raise RuleError("; ".join(lines) + more)


def _describe(doc: _Doc, err: jsonschema.ValidationError) -> str:
    path = list(err.absolute_path)
    line = doc.line_of(path)
    at = f" line {line}" if line else ""
    field_name = render_path(path) or "(document)"
    expected = _expectation(err)
    return f"{doc.where()}{at}: {field_name}: {expected}"


def _expectation(err: jsonschema.ValidationError) -> str:
    """What the schema wanted, in words a platform engineer can act on."""
    validator, value = err.validator, cast(Any, err.validator_value)
    if validator == "additionalProperties" and isinstance(err.instance, dict) and isinstance(err.schema, dict):
        allowed = sorted(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in allowed]
        hints = []
        for key in extra:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hints.append(f'"{key}"' + (f' (did you mean "{close[0]}"?)' if close else ""))
        return f"unknown field {', '.join(hints)}; allowed fields: {', '.join(allowed)}"
    if validator == "required":
        return f"{err.message}; add it"
    if validator == "const":
        return f"must be {value!r}, got {err.instance!r}"
    if validator == "enum":
        return f"must be one of {', '.join(map(repr, value))}, got {err.instance!r}"
    if validator == "type":
        return f"expected {value if isinstance(value, str) else ' or '.join(value)}, got {_json_type(err.instance)}"
    if validator == "pattern" and "glob" in str(cast(Mapping[str, Any], err.schema).get("description", "")):
        return (f"{err.instance!r} is not a label value or a glob of one: letters, digits, '-', '_', '.', with * "
                "for any run of characters and ? for one; it starts and ends with one of those")
    if validator == "pattern":
        return f"{err.instance!r} is not a valid name here (Kubernetes label/DNS syntax: letters, digits, '-', '.')"
    if validator == "minimum":
        return f"must be at least {value}, got {err.instance!r}"
    return err.message


def _json_type(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__) + f" ({value!r})"[:60]


def _line_of(node: yaml.Node | None, path: Sequence[str | int]) -> int | None:
    """The 1-based line of the value at `path` (or its nearest existing parent) in a composed YAML node."""
    if node is None:
        return None
    for step in path:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if getattr(k, "value", None) == str(step)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            child = node.value[step]
        if child is None:
            break
        node = child
    return int(node.start_mark.line) + 1


# --------------------------------------------------------------------------------------------- merging

_Origin = dict[tuple[str, ...], _Doc]


def _merge(docs: Sequence[_Doc]) -> tuple[dict[str, Any], _Origin]:
    merged: dict[str, Any] = {}
    origin: _Origin = {}
    for doc in docs:
        _merge_into(merged, dict(doc.body.get("spec") or {}), ("spec",), doc, origin)
    return merged, origin


def _merge_into(target: dict[str, Any], incoming: Mapping[str, Any], path: tuple[str, ...], doc: _Doc,
                origin: _Origin) -> None:
    for key, value in incoming.items():
        here = (*path, str(key))
        if key not in target:
            target[key] = json.loads(json.dumps(value))
            _record_origin(target[key], here, doc, origin)
        elif isinstance(target[key], dict) and isinstance(value, dict):
            _merge_into(target[key], value, here, doc, origin)
        elif isinstance(target[key], list) and isinstance(value, list) and all(isinstance(v, str) for v in value):
            target[key].extend(v for v in value if v not in target[key])
        elif target[key] != value:
            first = origin.get(here)
            where = first.where() if first else "an earlier document"
            raise RuleError(
                f"{doc.where()} line {doc.line_of(here) or '?'}: {render_path(here)} is {value!r} here but "
                f"{target[key]!r} in {where}; define it once, or make both the same"
            )


def _record_origin(value: Any, path: tuple[str, ...], doc: _Doc, origin: _Origin) -> None:
    """Remember which document defined `path` and every key below it (to name it in a conflict)."""
    origin.setdefault(path, doc)
    if isinstance(value, dict):
        for key, child in value.items():
            _record_origin(child, (*path, str(key)), doc, origin)


# --------------------------------------------------------------------------------------------- building


def _build(spec: Mapping[str, Any], origin: _Origin, sources: tuple[str, ...]) -> Policy:
    def fail(path: tuple[str, ...], problem: str) -> RuleError:
        probe = path
        while probe and probe not in origin:
            probe = probe[:-1]
        doc = origin.get(probe)
        where = f"{doc.where()} line {doc.line_of(path) or '?'}" if doc else "rules"
        return RuleError(f"{where}: {render_path(path)}: {problem}")

    classes = spec.get("classes") or {}
    dra = dra_rules(spec, fail)
    axes = tuple(_axis(name, body) for name, body in (classes.get("axes") or {}).items())
    by_name = {a.name: a for a in axes}
    for axis in axes:
        base = ("spec", "classes", "axes", axis.name)
        if axis.default is not None and axis.default not in axis.values:
            raise fail((*base, "default"), f'"{axis.default}" is not one of the values: {", ".join(axis.values)}')
        raw_values = ((classes.get("axes") or {}).get(axis.name) or {}).get("values") or {}
        for value, contribution in axis.values.items():
            raw = raw_values.get(value) or {}
            for key in sorted(set(raw.get("aliases") or ()) & set(raw.get("nodeSelector") or ())):
                raise fail((*base, "values", value, "aliases", key),
                           f'"{key}" is already this value\'s nodeSelector key; an alias names other keys: remove it')
            _check_expressions(raw, (*base, "values", value), fail)
            check_selectors(contribution.device_selectors, dra, (*base, "values", value), fail)
            for other, chosen in contribution.defaults.items():
                target = by_name.get(other)
                where: tuple[str, ...] = (*base, "values", value, "defaults", other)
                if target is None or target is axis:
                    raise fail(where, f'"{other}" is not another class axis; axes are: {", ".join(by_name)}')
                if chosen not in target.values:
                    raise fail(where, f'"{chosen}" is not a {other} value; choose from {", ".join(target.values)}')

    def namespace_entry(base: tuple[str, ...], body: Mapping[str, Any], name: str) -> NamespacePolicy:
        for part in ("defaults", "allowed"):
            for axis_name, chosen in (body.get(part) or {}).items():
                found = by_name.get(axis_name)
                if found is None:
                    raise fail((*base, part, axis_name),
                               f'no class axis "{axis_name}"; axes are: {", ".join(by_name) or "(none)"}')
                for value in [chosen] if isinstance(chosen, str) else chosen:
                    if value not in found.values:
                        raise fail((*base, part, axis_name),
                                   f'"{value}" is not a {axis_name} value; choose from {", ".join(found.values)}')
        return NamespacePolicy(
            defaults=dict(body.get("defaults") or {}),
            allowed={k: tuple(v) for k, v in (body.get("allowed") or {}).items()},
            match_labels=dict(body.get("matchLabels") or {}),
            name=name,
            dra=namespace_dra(body, dra, base, fail),
        )

    namespaces = {
        ns: namespace_entry(("spec", "namespaces", ns), body, ns)
        for ns, body in (spec.get("namespaces") or {}).items()
    }
    selectors = tuple(
        namespace_entry(("spec", "namespaceSelectors", name), body, name)
        for name, body in sorted((spec.get("namespaceSelectors") or {}).items())
    )

    enforcement: dict[str, Enforcement] = {}
    for rule, level in (spec.get("enforcement") or {}).items():
        if rule not in RULES:
            close = difflib.get_close_matches(rule, RULES, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else f"; rule ids are: {', '.join(RULES)}"
            raise fail(("spec", "enforcement", rule), f'unknown rule id "{rule}"{hint}')
        enforcement[rule] = level

    resources: tuple[GPUResource, ...] = ordered(
        GPUResource(pattern=name, max_per_container=(body or {}).get("maxPerContainer"),
                    reason=(body or {}).get("reason"), classes=(body or {}).get("classes", True),
                    valid_for={k: frozenset(v) for k, v in ((body or {}).get("validFor") or {}).items()})
        for name, body in (spec.get("gpuResources") or {}).items()
    )
    check_resources(resources, dra, fail)
    for resource in resources:
        for axis_name, values in resource.valid_for.items():
            where = ("spec", "gpuResources", resource.pattern, "validFor", axis_name)
            found = by_name.get(axis_name)
            if found is None:
                raise fail(where, f'no class axis "{axis_name}"; axes are: {", ".join(by_name) or "(none)"}')
            unknown = sorted(values - set(found.values))
            if unknown:
                raise fail(where, f'"{unknown[0]}" is not a {axis_name} value; choose from {", ".join(found.values)}')
    _check_expressions(classes.get("common") or {}, ("spec", "classes", "common"), fail)
    common = _contribution(classes.get("common") or {})
    runtime_classes = set(spec.get("gpuRuntimeClasses") or [])
    usage = usage_rules(spec.get("usage") or {}, fail, lambda name: any(r.matches(name) for r in resources),
                        {a.label: tuple(a.values) for a in axes})
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return Policy(
        resources=resources,
        axes=axes,
        common=common,
        namespaces=namespaces,
        namespace_selectors=selectors,
        exempt_namespaces=frozenset(spec.get("exemptNamespaces") or ()),
        gpu_runtime_classes=frozenset(runtime_classes),
        gpu_device_classes=frozenset(dra.device_classes),
        enforcement=enforcement,
        mutate_templates=bool((spec.get("templates") or {}).get("mutate", False)),
        digest=digest,
        sources=tuple(dict.fromkeys(sources)),
        usage=usage,
        dra=dra,
    )


def _check_expressions(raw: Mapping[str, Any], base: tuple[str, ...], fail: Any) -> None:
    """What the schema cannot say of matchExpressions: the values each operator needs, one key per source."""
    seen = set(raw.get("nodeSelector") or ()) | set(raw.get("aliases") or ())
    for index, expr in enumerate(raw.get("matchExpressions") or ()):
        where = (*base, "matchExpressions", str(index))
        op, values, key = expr["operator"], expr.get("values") or [], expr["key"]
        if op in ("In", "NotIn") and not values:
            raise fail(where, f"{key} {op} needs at least one value; list the exact label values (In matches no glob)")
        if op in ("Exists", "DoesNotExist") and values:
            raise fail(where, f"{key} {op} takes no values; remove them")
        if op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]+", str(values[0]))):
            raise fail(where, f"{key} {op} needs exactly one integer value (nvidia.com/gpu.memory is in MiB: 81920)")
        if key in seen:
            raise fail(where, f'"{key}" is already this value\'s nodeSelector or alias key; say it in one place')


def _axis(name: str, body: Mapping[str, Any]) -> Axis:
    values = {value: _contribution(c) for value, c in body["values"].items()}
    keys = set(body.get("nodeLabels") or ())
    for contribution in values.values():
        keys.update(contribution.aliases)
    return Axis(name=name, label=body["label"], default=body.get("default"), values=values, keys=frozenset(keys))


def _contribution(body: Mapping[str, Any]) -> Contribution:
    affinity = body.get("affinity") or {}
    selector = {str(k): str(v) for k, v in (body.get("nodeSelector") or {}).items()}
    aliases = {key: LabelValues.of(key, [value], certain=True) for key, value in selector.items()}
    for key, patterns in (body.get("aliases") or {}).items():
        if key not in aliases:
            aliases[key] = LabelValues.of(key, [str(p) for p in patterns])
    expressions = tuple(Expression(str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
                        for e in body.get("matchExpressions") or ())
    for key in dict.fromkeys(e.key for e in expressions):
        aliases.setdefault(key, LabelValues.of_expressions(key, [e for e in expressions if e.key == key]))
    return Contribution(
        node_selector=selector,
        tolerations=tuple(dict(t) for t in body.get("tolerations") or ()),
        node_affinity=affinity.get("nodeAffinity"),
        match_expressions=expressions,
        runtime_class_name=body.get("runtimeClassName"),
        priority_class_name=body.get("priorityClassName"),
        scheduler_name=body.get("schedulerName"),
        labels=dict(body.get("labels") or {}),
        annotations=dict(body.get("annotations") or {}),
        max_gpus_per_pod=body.get("maxGPUsPerPod"),
        aliases=aliases,
        defaults=dict(body.get("defaults") or {}),
        device_selectors={str(k): str(v) for k, v in (body.get("deviceSelectors") or {}).items()},
    )
