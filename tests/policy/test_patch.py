"""Edits -> RFC 6902 JSON Patch: pointer escaping, whole-parent adds, nested missing parents; and for every
mutating case, the patch applied by `jsonpatch` and by `kubectl patch --local --type=json` (the Go library
family the API server uses) gives the same document, which passes kubernetes-validate (strict) for 1.30 and
the newest version it knows, and which the engine leaves alone on a second pass."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import jsonpointer
import pytest

from webhook.admission.loader import load_policy, read_sources
from webhook.policy.engine import Context, evaluate
from webhook.policy.findings import Edit
from webhook.policy.patch import operations, pointer
from webhook.policy.rules import Policy, parse_sources

TESTS = Path(__file__).resolve().parents[1]
REVIEWS = TESTS / "data" / "admission-reviews"
NAMESPACE_RULES = TESTS / "rule-cases" / "namespace-policy" / "rules"
KUBECTL = shutil.which("kubectl")


@cache
def shipped() -> Policy:
    return load_policy()


@cache
def with_namespaces() -> Policy:
    return load_policy(NAMESPACE_RULES)


@cache
def mutating_templates() -> Policy:
    sources = [(name, text.replace("mutate: false", "mutate: true")) for name, text in read_sources()]
    policy = parse_sources(sources)
    assert policy.mutate_templates
    return policy


def _kv() -> Any:
    return pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")


def _versions() -> list[str]:
    try:
        import kubernetes_validate
    except ImportError:
        return ["1.30.0"]
    latest = kubernetes_validate.latest_version()
    return ["1.30.0"] if latest.startswith("1.30") else ["1.30.0", latest]


# --------------------------------------------------------------------------------------------- pointers

POINTERS = [
    pytest.param(("spec", "nodeSelector", "nvidia.com/gpu.product"), "/spec/nodeSelector/nvidia.com~1gpu.product",
                 id="slash-in-key"),
    pytest.param(("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
                 "/spec/containers/0/resources/limits/nvidia.com~1gpu", id="resource-name"),
    pytest.param(("a~b/c",), "/a~0b~1c", id="tilde-then-slash"),
    pytest.param(("~1",), "/~01", id="literal-tilde-one"),
    pytest.param(("a/~b",), "/a~1~0b", id="slash-then-tilde"),
    pytest.param(("metadata", "annotations", "gpu-webhook.io/class"), "/metadata/annotations/gpu-webhook.io~1class",
                 id="annotation-key"),
    pytest.param(("spec", "tolerations", "-"), "/spec/tolerations/-", id="append-marker"),
    pytest.param(("",), "/", id="empty-key"),
    pytest.param((), "", id="whole-document"),
    pytest.param(("a.b",), "/a.b", id="dot-needs-no-escape"),
]


@pytest.mark.parametrize(("path", "expected"), POINTERS)
def test_pointer_escaping(path: tuple[str | int, ...], expected: str) -> None:
    assert pointer(path) == expected
    assert jsonpointer.JsonPointer(expected).parts == [str(step) for step in path]


def test_escaped_key_lands_on_the_key_not_a_child() -> None:
    doc = {"spec": {"nodeSelector": {}}}
    ops = operations(doc, [Edit("set", ("spec", "nodeSelector"), "nvidia.com/gpu.product", "A100")])
    assert jsonpatch.apply_patch(doc, ops) == {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "A100"}}}


# --------------------------------------------------------------------------------------------- operations

OPERATIONS = [
    pytest.param(
        {"spec": {}},
        [Edit("set", ("spec", "nodeSelector"), "workload", "inference"),
         Edit("set", ("spec", "nodeSelector"), "gpu-type", "t4")],
        [{"op": "add", "path": "/spec/nodeSelector", "value": {"workload": "inference", "gpu-type": "t4"}}],
        id="absent-map-added-whole"),
    pytest.param(
        {"spec": {"nodeSelector": {"zone": "a"}}},
        [Edit("set", ("spec", "nodeSelector"), "workload", "inference")],
        [{"op": "add", "path": "/spec/nodeSelector/workload", "value": "inference"}],
        id="existing-map-gets-a-key"),
    pytest.param(
        {"spec": {"nodeSelector": None}},
        [Edit("set", ("spec", "nodeSelector"), "workload", "inference")],
        [{"op": "add", "path": "/spec/nodeSelector", "value": {"workload": "inference"}}],
        id="null-map-replaced-whole"),
    pytest.param(
        {"spec": {}},
        [Edit("append", ("spec", "tolerations"), None, {"key": "k", "operator": "Exists"})],
        [{"op": "add", "path": "/spec/tolerations", "value": [{"key": "k", "operator": "Exists"}]}],
        id="absent-list-added-whole"),
    pytest.param(
        {"spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}},
        [Edit("append", ("spec", "tolerations"), None, {"key": "k", "operator": "Exists"})],
        [{"op": "add", "path": "/spec/tolerations/-", "value": {"key": "k", "operator": "Exists"}}],
        id="existing-list-appended"),
    pytest.param(
        {"spec": {"template": {"spec": {}}}},
        [Edit("set", ("spec", "template", "metadata", "annotations"), "a/b", "1"),
         Edit("set", ("spec", "template", "metadata", "labels"), "c", "2")],
        [{"op": "add", "path": "/spec/template/metadata",
          "value": {"annotations": {"a/b": "1"}, "labels": {"c": "2"}}}],
        id="nested-missing-parents-one-add"),
    pytest.param(
        {"spec": {"jobTemplate": {}}},
        [Edit("set", ("spec", "jobTemplate", "spec", "template", "spec", "nodeSelector"), "w", "x")],
        [{"op": "add", "path": "/spec/jobTemplate/spec",
          "value": {"template": {"spec": {"nodeSelector": {"w": "x"}}}}}],
        id="deeply-missing-parents"),
    pytest.param(
        {"spec": {"priority": 0}},
        [Edit("set", ("spec",), "priorityClassName", "high"), Edit("remove", ("spec",), "priority"),
         Edit("remove", ("spec",), "preemptionPolicy")],
        [{"op": "add", "path": "/spec/priorityClassName", "value": "high"},
         {"op": "remove", "path": "/spec/priority"}],
        id="remove-only-what-exists"),
    pytest.param({"spec": {}}, [], [], id="no-edits-no-ops"),
]


@pytest.mark.parametrize(("doc", "edits", "expected"), OPERATIONS)
def test_operations(doc: dict[str, Any], edits: list[Edit], expected: list[dict[str, Any]]) -> None:
    before = json.loads(json.dumps(doc))
    ops = operations(doc, edits)
    assert ops == expected
    assert doc == before, "building the patch must not change the object"
    jsonpatch.apply_patch(doc, ops)  # and it applies


def test_operation_values_are_copies() -> None:
    value = {"key": "k", "operator": "Exists"}
    ops = operations({"spec": {}}, [Edit("append", ("spec", "tolerations"), None, value)])
    ops[0]["value"][0]["key"] = "changed"
    assert value["key"] == "k"


# --------------------------------------------------------------------------------------------- mutating cases


def _review_object(name: str) -> tuple[dict[str, Any], str]:
    req = json.loads((REVIEWS / f"{name}.json").read_text(encoding="utf-8"))["request"]
    return req["object"], req["namespace"]


def _pod(spec: dict[str, Any] | None = None, *, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, gpus: Any = "1") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p"}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "main", "image": "nvcr.io/x:1",
                                     "resources": {"limits": {"nvidia.com/gpu": gpus}}}], **(spec or {})}}


def _workload(kind: str, api: str, pod: dict[str, Any], *, template_metadata: bool) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": pod["spec"]}
    if template_metadata:
        template["metadata"] = {"labels": {"app": "w"}}
    selector = {"matchLabels": {"app": "w"}}
    if kind == "CronJob":
        return {"apiVersion": api, "kind": kind, "metadata": {"name": "w"},
                "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}}}
    if kind == "Job":
        return {"apiVersion": api, "kind": kind, "metadata": {"name": "w"}, "spec": {"template": template}}
    spec: dict[str, Any] = {"selector": selector, "template": template}
    if kind == "StatefulSet":
        spec["serviceName"] = "w"  # required before 1.31
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "w"}, "spec": spec}


def _cases() -> list[Any]:
    cases = []
    for name in ("pod-create-limits-only-defaulted", "pod-create-from-replicaset-gpu", "pod-create-sidecar-gpu",
                 "pod-create-gpu-dry-run", "pod-create-v1beta1"):
        obj, ns = _review_object(name)
        cases.append(pytest.param("shipped", obj, ns, id=f"fixture-{name}"))
    restart_never = {"restartPolicy": "Never"}
    cases += [
        pytest.param("shipped", _pod(), "default", id="minimal-pod"),
        pytest.param("shipped", _pod(gpus=8), "default", id="eight-gpus"),
        pytest.param("shipped", _pod({"nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4", "workload": "inference"}}),
                     "default", id="existing-nodeselector-with-slash-key"),
        pytest.param("shipped", _pod({"nodeSelector": None, "tolerations": None}), "default", id="null-fields"),
        pytest.param("shipped", _pod({"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]}),
            "default", id="existing-tolerations"),
        pytest.param("shipped", _pod({"runtimeClassName": "kata", **restart_never}), "default", id="user-runtime"),
        pytest.param("shipped", _pod(labels={"gpu-webhook.io/workload": "training", "a~b": "c"},
                                     annotations={"team/owner": "alice"}), "default", id="training-label"),
        pytest.param("shipped", _pod({"nodeName": "gpu-node-1"}), "default", id="node-name-preset"),
        pytest.param("shipped", _pod({"initContainers": [
            {"name": "side", "image": "x", "restartPolicy": "Always",
             "resources": {"limits": {"nvidia.com/gpu.shared": 1}}}]}, gpus=0), "default", id="shared-sidecar"),
        pytest.param("namespaces", _pod(), "research", id="namespace-default"),
        pytest.param("namespaces", _pod({"priority": 0, "preemptionPolicy": "PreemptLowerPriority"},
                                        labels={"gpu-webhook.io/gpu-type": "h100"}), "research",
                     id="h100-escaped-selector-priority-removed"),
        pytest.param("namespaces", _pod(labels={"gpu-webhook.io/gpu-type": "h100"}, gpus=5), "research",
                     id="warned-over-max-still-patched"),
    ]
    for kind, api in (("Deployment", "apps/v1"), ("StatefulSet", "apps/v1"), ("DaemonSet", "apps/v1"),
                      ("ReplicaSet", "apps/v1"), ("Job", "batch/v1"), ("CronJob", "batch/v1")):
        spec = restart_never if kind in ("Job", "CronJob") else {}
        for with_meta in (True, False):
            cases.append(pytest.param("templates", _workload(kind, api, _pod(spec), template_metadata=with_meta),
                                      "default", id=f"template-{kind}-{'with' if with_meta else 'without'}-metadata"))
    return cases


POLICIES = {"shipped": shipped, "namespaces": with_namespaces, "templates": mutating_templates}
CASES = _cases()


def _patch(policy_name: str, obj: Mapping[str, Any], namespace: str) -> tuple[list[dict[str, Any]], Any]:
    policy = POLICIES[policy_name]()
    verdict = evaluate(policy, obj, Context(namespace))
    assert verdict.allowed, verdict.message()
    ops = operations(obj, verdict.edits)
    assert ops, "a mutating case must produce a patch"
    return ops, jsonpatch.apply_patch(obj, ops)


@pytest.mark.parametrize(("policy_name", "obj", "namespace"), CASES)
def test_patch_is_a_fixed_point(policy_name: str, obj: dict[str, Any], namespace: str) -> None:
    _, after = _patch(policy_name, obj, namespace)
    again = evaluate(POLICIES[policy_name](), after, Context(namespace))
    assert again.allowed and not again.edits, f"second pass edits: {again.edits}"


@pytest.mark.parametrize(("policy_name", "obj", "namespace"), CASES)
def test_patch_keeps_what_the_user_wrote(policy_name: str, obj: dict[str, Any], namespace: str) -> None:
    before = json.loads(json.dumps(obj))
    ops, after = _patch(policy_name, obj, namespace)
    assert obj == before, "the engine and patch builder must not change their input"
    assert not any(op["op"] == "replace" for op in ops)
    for spec_path in (("spec",), ("spec", "template", "spec"), ("spec", "jobTemplate", "spec", "template", "spec")):
        old_spec, new_spec = _get(before, spec_path), _get(after, spec_path)
        if not isinstance(old_spec, dict) or "containers" not in old_spec:
            continue
        for key, value in (old_spec.get("nodeSelector") or {}).items():
            assert new_spec["nodeSelector"][key] == value
        old_tolerations = old_spec.get("tolerations") or []
        assert new_spec.get("tolerations", [])[: len(old_tolerations)] == old_tolerations
        if old_spec.get("runtimeClassName"):
            assert new_spec["runtimeClassName"] == old_spec["runtimeClassName"]
        tolerations = new_spec.get("tolerations") or []
        assert len({json.dumps(t, sort_keys=True) for t in tolerations}) == len(tolerations), "no duplicates"


def _get(doc: Any, path: tuple[str, ...]) -> Any:
    for step in path:
        doc = doc.get(step) if isinstance(doc, dict) else None
    return doc


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH: needed to apply the patch with the Go library")
@pytest.mark.parametrize(("policy_name", "obj", "namespace"), CASES)
def test_jsonpatch_and_kubectl_agree(policy_name: str, obj: dict[str, Any], namespace: str, tmp_path: Path) -> None:
    ops, after = _patch(policy_name, obj, namespace)
    source = tmp_path / "object.json"
    source.write_text(json.dumps(obj), encoding="utf-8")
    result = subprocess.run([str(KUBECTL), "patch", "--local", "--type=json", "-p", json.dumps(ops), "-f",
                             str(source), "-o", "json"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == after


@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize(("policy_name", "obj", "namespace"), CASES)
def test_patched_object_passes_kubernetes_validate(policy_name: str, obj: dict[str, Any], namespace: str,
                                                   version: str) -> None:
    kv = _kv()
    _, after = _patch(policy_name, obj, namespace)
    try:
        kv.validate(after, version, True)
    except kv.ValidationError as err:
        pytest.fail(f"kubernetes-validate {version} --strict: {str(err).splitlines()[0]}")
