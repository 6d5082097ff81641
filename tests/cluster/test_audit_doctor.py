"""`gpu-webhook audit` and `gpu-webhook doctor` end to end: the CLI, a kubeconfig, and a local API server
replaying a small GPU cluster (tests/data/kube/); human and JSON output and the exit codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.kube_replay import DATA, Computed, Json, ReplayServer, Request, load

from webhook.cli import main as cli

PROPOSED = DATA / "rules-proposed"
# plural -> (URL prefix, fixture); a missing fixture is an empty list
COLLECTIONS = {
    "pods": ("/api/v1", "pods.json"),
    "deployments": ("/apis/apps/v1", "deployments.json"),
    "statefulsets": ("/apis/apps/v1", None),
    "daemonsets": ("/apis/apps/v1", "daemonsets.json"),
    "replicasets": ("/apis/apps/v1", "replicasets.json"),
    "jobs": ("/apis/batch/v1", "jobs.json"),
    "cronjobs": ("/apis/batch/v1", None),
}
EVENTS = [*load("events-big-infer.json")["items"], *load("events-train-rs.json")["items"]]


def listing(items: list[dict[str, Any]]) -> Json:
    return Json({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "8300"}, "items": items})


def events(request: Request) -> Json:
    """Events of one namespace filtered by `involvedObject.kind=K,involvedObject.name=N`, as the API server does."""
    namespace = request.path.split("/")[4]
    wanted = dict(part.split("=", 1) for part in request.query.get("fieldSelector", "").split(",") if part)
    return listing([e for e in EVENTS if e["metadata"]["namespace"] == namespace
                    and all(e["involvedObject"][k.split(".")[1]] == v for k, v in wanted.items())])


def serve(server: ReplayServer) -> None:
    """Every collection (all namespaces, per namespace and per object) and the inventory lists."""
    server.route("/api/v1/nodes", list=[Json(load("nodes.json"))])
    server.route("/api/v1/namespaces", list=[Json(load("namespaces.json"))])
    server.route("/apis/node.k8s.io/v1/runtimeclasses", list=[Json(load("runtimeclasses.json"))])
    server.route("/apis/resource.k8s.io/v1/resourceclaimtemplates", list=[Json(load("resourceclaimtemplates-v1.json"))])
    namespaces = [n["metadata"]["name"] for n in load("namespaces.json")["items"]]
    for namespace in namespaces:
        server.route(f"/api/v1/namespaces/{namespace}/events", list=[Computed(events)])
    for plural, (prefix, fixture) in COLLECTIONS.items():
        items = load(fixture)["items"] if fixture else []
        server.route(f"{prefix}/{plural}", list=[listing(items)])
        for namespace in namespaces:
            mine = [i for i in items if i["metadata"]["namespace"] == namespace]
            server.route(f"{prefix}/namespaces/{namespace}/{plural}", list=[listing(mine)])
            for item in mine:
                server.route(f"{prefix}/namespaces/{namespace}/{plural}/{item['metadata']['name']}", list=[Json(item)])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ReplayServer, str]]:
    with ReplayServer() as server:
        serve(server)
        yield server, str(server.kubeconfig(tmp_path / "kubeconfig"))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------------------------- audit


def test_audit_all_namespaces_human(cluster: tuple[ReplayServer, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code, out, _ = run(capsys, "audit", "-A", "--kubeconfig", kubeconfig)
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "RULE", "EFFECT", "COUNT", "OBJECTS"]
    assert lines[1].split() == ["ml-research", "gpu-env-without-request", "warn", "1", "Pod/notebook"]
    assert lines[2].split() == ["ml-serving", "gpu-never-schedulable", "deny", "1", "Pod/big-infer"]
    assert ("  ml-serving Pod/big-infer: [gpu-never-schedulable] the Pod asks for 6 nvidia.com/gpu but the largest "
            "Ready node of class workload=inference,gpu-type=t4 (nodeSelector gpu-type=t4, workload=inference) offers "
            "4 (t4-shared-1; 2 nodes match)") in out
    assert "1 would be denied, 1 with warnings" in out and "inventory synced" in out
    assert "7 object(s) judged" in out, "Pods of judged workloads, owned ReplicaSets and finished Pods are skipped"


def test_audit_proposed_rules_json(cluster: tuple[ReplayServer, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code, out, _ = run(capsys, "audit", "-A", "--kubeconfig", kubeconfig, "--rules", str(PROPOSED), "-o", "json")
    assert code == 1
    report = json.loads(out)
    groups = {(g["namespace"], g["rule"]): g["objects"] for g in report["groups"]}
    assert groups[("ml-research", "gpu-class-not-allowed")] == ["Deployment/embed"], "namespace labels from the cluster"
    assert groups[("ml-serving", "gpu-never-schedulable")] == ["Pod/big-infer"]
    assert report["summary"]["denied"] == 2 and report["inventory"] == {"synced": True}
    embed = next(o for o in report["objects"] if o["name"] == "embed")
    assert embed["violations"][0]["message"].startswith("namespace ml-research may not use gpu-type t4")


def test_audit_one_namespace_from_the_context(cluster: tuple[ReplayServer, str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    server, kubeconfig = cluster
    code, out, _ = run(capsys, "audit", "--kubeconfig", kubeconfig)
    assert code == 0, out
    assert "ml-serving" not in out and "Pod/notebook" in out
    assert server.seen("/api/v1/namespaces/ml-research/pods"), "the kubeconfig context's namespace"
    code, out, _ = run(capsys, "audit", "-n", "ml-serving", "--kubeconfig", kubeconfig, "-o", "json")
    assert code == 1 and json.loads(out)["summary"]["denied"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load /nonexistent/kubeconfig",
                     id="bad-kubeconfig"),
        pytest.param(["--rules", str(DATA.parent / "rules" / "invalid")], "invalid rules", id="bad-rules"),
        pytest.param(["down"], "cannot reach the API server", id="unreachable"),
    ],
)
def test_audit_usage_errors(cluster: tuple[ReplayServer, str], capsys: pytest.CaptureFixture[str],
                            args: list[str], message: str) -> None:
    server, kubeconfig = cluster
    if args == ["down"]:
        server.down, args = True, ["--kubeconfig", kubeconfig]
    elif "--rules" in args:
        args = [*args, "--kubeconfig", kubeconfig]
    code, out, err = run(capsys, "audit", "-A", *args)
    assert code == 2 and message in err and out == ""


# --------------------------------------------------------------------------------------------- doctor


def test_doctor_pending_pod_human(cluster: tuple[ReplayServer, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code, out, _ = run(capsys, "doctor", "big-infer", "-n", "ml-serving", "--kubeconfig", kubeconfig)
    assert code == 1, out
    assert out.startswith("Pod ml-serving/big-infer\n[ok  ] GPU request: the Pod asks for 6 nvidia.com/gpu\n")
    expected = [
        "[ok  ] Advertised: nodes advertise the requested resources",
        "[WARN] Device plugin: the device plugin is not ready on 2 GPU node(s): a100-down, t4-renamed-1; their GPUs "
        "are not (or no longer) advertised",
        "         GPU node t4-renamed-1 has no ready device plugin Pod (allocatable: nvidia.com/gpu.shared=4)",
        "         DaemonSet gpu-operator/nvidia-device-plugin-daemonset: 7 desired, 6 ready",
        "[FAIL] Matching nodes: 3 node(s) match but none offers enough of nvidia.com/gpu: the Pod can never be "
        "scheduled as written",
        "         t4-1: 1 nvidia.com/gpu allocatable, 0 free",
        "         t4-shared-1: 4 nvidia.com/gpu allocatable, 4 free",
        "         not a candidate: a100-1: nodeSelector gpu-type=t4 (node has a100), workload=inference (node has "
        "training)",
        "         not a candidate: a100-down: not Ready",
        "[FAIL] Placement: the Pod is not scheduled (phase Pending)",
        "[WARN] Events: the scheduler found no node with enough free resources (Insufficient ...)",
        "[ok  ] RuntimeClass: RuntimeClass nvidia exists",
        "[FAIL] This webhook: would deny this Pod if it were created now (class workload=inference,gpu-type=t4)",
        "Conclusion: Matching nodes: 3 node(s) match but none offers enough of nvidia.com/gpu: the Pod can never "
        "be scheduled as written",
    ]
    for line in expected:
        assert line in out.splitlines(), line
    assert "Insufficient nvidia.com/gpu" in out and "(x42)" in out


def test_doctor_running_pod_json_with_owner_events(cluster: tuple[ReplayServer, str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    server, kubeconfig = cluster
    code, out, _ = run(capsys, "doctor", "pod/train-7d9f8c6b5-x2k4p", "--kubeconfig", kubeconfig, "-o", "json")
    assert code == 0, out
    report = json.loads(out)
    steps = {s["step"]: s for s in report["steps"]}
    assert report["pod"] == "ml-research/train-7d9f8c6b5-x2k4p" and report["broken"] is False
    assert steps["Placement"]["summary"] == "the Pod is on node a100-1 (phase Running)"
    assert steps["Matching nodes"]["status"] == "ok"
    assert "a100-1: 8 nvidia.com/gpu allocatable, 8 free" in steps["Matching nodes"]["evidence"], "its own GPUs"
    assert steps["Events"]["summary"] == ("the owner could not create Pods: an admission webhook denied them "
                                          "(see the message)")
    assert steps["Events"]["evidence"][0].startswith("ReplicaSet/train-7d9f8c6b5 FailedCreate (x5): Error creating: "
                                                     'admission webhook "validate.gpu-webhook.io" denied the request')
    assert steps["This webhook"]["status"] == "ok"
    assert server.seen("/apis/apps/v1/namespaces/ml-research/deployments/train"), "the owner chain is followed"


def test_doctor_pod_without_gpus(cluster: tuple[ReplayServer, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code, out, _ = run(capsys, "doctor", "notebook", "--kubeconfig", kubeconfig)
    assert code == 0
    assert "[info] GPU request: the Pod asks for no GPU" in out
    assert "[WARN] This webhook: would allow this Pod with warnings" in out
    assert "[gpu-env-without-request]" in out


@pytest.mark.parametrize(
    ("pod", "down", "message"),
    [
        pytest.param("ghost", False, 'pods "ghost" not found in namespace ml-research', id="no-such-pod"),
        pytest.param("big-infer", True, "cannot reach the API server", id="unreachable"),
    ],
)
def test_doctor_usage_errors(cluster: tuple[ReplayServer, str], capsys: pytest.CaptureFixture[str], pod: str,
                             down: bool, message: str) -> None:
    server, kubeconfig = cluster
    server.down = down
    code, out, err = run(capsys, "doctor", pod, "--kubeconfig", kubeconfig)
    assert code == 2 and message in err and out == ""
