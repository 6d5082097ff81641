"""Hypothesis strategies for Pod-like objects: schema-shaped Pods with GPU containers, and garbled ones (for the
engine's properties in tests/policy and the server's fuzzing in tests/admission)."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from hypothesis import strategies as st

from webhook.admission.loader import load_policy
from webhook.policy.rules import Policy


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
