"""The server with cluster awareness over the Nodes of a real H200 run (tests/data/real-h200): the seed's Pod,
as the API server sent it, is not given a gpu-type no live node has, and two replicas of a time-sliced GPU are
denied at admission, at /mutate and /validate alike."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask import Flask
from prometheus_client import CollectorRegistry
from support.cluster_api import CLAIMS, NAMESPACES, NODES, RUNTIME_CLASSES, FakeClock, wait_synced
from support.kube_replay import Json, ReplayServer, Stream, load
from test_app_inventory import answer

from webhook.admission.app import create_app
from webhook.admission.settings import Settings
from webhook.cluster import kube

TESTS = Path(__file__).parents[1]
REAL = TESTS / "data" / "real-h200"
SEED_REVIEW = TESTS / "e2e" / "captured" / "pod-create-cuda-gpu-test.mutating-first.json"


def serve_real(server: ReplayServer, node: str) -> None:
    nodes = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "900"},
             "items": [json.loads((REAL / f"{node}.json").read_text())]}
    server.route(NODES, list=[Json(nodes)], watch=[Stream()])
    server.route(NAMESPACES, list=[Json(load("namespaces.json"))], watch=[Stream()])
    server.route(RUNTIME_CLASSES, list=[Json(load("runtimeclasses.json"))], watch=[Stream()])
    server.route(CLAIMS.format("v1"), list=[Json(load("resourceclaimtemplates-v1.json"))], watch=[Stream()])


@pytest.fixture(params=["node-h200", "node-h200-timesliced"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Flask]]:
    with ReplayServer() as server:
        serve_real(server, request.param)
        api = kube.api_client(str(server.kubeconfig(tmp_path / "kubeconfig")), environ={})
        inventory = kube.ClusterInventory(api, clock=FakeClock(), watch_seconds=1, backoff=(0.05, 0.2))
        inventory.start()
        try:
            wait_synced(server, inventory)
            yield request.param, create_app(Settings(rules_poll_seconds=0), registry=CollectorRegistry(),
                                            inventory=inventory)
        finally:
            inventory.stop()
            api.close()


def seed_review(gpus: str = "1") -> dict[str, Any]:
    document: dict[str, Any] = json.loads(SEED_REVIEW.read_text())
    container = document["request"]["object"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    return document


def test_the_seed_pod_keeps_what_the_live_node_has_and_validate_agrees(app: tuple[str, Flask]) -> None:
    _, server = app
    document = seed_review()
    mutated = answer(server, "/mutate", document)
    assert mutated["allowed"] is True
    patched = jsonpatch.apply_patch(document["request"]["object"], json.loads(base64.b64decode(mutated["patch"])))
    assert patched["spec"]["nodeSelector"] == {"workload": "inference"}, "gpu-type t4 held back"
    assert any(w.startswith("[gpu-class-skipped] gpu-type t4 not applied (from the cluster")
               and w.endswith("add gpu-type value h200 to the rules, as the default")
               for w in mutated["warnings"]), mutated["warnings"]
    final = copy.deepcopy(document)
    final["request"]["object"] = patched
    validated = answer(server, "/validate", final)
    assert validated["allowed"] is True, validated


def test_two_replicas_of_a_time_sliced_gpu_are_denied(app: tuple[str, Flask]) -> None:
    node, server = app
    for path in ("/mutate", "/validate"):
        result = answer(server, path, seed_review("2"))
        if node == "node-h200-timesliced":
            assert result["allowed"] is False
            assert result["status"]["message"].startswith("[gpu-time-sliced-max] spec.containers[0] (cuda): asks for "
                                                          "2 nvidia.com/gpu, but every node the Pod can land on shares")
            assert result["status"]["message"].endswith("ask for 1, or pick a class of whole GPUs")
        else:  # one whole GPU: never schedulable, not a time-slicing matter
            assert result["allowed"] is False and "[gpu-never-schedulable]" in result["status"]["message"]
