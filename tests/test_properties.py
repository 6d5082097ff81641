"""Properties of the engine and the patch on generated Pod-like objects (hypothesis).

For any object: `evaluate` never raises. For schema-shaped Pods that are allowed: the patch applies with
jsonpatch, the result passes kubernetes-validate (strict), a second pass yields no patch (fixed point), and
what the user wrote (nodeSelector entries, tolerations, runtimeClassName, labels, annotations) is kept.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.engine import Context, evaluate
from webhook.loader import load_policy
from webhook.patch import operations
from webhook.rules import Policy

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMESPACES = ["default", "team-a", "kube-system"]


@cache
def policy() -> Policy:
    return load_policy()


@cache
def validator() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        return None
    return kubernetes_validate


# --------------------------------------------------------------------------------------------- strategies

GPU_NAMES = ["nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb", "amd.com/gpu"]
VALID_QUANTITIES = st.sampled_from([0, 1, 2, "0", "1", "2", "3", 1.0, "2e0", "1000m", "+1", "8"])
ANY_QUANTITIES = st.one_of(
    VALID_QUANTITIES, VALID_QUANTITIES, VALID_QUANTITIES,
    st.sampled_from(["500m", "1500m", "-1", "abc", "1Ki", "0.5", 0.5, "9", 16, "1e3", "", " 1 "]),
)
LABEL_VALUES = st.sampled_from(["inference", "training", "t4", "a100", "inference", "training", "t4", "a100",
                                "v100", ""])
NODE_SELECTOR = st.dictionaries(
    st.sampled_from(["workload", "gpu-type", "zone", "nvidia.com/gpu.product", "kubernetes.io/os"]),
    st.sampled_from(["inference", "training", "t4", "a100", "linux", "Tesla-T4"]), max_size=3)
TOLERATION = st.one_of(
    st.just({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
    st.just({"key": "nvidia.com/gpu", "operator": "Exists"}),
    st.just({"operator": "Exists"}),
    st.just({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}),
    st.just({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300}),
    st.builds(lambda k, e: {"key": k, "operator": "Exists", "effect": e},
              st.sampled_from(["dedicated", "nvidia.com/gpu", "spot"]),
              st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])),
)


@st.composite
def resources(draw: st.DrawFn, quantities: st.SearchStrategy[Any]) -> dict[str, Any]:
    """Mostly coherent (requests equal to limits, as the API server defaults them), sometimes not."""
    names = draw(st.lists(st.sampled_from([*GPU_NAMES, "cpu", "memory"]), max_size=2, unique=True))
    limits = {n: ("500m" if n == "cpu" else "1Gi" if n == "memory" else draw(quantities)) for n in names}
    out: dict[str, Any] = {"limits": limits} if limits else {}
    shape = draw(st.sampled_from(["equal", "equal", "equal", "none", "other"]))
    if shape == "equal" and limits:
        out["requests"] = dict(limits)
    elif shape == "other":
        out["requests"] = {draw(st.sampled_from(GPU_NAMES)): draw(quantities)}
    return out


@st.composite
def containers(draw: st.DrawFn, prefix: str, quantities: st.SearchStrategy[Any], *, init: bool,
               max_size: int) -> list[dict[str, Any]]:
    items = []
    for i in range(draw(st.integers(0 if prefix != "c" else 1, max_size))):
        container: dict[str, Any] = {"name": f"{prefix}{i}", "image": "nvcr.io/x:1",
                                     "resources": draw(resources(quantities))}
        if init and draw(st.booleans()):
            container["restartPolicy"] = "Always"
        if draw(st.integers(0, 5)) == 0:
            container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": draw(st.sampled_from(["all", "void"]))}]
        items.append(container)
    return items


@st.composite
def pods(draw: st.DrawFn, quantities: st.SearchStrategy[Any] = ANY_QUANTITIES) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": draw(containers("c", quantities, init=False, max_size=3))}
    init = draw(containers("i", quantities, init=True, max_size=2))
    if init:
        spec["initContainers"] = init
    if draw(st.booleans()):
        spec["nodeSelector"] = draw(NODE_SELECTOR)
    if draw(st.booleans()):
        spec["tolerations"] = draw(st.lists(TOLERATION, max_size=3))
    runtime = draw(st.sampled_from([None, "nvidia", "kata", "runc"]))
    if runtime:
        spec["runtimeClassName"] = runtime
    if draw(st.integers(0, 4)) == 0:
        spec["nodeName"] = "node-1"
    metadata: dict[str, Any] = {"name": "p"}
    labels = draw(st.dictionaries(st.sampled_from(["gpu-webhook.io/workload", "gpu-webhook.io/gpu-type", "app"]),
                                  LABEL_VALUES, max_size=2))
    for key in [k for k in labels if k.startswith("gpu-webhook.io/")]:  # a value on the wrong axis is unknown
        valid = ("inference", "training") if key.endswith("workload") else ("t4", "a100")
        if labels[key] not in valid and draw(st.integers(0, 3)):
            del labels[key]
    if labels:
        metadata["labels"] = labels
    if draw(st.booleans()):
        metadata["annotations"] = draw(st.dictionaries(
            st.sampled_from(["owner", "gpu-webhook.io/class", "kubernetes.io/config.mirror"]),
            st.sampled_from(["a", "b"]), max_size=2))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


GARBAGE = st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=5), st.booleans(),
                    st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.floats(allow_nan=True))
GARBAGE_PATHS = [
    ("spec",), ("metadata",), ("kind",), ("spec", "containers"), ("spec", "initContainers"),
    ("spec", "nodeSelector"), ("spec", "tolerations"), ("spec", "runtimeClassName"), ("spec", "nodeName"),
    ("spec", "resources"), ("metadata", "labels"), ("metadata", "annotations"), ("spec", "containers", 0),
    ("spec", "containers", 0, "resources"), ("spec", "containers", 0, "resources", "limits"),
    ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"), ("spec", "containers", 0, "env"),
    ("spec", "containers", 0, "name"), ("spec", "tolerations", 0), ("spec", "tolerations", 0, "effect"),
    ("spec", "tolerations", 0, "key"),
    ("spec", "ephemeralContainers"), ("metadata", "labels", "gpu-webhook.io/workload"),
]


@st.composite
def garbled_pods(draw: st.DrawFn) -> dict[str, Any]:
    obj = copy.deepcopy(draw(pods()))  # strategies may share dicts (sampled_from): never garble those
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(GARBAGE_PATHS))
        node: Any = obj
        for step in path[:-1]:
            if isinstance(node, dict):
                node = node.setdefault(step, {})
            elif isinstance(node, list) and isinstance(step, int) and step < len(node):
                node = node[step]
            else:
                node = None
                break
        settable = isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node)
        if isinstance(node, dict) or settable:
            node[path[-1]] = draw(GARBAGE)
    return obj


# --------------------------------------------------------------------------------------------- properties


def _is_mapping_of_str(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


@SETTINGS
@given(obj=garbled_pods(), namespace=st.sampled_from(NAMESPACES),
       operation=st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE"]),
       mode=st.sampled_from(["mutate", "validate"]))
def test_evaluate_never_raises(obj: dict[str, Any], namespace: str, operation: str, mode: str) -> None:
    before = copy.deepcopy(obj)
    verdict = evaluate(policy(), obj, Context(namespace, operation, mode))  # type: ignore[arg-type]
    assert obj == before or json.dumps(obj, default=str) == json.dumps(before, default=str), "input unchanged"
    if mode == "validate" or operation != "CREATE" or not verdict.allowed:
        assert not verdict.edits
    if verdict.edits and _is_mapping_of_str(obj.get("spec", {}).get("nodeSelector", {}) or {}) and isinstance(
            obj.get("spec", {}).get("tolerations", []) or [], list) and isinstance(obj.get("metadata"), dict) and \
            all(isinstance(obj["metadata"].get(k, {}) or {}, dict) for k in ("labels", "annotations")):
        jsonpatch.apply_patch(obj, operations(obj, verdict.edits))


@SETTINGS
@given(obj=st.one_of(pods(VALID_QUANTITIES), pods(VALID_QUANTITIES), pods()), namespace=st.sampled_from(NAMESPACES))
def test_allowed_pods_patch_validate_and_reach_a_fixed_point(obj: dict[str, Any], namespace: str) -> None:
    verdict = evaluate(policy(), obj, Context(namespace))
    if not verdict.allowed:
        assert not verdict.edits
        return
    ops = operations(obj, verdict.edits)
    after = jsonpatch.apply_patch(obj, ops)
    kv = validator()
    if kv is not None and ops:
        try:
            kv.validate(after, kv.latest_version(), True)
        except kv.ValidationError as err:
            pytest.fail(f"kubernetes-validate --strict: {str(err).splitlines()[0]}")
    again = evaluate(policy(), after, Context(namespace))
    assert again.allowed, again.message()
    assert not again.edits, f"second pass edits: {again.edits}"
    assert {f.rule for f in again.warnings} == {f.rule for f in verdict.warnings}


@SETTINGS
@given(obj=pods(VALID_QUANTITIES), namespace=st.sampled_from(NAMESPACES))
def test_what_the_user_wrote_is_never_clobbered(obj: dict[str, Any], namespace: str) -> None:
    verdict = evaluate(policy(), obj, Context(namespace))
    after = jsonpatch.apply_patch(obj, operations(obj, verdict.edits)) if verdict.allowed else obj
    spec, new_spec = obj["spec"], after["spec"]
    for key, value in (spec.get("nodeSelector") or {}).items():
        assert new_spec["nodeSelector"][key] == value
    tolerations = spec.get("tolerations") or []
    assert (new_spec.get("tolerations") or [])[: len(tolerations)] == tolerations
    added = (new_spec.get("tolerations") or [])[len(tolerations):]
    assert all(t not in tolerations for t in added), "a toleration the user has is never added again"
    if spec.get("runtimeClassName"):
        assert new_spec["runtimeClassName"] == spec["runtimeClassName"]
    for part in ("labels", "annotations"):
        for key, value in (obj["metadata"].get(part) or {}).items():
            assert after["metadata"][part][key] == value
    assert new_spec["containers"] == spec["containers"]
    assert new_spec.get("initContainers") == spec.get("initContainers")


@SETTINGS
@given(obj=pods(VALID_QUANTITIES))
def test_exempt_and_non_create_are_never_patched(obj: dict[str, Any]) -> None:
    assert not evaluate(policy(), obj, Context("kube-system")).edits
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        verdict = evaluate(policy(), obj, Context("default", operation))  # type: ignore[arg-type]
        assert verdict.allowed and not verdict.edits
