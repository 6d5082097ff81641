"""Decisions against the objects a real H200 node produced (tests/data/real-h200, see its README).

The Nodes as the kubelet and GPU feature discovery left them (whole GPU, time-sliced, time-sliced and renamed),
GFD's own label sets and the Pods as stored are parsed as the server parses them, and every decision the run
showed to matter is asserted on them: a default no live node satisfies is held back, a time-sliced GPU is asked
for one at a time, and allocatable (not capacity) is what a node offers.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.admission.loader import load_policy
from webhook.policy import inventory
from webhook.policy.checking import decide
from webhook.policy.inventory import Node, Snapshot
from webhook.policy.rules import Policy, parse_sources

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
    assert warning.startswith("gpu-type t4 not applied (from the cluster default): no Ready node that advertises "
                              "the Pod's GPU resource has gpu-type=t4, so the Pod would stay Pending")
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


# --------------------------------------------------------------------------------------------- time-sliced GPUs


def whole_gpu_node(name: str = "h100-1", gpus: int = 8, ready: bool = True) -> Node:
    """A node of whole GPUs beside the real one (labels as GFD writes them without sharing)."""
    return Node(name, {"workload": "inference", inventory.PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3",
                       inventory.REPLICAS_LABEL: "1", inventory.SHARING_LABEL: "none"},
                (inventory.Taint("nvidia.com/gpu", "present"),), {"nvidia.com/gpu": gpus}, ready)


def with_nodes(snap: Snapshot, *nodes: Node) -> Snapshot:
    return dataclasses.replace(snap, nodes=(*snap.nodes, *nodes))


SLICED = [
    pytest.param(snapshot("node-h200-timesliced"), 2, ["gpu-time-sliced-max"], id="the-real-rejection"),
    pytest.param(snapshot("node-h200-timesliced"), 1, [], id="one-replica-fits"),
    pytest.param(snapshot("node-h200-timesliced"), 5, ["gpu-never-schedulable"], id="more-than-the-replicas"),
    pytest.param(snapshot("node-h200"), 2, ["gpu-never-schedulable"], id="whole-gpu-node-too-small"),
    pytest.param(with_nodes(snapshot("node-h200-timesliced"), whole_gpu_node()), 2, [],
                 id="a-whole-gpu-node-can-hold-it"),
    pytest.param(with_nodes(snapshot("node-h200-timesliced"), whole_gpu_node(ready=False)), 2,
                 ["gpu-time-sliced-max"], id="the-whole-gpu-node-is-not-ready"),
    pytest.param(with_nodes(snapshot("node-h200-timesliced"), whole_gpu_node(gpus=1)), 2, ["gpu-time-sliced-max"],
                 id="the-whole-gpu-node-cannot-hold-two"),
    pytest.param(snapshot("node-h200-shared"), 2, ["gpu-class-no-node"], id="renamed: no nvidia.com/gpu at all"),
]


@pytest.mark.parametrize(("snap", "gpus", "denied"), SLICED)
def test_time_sliced_gpus_are_asked_for_one_at_a_time(snap: Snapshot, gpus: int, denied: list[str]) -> None:
    verdict = decide(packaged(), seed_pod(gpus), "default", inventory=snap).verdict
    found = sorted({f.rule for f in (*verdict.violations, *verdict.warnings)} & {
        "gpu-time-sliced-max", "gpu-never-schedulable", "gpu-class-no-node"})
    assert found == denied, verdict.message()


def device_ids(name: str) -> list[str]:
    answer = json.loads((DATA / name).read_text())
    return [i for pod in answer["pod_resources"] for c in pod["containers"] for d in c.get("devices") or []
            if d["resource_name"] == "nvidia.com/gpu" for i in d["device_ids"]]


def test_what_the_time_slicing_rule_says_of_a_node_is_what_its_kubelet_handed_out() -> None:
    """gpu-time-sliced-max reads GFD's labels as "each nvidia.com/gpu is a replica of a GPU". The kubelet's
    pod-resources answers on that node agree: 4 Pods, 4 device ids `GPU-<uuid>::n`, one physical GPU; on the
    plain node the one device id is the GPU's UUID itself."""
    node = inventory.node_from_api(node_json("node-h200-timesliced"))
    assert inventory.sharing(node) == "time-slicing, nvidia.com/gpu.replicas=4"
    replicas = device_ids("podresources-timesliced.json")
    assert len(replicas) == node.offers("nvidia.com/gpu") == 4
    assert {i.split("::")[0] for i in replicas} == {i for i in device_ids("podresources-whole.json")}
    assert sorted(i.split("::")[1] for i in replicas) == ["0", "1", "2", "3"]
    assert node.labels["nvidia.com/gpu.count"] == "1"
    assert inventory.sharing(inventory.node_from_api(node_json("node-h200"))) is None


def test_the_rejected_pod_is_denied_at_admission_with_why_and_how() -> None:
    """The Pod the kubelet failed with UnexpectedAdmissionError, as applied, against the Node it was bound to."""
    outcome = decide(packaged(), rejected_pod_as_applied(), "default", inventory=snapshot("node-h200-timesliced"))
    [violation] = outcome.verdict.violations
    assert violation.rule == "gpu-time-sliced-max" and outcome.patch == []
    assert violation.message == (
        "spec.containers[0] (cuda): asks for 2 nvidia.com/gpu, but every node the Pod can land on shares its GPUs "
        "(kit-gpu-node: time-slicing, nvidia.com/gpu.replicas=4): each nvidia.com/gpu there is a replica of a GPU, "
        "so 2 replicas give the container no more than 1 does, and a device plugin with failRequestsGreaterThanOne "
        "makes the kubelet fail the Pod (UnexpectedAdmissionError: maximum request size for shared resources is 1); "
        "ask for 1, or pick a class of whole GPUs")
    stored = json.loads((DATA / "pod-timesliced-two-replicas-rejected.json").read_text())
    assert "maximum request size for shared resources is 1; found 2" in stored["status"]["message"]
    assert decide(packaged(), rejected_pod_as_applied(), "default").verdict.allowed, "nothing without the nodes"


def test_renamed_shared_gpus_keep_the_per_container_maximum() -> None:
    """renameByDefault: true (nvidia.com/gpu.shared): gpu-per-container-max refuses 2, as it did on the real node;
    the time-slicing rule does not say it twice."""
    verdict = decide(packaged(), seed_pod(2, "nvidia.com/gpu.shared"), "default",
                     inventory=snapshot("node-h200-shared")).verdict
    assert [f.rule for f in verdict.violations] == ["gpu-per-container-max"]


@pytest.mark.parametrize(("level", "allowed", "warned"), [("warn", True, True), ("off", True, False)])
def test_time_sliced_enforcement_levels(level: str, allowed: bool, warned: bool) -> None:
    relaxed = parse_sources([*packaged_sources(),
                             ("zz-relaxed.yaml", "apiVersion: gpu-webhook.io/v1alpha1\nkind: GPUPolicy\n"
                                                 f"metadata: {{name: relaxed}}\nspec:\n  enforcement: "
                                                 f"{{gpu-time-sliced-max: '{level}'}}\n")])
    verdict = decide(relaxed, seed_pod(2), "default", inventory=snapshot("node-h200-timesliced")).verdict
    assert verdict.allowed is allowed
    assert ("gpu-time-sliced-max" in [f.rule for f in verdict.warnings]) is warned


def packaged_sources() -> list[tuple[str, str]]:
    rules = Path(__file__).parents[2] / "rules"
    return [(p.name, p.read_text()) for p in sorted(rules.glob("*.yaml"))]
