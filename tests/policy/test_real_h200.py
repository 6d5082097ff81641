"""Decisions against the objects a real H200 node produced (tests/data/real-h200, see its README).

The Nodes as the kubelet and GPU feature discovery left them (whole GPU, time-sliced, time-sliced and renamed),
GFD's own label sets and the Pods as stored are parsed as the server parses them, and every decision the run
showed to matter is asserted on them: a default no live node satisfies is held back, a time-sliced GPU is asked
for one at a time, and allocatable (not capacity) is what a node offers.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.admission.loader import load_policy
from webhook.policy import inventory
from webhook.policy.checking import decide
from webhook.policy.inventory import Snapshot
from webhook.policy.rules import Policy

DATA = Path(__file__).parents[1] / "data" / "real-h200"
RUNTIME_CLASS = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                 "handler": "nvidia"}


def node_json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def gfd_labels(name: str) -> dict[str, str]:
    """A `gfd-labels*.txt` file (GFD's --oneshot output: one `key=value` a line)."""
    lines = (DATA / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip())


def snapshot(*names: str) -> Snapshot:
    return inventory.snapshot_from_api([node_json(n) for n in names], [RUNTIME_CLASS])


@cache
def packaged() -> Policy:
    return load_policy()


def seed_pod(gpus: int = 1, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    """The seed's cuda-gpu-test as the user applied it (its last-applied-configuration on the real node)."""
    stored = yaml.safe_load((DATA / "pod-cuda-gpu-test-packaged-rules-stored.yaml").read_text())
    applied: dict[str, Any] = json.loads(
        stored["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    applied["spec"]["containers"][0]["resources"] = {"limits": {resource: gpus}}
    return applied


def rejected_pod_as_applied() -> dict[str, Any]:
    """The Pod the kubelet rejected on the time-sliced node, as the user applied it."""
    stored = json.loads((DATA / "pod-timesliced-two-replicas-rejected.json").read_text())
    applied: dict[str, Any] = json.loads(
        stored["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    return applied


# --------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("name", "allocatable", "product", "labels_file"),
    [
        pytest.param("node-h200", {"nvidia.com/gpu": 1}, "NVIDIA-H200", "gfd-labels.txt", id="whole"),
        pytest.param("node-h200-timesliced", {"nvidia.com/gpu": 4}, "NVIDIA-H200-SHARED", "gfd-labels-timesliced.txt",
                     id="time-sliced"),
        pytest.param("node-h200-shared", {"nvidia.com/gpu": 0, "nvidia.com/gpu.shared": 4}, "NVIDIA-H200",
                     "gfd-labels-shared.txt", id="renamed: capacity 4, allocatable 0"),
    ],
)
def test_real_nodes_parse_with_allocatable_and_gfd_labels(name: str, allocatable: dict[str, int], product: str,
                                                          labels_file: str) -> None:
    node = inventory.node_from_api(node_json(name))
    assert node.name == "kit-gpu-node" and node.ready
    assert dict(node.allocatable) == allocatable, "allocatable counts, not capacity"
    assert node.labels[inventory.PRODUCT_LABEL] == product
    gfd = gfd_labels(labels_file)
    assert {k: v for k, v in node.labels.items() if k.startswith("nvidia.com/")} == gfd, \
        "every nvidia.com/ label on the Node is GFD's own output"
    assert [str(t) for t in node.taints] == ["nvidia.com/gpu=present:NoSchedule"]


# --------------------------------------------------------------------------------------------- held-back defaults


def test_the_seed_pod_on_a_cluster_of_h200s_is_not_given_t4() -> None:
    """The real run: the packaged rules gave the seed's Pod gpu-type=t4 and it stayed Pending. With the live
    node it keeps workload=inference (the node has it) and the tolerations, and gpu-type t4 is held back."""
    snap = snapshot("node-h200")
    outcome = decide(packaged(), seed_pod(), "default", inventory=snap)
    verdict = outcome.verdict
    assert verdict.allowed, verdict.message()
    spec = outcome.patched["spec"]
    assert spec["nodeSelector"] == {"workload": "inference"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["runtimeClassName"] == "nvidia"
    [warning] = [f.message for f in verdict.warnings if f.rule == "gpu-class-skipped"]
    assert warning.startswith("gpu-type t4 (from the cluster default) was not applied: its nodeSelector gpu-type=t4 "
                              "matches no Ready node that advertises the Pod's GPU resource")
    assert "which have NVIDIA-H200 (kit-gpu-node)" in warning
    assert ("spec.classes.axes.gpu-type.values.h200: {nodeSelector: {nvidia.com/gpu.product: NVIDIA-H200}}"
            in warning)
    assert "gpu-class-no-node" not in verdict.rules
    node = inventory.node_from_api(node_json("node-h200"))
    assert inventory.eligible_nodes(snap, inventory.placement(spec, ("spec",)), "nvidia.com/gpu") == [node]
    final = decide(packaged(), outcome.patched, "default", mode="validate", inventory=snap).verdict
    assert final.allowed and final.gpu_class == verdict.gpu_class, final.message()


def test_without_cluster_awareness_the_defaults_are_injected_as_before() -> None:
    stored = yaml.safe_load((DATA / "pod-cuda-gpu-test-packaged-rules-stored.yaml").read_text())
    outcome = decide(packaged(), seed_pod(), "default")
    assert outcome.patched["spec"]["nodeSelector"] == stored["spec"]["nodeSelector"] == {
        "gpu-type": "t4", "workload": "inference"}, "what the real webhook injected on that run"
