"""The server with cluster awareness: the Flask app over a live inventory fed by a replayed Kubernetes API."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from prometheus_client import CollectorRegistry
from support.admission import body, review
from support.cluster_api import FakeClock, node_list, serve_cluster, wait_synced
from support.kube_replay import Hang, Json, ReplayServer, status

from webhook.admission.app import create_app
from webhook.admission.settings import Settings, SettingsError
from webhook.cluster import kube

NODES = "/api/v1/nodes"


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


def app_over(server: ReplayServer, tmp_path: Path) -> tuple[Flask, kube.ClusterInventory]:
    api = kube.api_client(str(server.kubeconfig(tmp_path / "kubeconfig")), environ={})
    inventory = kube.ClusterInventory(api, clock=FakeClock(), watch_seconds=1, backoff=(0.05, 0.2))
    inventory.start()
    app = create_app(Settings(rules_poll_seconds=0), registry=CollectorRegistry(), inventory=inventory)
    return app, inventory


def gpu_pod_review(gpus: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    document = review("pod-create-limits-only-defaulted")
    container = document["request"]["object"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    document["request"]["object"]["metadata"]["labels"] = labels or {}
    return document


def answer(app: Flask, path: str, document: dict[str, Any]) -> dict[str, Any]:
    response = app.test_client().post(path, data=body(document), content_type="application/json")
    assert response.status_code == 200, response.data
    result: dict[str, Any] = response.get_json()["response"]
    return result


def test_never_schedulable_is_denied_with_the_evidence(replay: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(replay)
    app, inventory = app_over(replay, tmp_path)
    try:
        wait_synced(replay, inventory)
        labels = {"gpu-webhook.io/workload": "training", "gpu-webhook.io/gpu-type": "a100"}
        denied = answer(app, "/mutate", gpu_pod_review("16", labels))
        assert denied["allowed"] is False
        assert "[gpu-never-schedulable]" in denied["status"]["message"]
        assert "8" in denied["status"]["message"]  # the largest Ready training/a100 node has 8
        fits = answer(app, "/mutate", gpu_pod_review("8", labels))
        assert fits["allowed"] is True
        ops = json.loads(base64.b64decode(fits["patch"]))
        assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in ops
        readiness = app.test_client().get("/readyz").get_json()
        assert readiness["checks"]["inventory"] == {  # the replayed API server serves no resource.k8s.io objects
            "synced": True, "dra": {"resourceslices": 0, "deviceclasses": 0, "resourceclaims": 0}}
    finally:
        inventory.stop()


def test_unreachable_api_skips_inventory_checks_and_says_so(replay: ReplayServer, tmp_path: Path) -> None:
    for path in (NODES, "/api/v1/namespaces", "/apis/node.k8s.io/v1/runtimeclasses"):
        replay.route(path, list=[Json(status(503, "ServiceUnavailable", "etcd is down"), code=503)])
    app, inventory = app_over(replay, tmp_path)
    try:
        labels = {"gpu-webhook.io/workload": "training", "gpu-webhook.io/gpu-type": "a100"}
        result = answer(app, "/mutate", gpu_pod_review("2", labels))
        assert result["allowed"] is True  # everything else works as without a cluster
        assert result["patchType"] == "JSONPatch"
        assert any("[gpu-inventory-unavailable]" in w for w in result.get("warnings", []))
        # Unreachable is not refused: once every first list has an answer (here a 503), the replica is ready.
        replay.wait_until(lambda: app.test_client().get("/readyz").status_code == 200, what="ready on the 503s")
    finally:
        inventory.stop()


def test_a_list_refused_at_start_makes_the_replica_unready(replay: ReplayServer, tmp_path: Path) -> None:
    """The ServiceAccount lacks a permission: /readyz is 503 and names the refused list and the fix (a rollout
    stalls while the old replicas serve); reviews are still answered, the inventory checks skipped with a warning."""
    serve_cluster(replay)
    message = 'runtimeclasses.node.k8s.io is forbidden: User "system:serviceaccount:gpu-system:gpu-webhook" cannot list'
    replay.route("/apis/node.k8s.io/v1/runtimeclasses", list=[Json(status(403, "Forbidden", message), code=403)])
    app, inventory = app_over(replay, tmp_path)
    try:
        client = app.test_client()
        # Unready at once ("no answer yet to the initial list of ..."), then for the refusal: wait for the refusal.
        def refused() -> bool:
            checks = (client.get("/readyz").get_json() or {}).get("checks", {})
            return "refused" in str(checks.get("inventory", {}).get("reason", ""))
        replay.wait_until(refused, what="the refusal in /readyz")
        response = client.get("/readyz")
        reason = response.get_json()["checks"]["inventory"]["reason"]
        assert response.status_code == 503
        assert reason.startswith("the API server refused the initial list of runtimeclasses: API server answered "
                                 "403: runtimeclasses.node.k8s.io is forbidden")
        assert "lacks read access" in reason  # the fix: docs/cluster.md, RBAC
        result = answer(app, "/mutate", gpu_pod_review("2", {"gpu-webhook.io/workload": "training"}))
        assert result["allowed"] is True
        assert any("[gpu-inventory-unavailable]" in w for w in result.get("warnings", []))
    finally:
        inventory.stop()


def test_a_first_list_not_yet_answered_keeps_the_replica_unready(replay: ReplayServer, tmp_path: Path) -> None:
    """Until every first list has an answer the replica is unready, so the kubelet's first probe cannot find a new
    replica Ready a moment before its refusal shows (a rollout would go on); the answer makes it ready."""
    serve_cluster(replay)
    replay.route(NODES, list=[Hang(1.5, Json(node_list()))])
    app, inventory = app_over(replay, tmp_path)
    try:
        client = app.test_client()
        replay.wait_until(lambda: bool(replay.seen(NODES)), what="the node list to be asked")
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.get_json()["checks"]["inventory"]["reason"] == "no answer yet to the initial list of nodes"
        replay.wait_until(lambda: client.get("/readyz").status_code == 200, what="ready once the list is answered")
    finally:
        inventory.stop()


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param(None, False, id="unset-off"),
    pytest.param("true", True, id="true"),
    pytest.param("ON", True, id="on"),
    pytest.param("0", False, id="zero"),
])
def test_cluster_setting(value: str | None, expected: bool) -> None:
    env = {} if value is None else {"GPU_WEBHOOK_CLUSTER": value}
    assert Settings.from_env(env).cluster is expected


def test_cluster_setting_refuses_nonsense() -> None:
    with pytest.raises(SettingsError, match="GPU_WEBHOOK_CLUSTER='maybe': expected true or false"):
        Settings.from_env({"GPU_WEBHOOK_CLUSTER": "maybe"})


def _patched(document: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    import jsonpatch

    patched = json.loads(json.dumps(document))
    if "patch" in result:
        ops = json.loads(base64.b64decode(result["patch"]))
        patched["request"]["object"] = jsonpatch.apply_patch(document["request"]["object"], ops)
    return patched


@pytest.mark.parametrize("cluster", ["synced", "unreachable"])
def test_inventory_warnings_read_the_same_at_both_endpoints(replay: ReplayServer, tmp_path: Path,
                                                            cluster: str) -> None:
    """Both webhooks judge the same Pod against the inventory. Their warnings carry the same text, so the API
    server, which drops exact duplicates, shows the developer each one once."""
    if cluster == "synced":
        serve_cluster(replay)
    else:
        for path in (NODES, "/api/v1/namespaces", "/apis/node.k8s.io/v1/runtimeclasses"):
            replay.route(path, list=[Json(status(503, "ServiceUnavailable", "etcd is down"), code=503)])
    app, inventory = app_over(replay, tmp_path)
    try:
        if cluster == "synced":
            wait_synced(replay, inventory)
        document = gpu_pod_review("1", {"gpu-webhook.io/workload": "training", "gpu-webhook.io/gpu-type": "t4"})
        mutated = answer(app, "/mutate", document)
        validated = answer(app, "/validate", _patched(document, mutated))
        assert mutated["allowed"] and validated["allowed"]
        assert mutated.get("warnings") and mutated.get("warnings") == validated.get("warnings")
    finally:
        inventory.stop()


def test_the_synced_gauge_follows_the_inventory_without_reviews(replay: ReplayServer, tmp_path: Path) -> None:
    """gpu_webhook_inventory_synced is 1 once the inventory has synced, with no review answered (a worker that
    answers none must not keep saying 0)."""
    serve_cluster(replay)
    api = kube.api_client(str(replay.kubeconfig(tmp_path / "kubeconfig")), environ={})
    inventory = kube.ClusterInventory(api, clock=FakeClock(), watch_seconds=1, backoff=(0.05, 0.2))
    registry = CollectorRegistry()
    inventory.start()
    try:
        create_app(Settings(rules_poll_seconds=0), registry=registry, inventory=inventory)
        wait_synced(replay, inventory)
        deadline = time.monotonic() + 10
        while registry.get_sample_value("gpu_webhook_inventory_synced") != 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert registry.get_sample_value("gpu_webhook_inventory_synced") == 1.0
    finally:
        inventory.stop()
