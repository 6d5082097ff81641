"""webhook.cluster.kube end to end against a local API server replaying recorded-style responses: kubeconfig like
kubectl, list then watch, watch events, 410 Gone (HTTP and ERROR event), dropped connections, pages,
forbidden and absent APIs, staleness when the API server is unreachable, and a snapshot that never waits."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support.cluster_api import (
    CLAIMS,
    DRA,
    NAMESPACES,
    NODES,
    FakeClock,
    node,
    node_list,
    running,
    serve_cluster,
    wait_synced,
)
from support.kube_replay import Hang, Json, ReplayServer, Stream, event, expired, status

from webhook.cluster import kube, reads


def allocatable(inventory: kube.ClusterInventory, name: str) -> dict[str, int] | None:
    found = next((n for n in inventory.snapshot().nodes if n.name == name), None)
    return dict(found.allocatable) if found else None


# --------------------------------------------------------------------------------------------- kubeconfig


def test_kubeconfig_like_kubectl(server: ReplayServer, tmp_path: Path) -> None:
    path = server.kubeconfig(tmp_path / "config")
    explicit = kube.api_client(str(path), environ={})
    assert explicit.configuration.host == server.url
    from_env = kube.api_client(None, environ={"KUBECONFIG": str(path)})
    assert from_env.configuration.host == server.url
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    server.kubeconfig(home / ".kube" / "config", namespace="team-a")
    assert kube.api_client(None, environ={"HOME": str(home)}).configuration.host == server.url
    assert kube.context_namespace(None, environ={"HOME": str(home)}) == "team-a"
    assert kube.context_namespace(str(path), environ={}) == "ml-research"
    assert kube.context_namespace(str(path), "other", environ={}) == "ml-serving"
    with pytest.raises(kube.KubeError, match="no kubeconfig found"):
        kube.api_client(None, environ={"HOME": str(tmp_path / "nowhere")})
    with pytest.raises(kube.KubeError, match="cannot load"):
        kube.api_client(str(tmp_path / "missing.yaml"), environ={})
    serve_cluster(server)
    reads.read_snapshot(explicit)
    assert server.seen(NAMESPACES)[0].headers["authorization"] == "Bearer replay-token"
    for api in (explicit, from_env):
        api.close()


# --------------------------------------------------------------------------------------------- list and watch


def test_lists_then_watches_and_applies_events(server: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(server, claims_version="v1beta1")
    first, second = node_list(), node_list()
    first["items"], second["items"] = first["items"][:4], second["items"][4:]
    first["metadata"]["continue"] = "page-2"
    server.route(NODES, list=[Json(first), Json(second)], watch=[
        Stream([event("MODIFIED", node("a100-2", "5201", gpus="8")),
                event("DELETED", node("cpu-1", "5202")),
                event("BOOKMARK", {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "5250"}})],
               end="close"),
        Stream([event("ADDED", {**node("a100-1", "5260"), "metadata": {
            **node("a100-1", "5260")["metadata"], "name": "a100-3"}})]),
    ])
    with running(server, tmp_path) as inventory:
        wait_synced(server, inventory)
        server.wait_until(lambda: allocatable(inventory, "a100-3") is not None, what="the ADDED node")
        snapshot = inventory.snapshot()
        assert allocatable(inventory, "a100-2") == {"nvidia.com/gpu": 8}
        assert allocatable(inventory, "cpu-1") is None
        assert len(snapshot.nodes) == 9
        assert snapshot.namespace_labels("ml-research") == {"kubernetes.io/metadata.name": "ml-research",
                                                             "team-type": "research"}
        assert set(snapshot.runtime_classes) == {"nvidia", "kata-gpu"}
        assert snapshot.claim_templates[("ml-research", "single-gpu")].device_classes == ("gpu.nvidia.com",)
        assert inventory.snapshot() is snapshot, "unchanged caches: the same snapshot object"
    pages = server.seen(NODES, watch=False)
    assert [p.query.get("continue") for p in pages] == [None, "page-2"]
    watches = server.seen(NODES, watch=True)
    assert watches[0].query["resourceVersion"] == "5200" and watches[0].query["allowWatchBookmarks"] == "true"
    assert watches[1].query["resourceVersion"] == "5250", "a clean end resumes from the bookmark"
    assert len(pages) == 2, "no relist"
    assert [r.path for r in server.requests if "resourceclaimtemplates" in r.path][:3] == [
        CLAIMS.format("v1"), CLAIMS.format("v1beta2"), CLAIMS.format("v1beta1")], "newest API version first"


@pytest.mark.parametrize(
    "gone",
    [
        pytest.param(Stream([expired()], end="close"), id="error-event"),
        pytest.param(Json(status(410, "Expired", "too old resource version: 5200 (9100)"), 410), id="http-410"),
    ],
)
def test_410_gone_relists(server: ReplayServer, tmp_path: Path, gone: Json | Stream) -> None:
    serve_cluster(server)
    server.route(NODES, list=[Json(node_list()), Json(node_list("a100-1", "t4-1", resource_version="9100"))],
                 watch=[gone, Stream()])
    with running(server, tmp_path) as inventory:
        server.wait_until(lambda: len(inventory.snapshot().nodes) == 2, what="the relisted nodes")
        wait_synced(server, inventory)
        server.wait_until(lambda: len(server.seen(NODES, watch=True)) >= 2, what="the watch after the relist")
    lists = server.seen(NODES, watch=False)
    assert len(lists) == 2 and "resourceVersion" not in lists[1].query, "a relist reads the latest state"
    assert server.seen(NODES, watch=True)[1].query["resourceVersion"] == "9100"
    assert inventory.status()["nodes"]["relists"] == 2


def test_dropped_connection_resumes_the_watch(server: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(server)
    server.route(NODES, list=[Json(node_list())], watch=[
        Stream([event("MODIFIED", node("t4-1", "5301", gpus="2"))], end="drop"),
        Stream([event("MODIFIED", node("t4-1", "5302", gpus="3"))]),
    ])
    with running(server, tmp_path) as inventory:
        server.wait_until(lambda: allocatable(inventory, "t4-1") == {"nvidia.com/gpu": 3}, what="the second event")
        wait_synced(server, inventory)
    watches = server.seen(NODES, watch=True)
    assert watches[1].query["resourceVersion"] == "5301", "resumed from the last event seen"
    assert len(server.seen(NODES, watch=False)) == 1, "a drop is not a reason to relist"


def test_unreachable_api_server_goes_stale_and_recovers(server: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(server)
    clock = FakeClock()
    with running(server, tmp_path, clock) as inventory:
        wait_synced(server, inventory)
        before = inventory.snapshot()
        server.down = True
        time.sleep(0.3)  # the held watches are cut; reconnecting fails
        clock.now += 120
        assert inventory.snapshot().synced, "within the staleness bound the last state is still trusted"
        clock.now += 100
        stale = inventory.snapshot()
        assert not stale.synced and "no answer from the API server" in stale.reason
        assert stale.nodes == before.nodes, "the last known state is kept"
        server.down = False
        wait_synced(server, inventory)
        assert inventory.synced


def test_periodic_resync_relists(server: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(server)
    server.route(NODES, list=[Json(node_list()), Json(node_list("t4-1", resource_version="8000"))],
                 watch=[Stream()])
    clock = FakeClock()
    with running(server, tmp_path, clock, resync_seconds=600.0) as inventory:
        wait_synced(server, inventory)
        assert len(inventory.snapshot().nodes) == 9
        clock.now += 601
        server.wait_until(lambda: len(inventory.snapshot().nodes) == 1, timeout=10, what="the resync relist")


def test_snapshot_never_waits_on_the_api_server(server: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(server)
    server.route(NODES, list=[Hang(1.0, Json(node_list()))])
    with running(server, tmp_path) as inventory:
        server.wait_until(lambda: bool(server.seen(NODES)), what="the node list to be asked")
        started = time.monotonic()
        snapshot = inventory.snapshot()
        assert time.monotonic() - started < 0.1
        assert not snapshot.synced and snapshot.reason == "no answer yet to the initial list of nodes"
        assert snapshot.namespace_labels("ml-research") is None


@pytest.mark.parametrize(
    ("path", "code", "synced", "reason"),
    [
        pytest.param(CLAIMS.format("v1"), 403, True, "", id="dra-forbidden-is-optional"),
        pytest.param(NODES, 403, False, "the API server refused the initial list of nodes: API server answered 403",
                     id="nodes-forbidden"),
        pytest.param(NODES, 500, False, "initial list of nodes pending: API server answered 500", id="nodes-error"),
    ],
)
def test_failing_lists(server: ReplayServer, tmp_path: Path, path: str, code: int, synced: bool,
                       reason: str) -> None:
    serve_cluster(server)
    message = 'nodes is forbidden: User "system:serviceaccount:gpu-system:gpu-webhook" cannot list resource'
    server.route(path, list=[Json(status(code, "Forbidden" if code == 403 else "InternalError", message), code)])
    with running(server, tmp_path) as inventory:
        if synced:
            wait_synced(server, inventory)
            assert inventory.status()["resourceclaimtemplates"]["absent"]
            assert inventory.snapshot().claim_templates == {}
        else:
            server.wait_until(lambda: len(server.seen(path)) >= 2, what="a retry")
            snapshot = inventory.snapshot()
            assert not snapshot.synced and snapshot.reason.startswith(reason)


# --------------------------------------------------------------------------------------------- node index


def test_node_events_update_the_index_and_leave_earlier_snapshots_alone() -> None:
    """Node events go into the node index one at a time: a snapshot handed to a review before an event keeps
    answering for its own moment, the next one sees the event, and a relist builds a new index that tracks the
    questions reviews asked of the old one."""
    from webhook.policy import inventory as inv

    nodes = kube.Source("nodes", "Node", (), inv.node_from_api)
    cache = kube.ClusterInventory(None, source_list=(nodes,))  # type: ignore[arg-type]
    [state] = cache._caches
    cache._replace(state, [inv.node_from_api(node(n, "1")) for n in ("a100-1", "a100-2", "t4-1")], "1")
    a100 = inv.Placement({"gpu-type": "a100"}, ({"key": "nvidia.com/gpu", "operator": "Exists"},), None, None,
                         False)
    before = cache.snapshot()
    assert inv.capacity_findings(before, a100, "nvidia.com/gpu", 8, "a100") == []
    assert cache.snapshot() is not before, "the question asked is tracked from the next snapshot on"
    tracked = cache.snapshot()
    assert len(tracked.index.summaries) == 1
    assert cache.snapshot() is tracked, "nothing changed: the same snapshot object"

    cache._apply(state, event("MODIFIED", node("a100-1", "2", gpus="4")))
    after = cache.snapshot()
    [finding] = inv.capacity_findings(after, a100, "nvidia.com/gpu", 8, "a100")
    assert finding[0] == "gpu-never-schedulable" and "offers 4 (a100-2; 2 nodes match)" in finding[1]
    assert inv.capacity_findings(tracked, a100, "nvidia.com/gpu", 8, "a100") == [], "the earlier snapshot"
    assert dict(tracked.index.nodes["a100-1"].allocatable) == {"nvidia.com/gpu": 8}

    cache._apply(state, event("DELETED", node("a100-1", "3")))
    cache._apply(state, event("DELETED", node("a100-2", "3")))
    [finding] = inv.capacity_findings(cache.snapshot(), a100, "nvidia.com/gpu", 1, "a100")
    assert finding[0] == "gpu-class-no-node"

    cache._replace(state, [inv.node_from_api(node("a100-2", "9"))], "9")
    relisted = cache.snapshot()
    [summary] = relisted.index.summaries.values()
    assert summary.first == ("a100-2",), "tracked across the relist"
    assert inv.capacity_findings(relisted, a100, "nvidia.com/gpu", 4, "a100") == []
    assert cache.status()["nodes"]["items"] == 1


# --------------------------------------------------------------------------------------------- DRA


def _dra_list(resource_version: str, *items: Json) -> Json:
    return Json({"kind": "List", "apiVersion": "resource.k8s.io/v1", "items": list(items),
                 "metadata": {"resourceVersion": resource_version}})


def _slice(name: str, node: str, product: str, resource_version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": resource_version}, "spec": {
        "driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node}, "devices": [
            {"name": f"gpu-{i}", "attributes": {"productName": {"string": product}}} for i in range(8)]}}


def test_dra_objects_are_listed_watched_and_relisted_after_410(server: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(server)
    server.route(DRA.format("resourceslices"),
                 list=[_dra_list("8000", _slice("a", "h100-0", "NVIDIA H100", "7999")),
                       _dra_list("9100", _slice("a", "h100-0", "NVIDIA H100", "7999"),
                                 _slice("c", "t4-0", "Tesla T4", "9050"))],
                 watch=[Stream([event("ADDED", _slice("b", "h100-1", "NVIDIA H100", "8001")), expired("8001")],
                               end="close"), Stream()])
    server.route(DRA.format("resourceclaims"), list=[_dra_list("8000")], watch=[Stream([event("ADDED", {
        "metadata": {"namespace": "ml", "name": "c1", "resourceVersion": "8002"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}})])])
    with running(server, tmp_path) as inventory:
        def products() -> tuple[Any, ...]:
            return inventory.snapshot().dra.values("gpu.nvidia.com", "productName")
        server.wait_until(lambda: len(products()) == 2, what="the relisted slices")
        wait_synced(server, inventory)
        snapshot = inventory.snapshot()
        assert [(v.value, v.nodes, v.devices) for v in products()] == [("NVIDIA H100", 1, 8), ("Tesla T4", 1, 8)], \
            "the relist replaced the slice seen only in the expired watch"
        server.wait_until(lambda: inventory.snapshot().dra.claim("ml", "c1") is not None, what="the watched claim")
        assert inventory.status()["resourceslices"]["relists"] == 2
        assert inventory.status()["resourceclaims"]["items"] == 1
        assert snapshot.dra.counts["resourceslices"] == 2
    assert server.seen(DRA.format("resourceslices"), watch=True)[0].query["resourceVersion"] == "8000"


def test_an_absent_dra_api_is_empty_and_never_stale(server: ReplayServer, tmp_path: Path) -> None:
    serve_cluster(server)
    for version in ("v1", "v1beta2", "v1beta1"):
        server.route(f"/apis/resource.k8s.io/{version}/resourceslices",
                     list=[Json(status(403, "Forbidden", "cannot list resourceslices"), 403)])
    clock = FakeClock()
    with running(server, tmp_path, clock) as inventory:
        wait_synced(server, inventory)
        assert inventory.status()["resourceslices"]["absent"]
        clock.now += 100
        server.wait_until(lambda: all(s["seconds_since_contact"] < 50 for s in inventory.status().values()
                                      if not s["absent"]), what="the other watches to be heard from")
        clock.now += 100  # past stale_seconds since the absent list: it is asked again only at the resync
        snapshot = inventory.snapshot()
        assert snapshot.synced, snapshot.reason
        assert snapshot.dra.counts["resourceslices"] == 0
