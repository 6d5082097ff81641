"""A replayed API server that serves a small cluster, for the inventory's tests (tests/cluster) and the server's
with cluster awareness (tests/admission)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.kube_replay import Json, ReplayServer, Stream, load
from webhook.cluster import kube

NODES = "/api/v1/nodes"
NAMESPACES = "/api/v1/namespaces"
RUNTIME_CLASSES = "/apis/node.k8s.io/v1/runtimeclasses"
CLAIMS = "/apis/resource.k8s.io/{}/resourceclaimtemplates"
DRA = "/apis/resource.k8s.io/v1/{}"
DRA_KINDS = ("resourceslices", "deviceclasses", "resourceclaims")


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node_list(*names: str, resource_version: str = "5200") -> dict[str, Any]:
    data = load("nodes.json")
    if names:
        data["items"] = [n for n in data["items"] if n["metadata"]["name"] in names]
    data["metadata"]["resourceVersion"] = resource_version
    return data


def node(name: str, resource_version: str, gpus: str | None = None) -> dict[str, Any]:
    found = copy.deepcopy(next(n for n in load("nodes.json")["items"] if n["metadata"]["name"] == name))
    found["metadata"]["resourceVersion"] = resource_version
    if gpus is not None:
        found["status"]["allocatable"]["nvidia.com/gpu"] = gpus
    return found


def serve_cluster(server: ReplayServer, *, claims_version: str = "v1") -> None:
    """Every watched collection listed and then watched quietly (held until timeoutSeconds)."""
    server.route(NODES, list=[Json(node_list())], watch=[Stream()])
    server.route(NAMESPACES, list=[Json(load("namespaces.json"))], watch=[Stream()])
    server.route(RUNTIME_CLASSES, list=[Json(load("runtimeclasses.json"))], watch=[Stream()])
    fixture = "resourceclaimtemplates-v1.json" if claims_version == "v1" else "resourceclaimtemplates-v1beta1.json"
    server.route(CLAIMS.format(claims_version), list=[Json(load(fixture))], watch=[Stream()])
    for plural in DRA_KINDS:  # served empty, as by a cluster without a DRA driver
        server.route(DRA.format(plural), list=[Json({"kind": "List", "apiVersion": "resource.k8s.io/v1", "items": [],
                                                     "metadata": {"resourceVersion": "7600"}})], watch=[Stream()])


@contextmanager
def running(server: ReplayServer, tmp_path: Path, clock: FakeClock | None = None,
            **options: Any) -> Iterator[kube.ClusterInventory]:
    api = kube.api_client(str(server.kubeconfig(tmp_path / "kubeconfig")), environ={})
    settings: dict[str, Any] = {"watch_seconds": 1, "resync_seconds": 3600.0, "stale_seconds": 180.0,
                                "backoff": (0.05, 0.2)}
    settings.update(options)
    inventory = kube.ClusterInventory(api, clock=clock or FakeClock(), **settings)
    inventory.start()
    try:
        yield inventory
    finally:
        inventory.stop()
        api.close()


def wait_synced(server: ReplayServer, inventory: kube.ClusterInventory) -> None:
    server.wait_until(lambda: inventory.snapshot().synced, what="the inventory to sync")
