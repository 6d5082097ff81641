"""Scenario 13: classes on GPU feature discovery's own labels. kwok GPU nodes carry GFD's real label sets (the
H200's from a real node, tests/data/real-h200; the others GFD's documented labels for those products) and no
`gpu-type` label at all; with the example rules (rules/examples/gfd) the seed's Pods, labelled with a class,
get required node affinity on those labels and the real scheduler binds them to the right nodes."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cluster import (
    GPU,
    GPU_TAINT,
    KWOK_ANNOTATION,
    REPO,
    Cluster,
    gpu_pod,
    pod_json,
    wait_rules_digest,
    wait_scheduled,
    wait_until,
    webhook_readyz,
    write_rules,
    yaml_of,
)

pytestmark = pytest.mark.e2e

REAL = REPO / "tests" / "data" / "real-h200"
GFD_RULES = REPO / "rules" / "examples" / "gfd" / "gpu-policy.yaml"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _real_gfd_labels(name: str) -> dict[str, str]:
    node = json.loads((REAL / f"{name}.json").read_text())
    return {k: v for k, v in node["metadata"]["labels"].items() if k.startswith("nvidia.com/")}


def _documented(product: str, memory: str, family: str, count: str, major: str, minor: str) -> dict[str, str]:
    """GFD's labels for a product (the keys and formats GFD v0.17 writes on a node without sharing)."""
    return {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": memory, "nvidia.com/gpu.family": family,
            "nvidia.com/gpu.count": count, "nvidia.com/gpu.compute.major": major,
            "nvidia.com/gpu.compute.minor": minor, "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.mode": "compute",
            "nvidia.com/gpu.machine": "e2e-fake", "nvidia.com/mig.capable": "false",
            "nvidia.com/cuda.driver-version.full": "580.159.04", "nvidia.com/cuda.runtime-version.full": "13.0"}


# name -> (GFD labels, GPUs advertised)
GFD_NODES: dict[str, tuple[dict[str, str], int]] = {
    "gfd-h200-0": (_real_gfd_labels("node-h200"), 1),
    "gfd-h200-shared-0": (_real_gfd_labels("node-h200-timesliced"), 4),
    "gfd-h100-0": (_documented("NVIDIA-H100-80GB-HBM3", "81559", "hopper", "8", "9", "0"), 8),
    "gfd-l4-0": (_documented("NVIDIA-L4", "23034", "ada-lovelace", "1", "8", "9"), 1),
}


def _node(name: str, labels: dict[str, str], gpus: int) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels}},
            "spec": {"taints": [dict(GPU_TAINT)]},
            "status": {"capacity": capacity, "allocatable": dict(capacity),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kwok-managed fake node", "lastHeartbeatTime": now,
                                       "lastTransitionTime": now}]}}


@contextlib.contextmanager
def gfd_cluster(cluster: Cluster) -> Iterator[None]:
    """The GFD-labelled nodes and the example rules for the test; both removed afterwards."""
    nodes = [_node(name, labels, gpus) for name, (labels, gpus) in GFD_NODES.items()]
    original = {p.name: p.read_text() for p in sorted((REPO / "rules").glob("*.yaml"))}
    before = webhook_readyz(cluster)["checks"]["rules"]["digest"]
    try:
        cluster.kubectl("create", "-f", "-", input=yaml_of(*nodes))

        def ready() -> bool:
            listed = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            ours = [n for n in listed if n["metadata"]["name"] in GFD_NODES]
            return len(ours) == len(GFD_NODES) and all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                and "node.kubernetes.io/not-ready" not in [t["key"] for t in n["spec"].get("taints", [])]
                and n["status"].get("allocatable", {}).get(GPU) == str(GFD_NODES[n["metadata"]["name"]][1])
                for n in ours)

        wait_until(ready, 60, "the GFD-labelled nodes to be Ready with their GPUs")
        write_rules(cluster.webhook_rules, {"gpu-policy.yaml": GFD_RULES.read_text()})
        wait_rules_digest(cluster, changed_from=before)
        yield
    finally:
        write_rules(cluster.webhook_rules, original)
        wait_rules_digest(cluster, equal_to=before)
        cluster.kubectl("delete", "node", *GFD_NODES, "--ignore-not-found", check=False)


CASES = [
    pytest.param({"gpu-webhook.io/gpu-type": "h200"}, {"gfd-h200-0", "gfd-h200-shared-0"}, id="h200-incl-shared"),
    pytest.param({"gpu-webhook.io/gpu-type": "h200", "gpu-webhook.io/gpu-memory": "141gb"},
                 {"gfd-h200-0", "gfd-h200-shared-0"}, id="h200-141gb"),
    pytest.param({"gpu-webhook.io/gpu-type": "l4"}, {"gfd-l4-0"}, id="l4"),
    pytest.param({"gpu-webhook.io/gpu-type": "h100"}, {"gfd-h100-0"}, id="h100"),
    pytest.param({"gpu-webhook.io/gpu-memory": "80gb"}, {"gfd-h100-0", "gpu-a100-0", "gpu-a100-1"},
                 id="80gb: the H100 or the seed's A100s"),
]


def test_seed_pods_land_on_the_gpus_their_class_names(cluster: Cluster, namespace: str) -> None:
    with gfd_cluster(cluster):
        for index, param in enumerate(CASES):
            labels, expected = param.values
            name = f"cuda-gpu-test-{index}"
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(gpu_pod(name, 1, labels)))
            node = wait_scheduled(cluster, namespace, name)
            assert node in expected, f"{param.id}: bound to {node}, expected one of {sorted(expected)}"
            spec = pod_json(cluster, namespace, name)["spec"]
            [term] = spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
            keys = {e["key"] for e in term["matchExpressions"]}
            assert keys <= {"nvidia.com/gpu.product", "nvidia.com/gpu.memory"} and keys, term
            assert "nodeSelector" not in spec or "gpu-type" not in spec["nodeSelector"], "no hand labels needed"
        # The seed's plain Pod, with no class: any node with a GPU (no default in the example rules).
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(gpu_pod("cuda-gpu-test")))
        node = wait_scheduled(cluster, namespace, "cuda-gpu-test")
        listed = json.loads(cluster.kubectl("get", "node", node, "-o", "json").stdout)
        assert int(listed["status"]["allocatable"].get(GPU, "0")) >= 1
        # A class no node has stays Pending, as the webhook's warning said.
        result = cluster.kubectl("apply", "-n", namespace, "-f", "-",
                                 input=yaml.safe_dump(gpu_pod("b200", 1, {"gpu-webhook.io/gpu-type": "b200"})))
        assert "[gpu-class-no-node]" in result.stderr, result.stderr
        wait_until(lambda: any(c.get("reason") == "Unschedulable" for c in
                               pod_json(cluster, namespace, "b200")["status"].get("conditions", [])), 30,
                   "the b200 Pod to be reported Unschedulable")
