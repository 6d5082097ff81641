"""Scenario 14: cluster awareness follows a GPU pool of a few hundred kwok nodes through the real API server.

A pool of `POOL` A100 nodes (kwok keeps them Ready) is the only place a pinned Pod (its own nodeSelector
`e2e-pool=scale14`, class training/a100, 8 GPUs) can run. The webhook must follow the pool through its watch:

- the pool exists: the Pod passes (server-side dry run: the webhook is called, nothing is stored);
- every node of the pool drops to 4 GPUs: the Pod is denied as never schedulable, naming the largest node;
- the pool is scaled to zero: the Pod is warned that its class matches no node, with the cause (the other
  GPU nodes match none of its labels);
- the pool comes back: the Pod passes again.

The pool's nodes are deleted at the end, so the other scenarios see the seed's five nodes only.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import GPU, GPU_TAINT, KWOK_ANNOTATION, Cluster, gpu_pod, wait_until, yaml_of
from kubernetes import client

pytestmark = pytest.mark.e2e

POOL = 300
POOL_LABEL = "e2e-pool"
TRAINING = {"gpu-webhook.io/workload": "training", "gpu-webhook.io/gpu-type": "a100"}


def pool_nodes(count: int, gpus: int = 8) -> list[dict[str, Any]]:
    """`count` kwok-managed A100 nodes with GPU Feature Discovery's labels and the GPU taint."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    nodes = []
    for i in range(count):
        name = f"scale14-a100-{i:04d}"
        capacity = {"cpu": "96", "memory": "1024Gi", "pods": "110", GPU: str(gpus)}
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"}, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                POOL_LABEL: "scale14", "gpu-type": "a100", "workload": "training",
                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.sharing-strategy": "none"}},
            "spec": {"taints": [dict(GPU_TAINT)]},
            "status": {"capacity": capacity, "allocatable": dict(capacity),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kwok-managed fake node", "lastHeartbeatTime": now,
                                       "lastTransitionTime": now}]},
        })
    return nodes


def _pinned_dry_run(cluster: Cluster, namespace: str) -> tuple[int, str]:
    pod = gpu_pod("pinned", gpus=8, labels=TRAINING, node_selector={POOL_LABEL: "scale14"})
    done = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml_of(pod),
                           check=False)
    return done.returncode, done.stderr


def _until(cluster: Cluster, namespace: str, wanted: str, what: str) -> tuple[str, float]:
    """Dry-run the pinned Pod until the webhook's answer contains `wanted` ("" = created with no warning)."""
    began = time.monotonic()

    def acted() -> str | None:
        code, stderr = _pinned_dry_run(cluster, namespace)
        if wanted:
            return stderr if wanted in stderr else None
        return "created" if code == 0 and "Warning" not in stderr else None

    answer = wait_until(acted, 60, what, interval=0.25)
    return str(answer), time.monotonic() - began


def _delete_pool(cluster: Cluster) -> None:
    """All of the pool's nodes in one call (kubectl deletes one at a time), then wait until they are gone."""
    core = client.CoreV1Api(cluster.api())
    core.delete_collection_node(label_selector=f"{POOL_LABEL}=scale14")
    wait_until(lambda: not core.list_node(label_selector=f"{POOL_LABEL}=scale14", limit=1).items, 120,
               "the pool's nodes to be deleted")


@pytest.fixture
def pool(cluster: Cluster) -> Iterator[None]:
    yield
    _delete_pool(cluster)


def _set_gpus(cluster: Cluster, count: int) -> None:
    core = client.CoreV1Api(cluster.api())
    for i in range(POOL):
        core.patch_node_status(f"scale14-a100-{i:04d}", {"status": {"capacity": {GPU: str(count)},
                                                                     "allocatable": {GPU: str(count)}}})


def test_a_gpu_pool_scaled_to_zero_and_back(cluster: Cluster, namespace: str, pool: None) -> None:
    _until(cluster, namespace, "[gpu-class-no-node]", "the pinned Pod warned before its pool exists")

    cluster.kubectl("create", "-f", "-", input=yaml_of(*pool_nodes(POOL)))
    _until(cluster, namespace, "", f"the pinned Pod to pass once the {POOL} nodes are watched")

    _set_gpus(cluster, 4)
    denied, _ = _until(cluster, namespace, "[gpu-never-schedulable]", "the pool at 4 GPUs a node")
    assert "offers 4 (scale14-a100-0299; 300 nodes match)" in denied, denied

    _set_gpus(cluster, 8)
    _until(cluster, namespace, "", "the pool back at 8 GPUs a node")

    _delete_pool(cluster)
    warned, _ = _until(cluster, namespace, "[gpu-class-no-node]", "the pool scaled to zero")
    # The API server shortens a warning; its end still says which cause was found (no node matches the labels).
    assert warned.rstrip().endswith("pick the class you meant with the class labels"), warned

    cluster.kubectl("create", "-f", "-", input=yaml_of(*pool_nodes(POOL)))
    _until(cluster, namespace, "", "the pool back")
