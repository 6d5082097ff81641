"""Offline evaluation of manifests: the engine plus the patch, applied, for `check`, `test` and `audit`.

This is the same decision path as the admission server's `/mutate`: evaluate, build the JSON Patch from
the edits, apply it. Objects are judged as a CREATE in their namespace (or the one given).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonpatch

from webhook.policy import inventory as inv
from webhook.policy.dra_inventory import view_from_api
from webhook.policy.engine import Context, evaluate
from webhook.policy.findings import Mode, Operation, Verdict
from webhook.policy.inventory import Snapshot
from webhook.policy.manifests_io import Manifest, ManifestError, object_name, read_manifests
from webhook.policy.patch import operations
from webhook.policy.pods import KNOWN_KINDS, mapping, shape_problems
from webhook.policy.rules import Policy


@dataclass(frozen=True)
class Outcome:
    """The engine's verdict on one object, the patch it implies, and the object after the patch."""

    verdict: Verdict
    patch: list[dict[str, Any]]
    patched: Mapping[str, Any]


def decide(policy: Policy, obj: Mapping[str, Any], namespace: str | None, operation: Operation = "CREATE",
           mode: Mode = "mutate", *, inventory: Snapshot | None = None, claims: Snapshot | None = None) -> Outcome:
    """Evaluate one object and apply the patch, exactly as the admission server would answer.

    `inventory` (from `audit` and `doctor`) adds the live-cluster checks and the namespace's labels; `claims` (the
    claim templates and ResourceClaims of the files `check` reads) is where a Pod's claims are also looked up."""
    verdict = evaluate(policy, obj, Context(namespace, operation, mode, inventory=inventory, claims=claims))
    ops = operations(obj, verdict.edits) if verdict.allowed else []
    patched = jsonpatch.apply_patch(obj, ops) if ops else obj
    return Outcome(verdict, ops, patched)


@dataclass(frozen=True)
class Result:
    """One object of a manifest file, judged."""

    manifest: Manifest
    namespace: str
    outcome: Outcome
    template_injections: tuple[str, ...] = ()

    @property
    def verdict(self) -> Verdict:
        return self.outcome.verdict

    @property
    def patch(self) -> list[dict[str, Any]]:
        return self.outcome.patch

    @property
    def patched(self) -> Mapping[str, Any]:
        return self.outcome.patched

    @property
    def kind(self) -> str:
        return str(self.manifest.obj.get("kind"))

    @property
    def name(self) -> str:
        return object_name(self.manifest.obj)

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "file": self.manifest.source,
            "line": self.manifest.line,
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "allowed": v.allowed,
            "class": v.gpu_class,
            "chosen": list(v.choices),
            "gpus": v.gpus,
            "violations": [{"rule": f.rule, "message": f.message} for f in v.violations],
            "warnings": [f.render() for f in v.warnings],
            "patch": self.patch,
            "object": self.patched,
        }


def namespace_of(obj: Mapping[str, Any], default: str | None) -> str:
    """--namespace wins for objects that name none; otherwise the object's own; otherwise `default`."""
    meta = obj.get("metadata")
    own = meta.get("namespace") if isinstance(meta, Mapping) else None
    return str(own or default or "default")


@dataclass(frozen=True)
class NodeDump:
    """A cluster snapshot read from dumped API objects, and what was assumed to build it."""

    snapshot: Snapshot
    notes: tuple[str, ...] = ()


def snapshot_from_objects(policy: Policy, source: str, objects: Sequence[Mapping[str, Any]]) -> NodeDump:
    """The inventory `check --nodes` and rule cases decide with, from `kubectl get nodes -o json` (a List, or
    YAML documents; `kubectl get nodes,runtimeclasses,namespaces -o json` adds those, and ResourceClaimTemplates,
    ResourceClaims, ResourceSlices and DeviceClasses go to the DRA inventory). Parsed exactly as the
    server parses what it watches. A dump without RuntimeClasses takes the ones the rules name to exist (said in
    the notes), so that offline answers are not about a RuntimeClass nobody dumped. Raises ManifestError when
    `source` holds no Node."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(str(obj.get("kind") or ""), []).append(obj)
    if not by_kind.get("Node"):
        kinds = ", ".join(sorted(k for k in by_kind if k)) or "nothing"
        raise ManifestError(f"{source}: holds no Node (found {kinds}); give the output of `kubectl get nodes -o json`")
    runtime_classes = list(by_kind.get("RuntimeClass", ()))
    notes: list[str] = []
    if not runtime_classes:
        named = sorted({c.runtime_class_name for c in _contributions(policy) if c.runtime_class_name})
        runtime_classes = [{"kind": "RuntimeClass", "metadata": {"name": name}, "handler": name} for name in named]
        if named:
            notes.append(f"{source} has no RuntimeClass: taken to exist: {', '.join(named)} (add "
                         "`kubectl get runtimeclasses -o json` to the dump to check them)")
    dra = view_from_api(by_kind.get("ResourceSlice", ()), by_kind.get("DeviceClass", ()),
                        by_kind.get("ResourceClaim", ()))
    snapshot = inv.snapshot_from_api(by_kind["Node"], runtime_classes, by_kind.get("Namespace", ()),
                                     by_kind.get("ResourceClaimTemplate", ()), dra=dra)
    return NodeDump(snapshot, tuple(notes))


def _contributions(policy: Policy) -> list[Any]:
    return [policy.common, *(c for axis in policy.axes for c in axis.values.values())]


def check_sources(policy: Policy, sources: Sequence[tuple[str, str]], namespace: str | None,
                  inventory: Snapshot | None = None) -> list[Result]:
    """Judge every object of every (name, text) source; raises ManifestError naming file and line. With
    `inventory` (`check --nodes`), the cluster-aware checks run as in the server."""
    read = [manifest for source, text in sources for manifest in read_manifests(source, text)]
    claims = _claims_given(read, namespace)
    results = []
    for manifest in read:
        problems = shape_problems(manifest.obj)
        if problems:
            raise ManifestError(f"{manifest.where()}: {'; '.join(problems)}; fix the manifest "
                                "(the API server would refuse it)")
        ns = namespace_of(manifest.obj, namespace)
        outcome = decide(policy, manifest.obj, ns, inventory=inventory, claims=claims)
        results.append(Result(manifest, ns, outcome, _template_preview(policy, manifest.obj, ns, outcome,
                                                                              inventory)))
    return results


def _claims_given(manifests: Sequence[Manifest], namespace: str | None) -> Snapshot | None:
    """The ResourceClaimTemplates and ResourceClaims among the files (in their namespaces, or --namespace), so that
    a Pod in the same files that uses them is judged as using them (NVIDIA's quickstart: a template and its Pods in
    one file); None when there are none."""
    templates: list[Mapping[str, Any]] = []
    named: list[Mapping[str, Any]] = []
    for manifest in manifests:
        kind = manifest.obj.get("kind")
        if kind in ("ResourceClaimTemplate", "ResourceClaim"):
            obj = {**manifest.obj, "metadata": {**mapping(manifest.obj.get("metadata")),
                                                 "namespace": namespace_of(manifest.obj, namespace)}}
            (templates if kind == "ResourceClaimTemplate" else named).append(obj)
    if not templates and not named:
        return None
    return inv.snapshot_from_api(claim_templates=templates, dra=view_from_api(resource_claims=named))


def _template_preview(policy: Policy, obj: Mapping[str, Any], namespace: str, outcome: Outcome,
                      inventory: Snapshot | None = None) -> tuple[str, ...]:
    """For a workload whose template is not mutated: what each Pod it creates will receive at admission."""
    if policy.mutate_templates or obj.get("kind") in (None, "Pod") or obj.get("kind") not in KNOWN_KINDS:
        return ()
    if not outcome.verdict.allowed or outcome.verdict.gpu_class is None:
        return ()
    preview = decide(dataclasses.replace(policy, mutate_templates=True), obj, namespace, inventory=inventory)
    return tuple(describe_edits(preview.patch))


def describe_edits(ops: Sequence[Mapping[str, Any]]) -> list[str]:
    """JSON Patch operations in words: `/spec/nodeSelector = {"workload": "inference"}`."""
    lines = []
    for op in ops:
        path = str(op["path"]).replace("~1", "/").replace("~0", "~")
        if op["op"] == "remove":
            lines.append(f"{path} removed")
        else:
            lines.append(f"{path} = {json.dumps(op['value'], sort_keys=False)}")
    return lines
