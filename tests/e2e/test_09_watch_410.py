"""Scenario 9: watch robustness. etcd is compacted while the API server restarts, so the webhook's inventory
watches resume from a resourceVersion the new API server no longer has and get `410 Gone` in the watch stream.
The inventory relists (the Nodes' watch and the DRA inventory's alike) and stays synced: it sees changes made
after the relist, and /readyz and the synced gauge say so.

The webhook is frozen (SIGSTOP) while the API server is down so that its first call afterwards is the resumed
watch (a relist for another reason would hide the 410).
"""

from __future__ import annotations

import json
import re
import signal
from typing import Any

import pytest
from cluster import Cluster, compact_etcd, gpu_pod, signal_group, wait_until, webhook_readyz
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.e2e


def _set_t4_gpus(core: Any, count: str) -> None:
    for node in ("gpu-t4-0", "gpu-t4-1"):
        core.patch_node_status(node, {"status": {"capacity": {"nvidia.com/gpu": count},
                                                 "allocatable": {"nvidia.com/gpu": count}}})


def _four_gpu_dry_run(core: Any, namespace: str) -> str:
    try:
        core.create_namespaced_pod(namespace, gpu_pod("four", gpus=4), dry_run="All")
    except ApiException as exc:
        return str(json.loads(exc.body)["message"])
    return "allowed"


def test_inventory_relists_after_410_and_stays_synced(cluster: Cluster, namespace: str) -> None:
    webhook = cluster.procs["gpu-webhook"]
    offset = webhook.log.stat().st_size
    assert webhook_readyz(cluster)["checks"]["inventory"]["synced"] is True
    revisions: list[int] = []

    signal_group(webhook, signal.SIGSTOP)
    try:
        cluster.restart_apiserver(between=lambda: revisions.append(compact_etcd(cluster)))
    finally:
        signal_group(webhook, signal.SIGCONT)
    assert revisions and revisions[0] > 0

    def expired_logged(source: str = "nodes") -> bool:
        text = webhook.log.read_text(errors="replace")[offset:]
        return bool(re.search(rf"watch of {source} expired \(410 Gone\): relisting", text))

    wait_until(expired_logged, 90, "the inventory's node watch to get 410 Gone and relist")
    # The DRA inventory's watches take the same path (webhook/cluster/kube.py).
    wait_until(lambda: expired_logged("resourceslices") and expired_logged("resourceclaims"), 30,
               "the inventory's ResourceSlice and ResourceClaim watches to get 410 Gone and relist")
    wait_until(lambda: webhook_readyz(cluster)["checks"]["inventory"]["synced"] is True, 30,
               "the inventory to report synced after the relist")

    # The relisted inventory keeps following the cluster through its new watch.
    core = client.CoreV1Api(cluster.api())
    assert _four_gpu_dry_run(core, namespace) == "allowed"
    _set_t4_gpus(core, "2")
    try:
        message = str(wait_until(lambda: (m := _four_gpu_dry_run(core, namespace)) != "allowed" and m, 30,
                                 "the inventory to see the T4 nodes shrink"))
        assert "[gpu-never-schedulable]" in message, message
    finally:
        _set_t4_gpus(core, "4")
    wait_until(lambda: _four_gpu_dry_run(core, namespace) == "allowed", 30, "the inventory to see them restored")
    assert re.search(r"^gpu_webhook_inventory_synced(\{[^}]*\})? 1\.0$", cluster.webhook_metrics(), re.M)
