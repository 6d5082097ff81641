"""`gpu-webhook audit` and `gpu-webhook doctor` end to end: the CLI, a kubeconfig, and a local API server
replaying a small GPU cluster (tests/data/kube/); human and JSON output and the exit codes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.dra import H100, gpu_slice
from support.dra import load as dra_load
from support.kube_replay import DATA, Computed, Json, ReplayServer, Request, load

from webhook.admission.loader import load_policy
from webhook.cli import main as cli
from webhook.cluster import doctor, explanations
from webhook.policy import inventory
from webhook.policy.dra_inventory import DraIndex, device_class_from_api, slice_from_api

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
    # 7 workloads and Pods, and the 3 claim templates; Pods of judged workloads, owned ReplicaSets and finished Pods
    # are skipped
    assert "10 object(s) judged" in out


def test_audit_proposed_rules_json(cluster: tuple[ReplayServer, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code, out, _ = run(capsys, "audit", "-A", "--kubeconfig", kubeconfig, "--rules", str(PROPOSED), "-o", "json")
    assert code == 1
    report = json.loads(out)
    groups = {(g["namespace"], g["rule"]): g["objects"] for g in report["groups"]}
    # namespace labels from the cluster; claim templates are judged too
    assert groups[("ml-research", "gpu-class-not-allowed")] == ["Deployment/embed",
                                                                 "ResourceClaimTemplate/single-gpu"]
    assert groups[("ml-serving", "gpu-never-schedulable")] == ["Pod/big-infer"]
    assert report["summary"]["denied"] == 3 and report["inventory"] == {"synced": True}
    embed = next(o for o in report["objects"] if o["name"] == "embed")
    assert embed["violations"][0]["message"].startswith("namespace ml-research may not use gpu-type t4")


def test_audit_judges_resource_claims_and_skips_those_made_for_pods(cluster: tuple[ReplayServer, str],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    server, kubeconfig = cluster
    twelve = {"metadata": {"namespace": "ml-serving", "name": "twelve"},
              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                            "count": 12}}]}}}
    made = {"metadata": {"namespace": "ml-serving", "name": "infer-0-gpu-x7",
                         "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}}, "spec": twelve["spec"]}
    server.route("/apis/resource.k8s.io/v1/resourceclaims", list=[listing([twelve, made])])
    _, out, err = run(capsys, "audit", "-A", "--kubeconfig", kubeconfig, "-o", "json")
    report = json.loads(out)
    groups = {(g["namespace"], g["rule"]): g["objects"] for g in report["groups"]}
    assert groups[("ml-serving", "dra-claim-max")] == ["ResourceClaim/twelve"]
    assert not any(o["name"] == "infer-0-gpu-x7" for o in report["objects"]), "a claim made for a Pod is skipped"
    assert "note" not in err


def test_audit_says_when_it_may_not_read_claims(cluster: tuple[ReplayServer, str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    server, kubeconfig = cluster
    forbidden = Json({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                      "message": 'resourceclaims.resource.k8s.io is forbidden: User "dev" cannot list resource'}, 403)
    for version in ("v1", "v1beta2", "v1beta1"):
        server.route(f"/apis/resource.k8s.io/{version}/resourceclaims", list=[forbidden])
    _, out, err = run(capsys, "audit", "-A", "--kubeconfig", kubeconfig)
    assert "gpu-webhook audit: note: resourceclaims not judged: API server answered 403" in err
    assert "lacks read access" in err and "10 object(s) judged" in out


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
        "[WARN] Device plugin: the device plugin is not running on 1 GPU node(s): a100-down; their GPUs are not (or "
        "no longer) advertised: check the plugin's Pod or service there",
        "         GPU node a100-down has no ready device plugin Pod and is not Ready (allocatable: nvidia.com/gpu=16)",
        "         advertised without a device plugin Pod found (a plugin works there: a host service, another name, "
        "the GPU Operator): t4-renamed-1",
        "         DaemonSet gpu-operator/nvidia-device-plugin-daemonset: 7 desired, 6 ready",
        "[FAIL] Matching nodes: 3 node(s) match but none offers enough of nvidia.com/gpu: the Pod can never be "
        "scheduled as written",
        "         t4-1: 1 nvidia.com/gpu allocatable, 0 free",
        "         t4-shared-1: 4 nvidia.com/gpu allocatable, 4 free",
        "         not a candidate: a100-1: nodeSelector gpu-type=t4 (node has a100), workload=inference (node has "
        "training)",
        "         not a candidate: a100-down: not Ready",
        "[FAIL] Placement: the Pod is not scheduled (phase Pending)",
        "[WARN] Events: the scheduler found no node with enough nvidia.com/gpu: the Pod asks for 6, more than any "
        "node it can land on has (4); ask for at most 4, or choose nodes with more GPUs (see Matching nodes)",
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


# --------------------------------------------------------------------------------------------- a real H200 node

REAL = DATA.parent / "real-h200"


def real(name: str) -> dict[str, Any]:
    text = (REAL / name).read_text()
    data: dict[str, Any] = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
    return data


def real_events(object_name: str, uids: dict[str, str]) -> list[dict[str, Any]]:
    """The Pod's events from `kubectl get events` of the real run (events.txt), as Event objects. The text has no
    uids: `uids` maps a message fragment to the uid of the Pod it belongs to (from the stored Pods and the
    kubelet's own `name_namespace(uid)` texts)."""
    lines = (REAL / "events.txt").read_text().splitlines()
    header = lines[0]
    cols = [header.index(c) for c in ("TYPE", "REASON", "OBJECT", "MESSAGE")]
    events = []
    for line in lines[1:]:
        kind_name = line[cols[2]:cols[3]].strip()
        if kind_name != f"pod/{object_name}":
            continue
        message = line[cols[3]:].strip()
        uid = next((u for fragment, u in uids.items() if fragment in message), "")
        events.append({"type": line[cols[0]:cols[1]].strip(), "reason": line[cols[1]:cols[2]].strip(),
                       "message": message, "metadata": {"namespace": "default"},
                       "involvedObject": {"kind": "Pod", "name": object_name, "uid": uid}})
    return events


def real_snapshot(*nodes: dict[str, Any]) -> inventory.Snapshot:
    return inventory.snapshot_from_api(nodes, [{"metadata": {"name": "nvidia"}, "handler": "nvidia"}])


def with_hand_labels(node: dict[str, Any], **labels: str) -> dict[str, Any]:
    """The real Node with the platform labels that were set by hand on it at that moment of the run."""
    copy = json.loads(json.dumps(node))
    copy["metadata"]["labels"].update(labels)
    return copy


def test_doctor_a_pod_that_ran_on_a_node_advertising_its_gpu() -> None:
    """The seed Pod that ran and Succeeded on the real node. No device plugin DaemonSet exists (the plugin ran as
    a host process), but the node advertises nvidia.com/gpu: a plugin works; that is no conclusion. The earlier
    Pod of the same name (the packaged rules' gpu-type t4) left a FailedScheduling event: not this Pod's."""
    pod = real("pod-cuda-gpu-test-stored.yaml")
    node = with_hand_labels(real("node-h200.json"), **{"gpu-type": "h200"})
    events = real_events("cuda-gpu-test", {"didn't match": "94aa0255-1e3b-4f30-a99c-9612e9d13e18",
                                           "c358e88c": "c358e88c-3fc9-4084-89f7-81a74c6cc091",
                                           "Insufficient": "a-third-cuda-gpu-test"})
    assert len(events) == 7
    report = doctor.diagnose(load_policy(), doctor.Facts(pod=pod, events=tuple(events), snapshot=real_snapshot(node)))
    steps = {s.title: s for s in report.steps}
    assert steps["Device plugin"].status == "ok", steps["Device plugin"]
    assert "kit-gpu-node" in " ".join(steps["Device plugin"].evidence)
    assert steps["Placement"].summary == "the Pod is on node kit-gpu-node (phase Succeeded)"
    assert "FailedScheduling" not in " ".join(steps["Events"].evidence), "an earlier Pod's events"
    assert "MissingClusterDNS" in " ".join(steps["Events"].evidence)
    assert "device plugin" not in report.conclusion.lower()


def test_doctor_explains_the_kubelet_rejection_of_a_time_sliced_pod() -> None:
    pod = real("pod-timesliced-two-replicas-rejected.json")
    snapshot = real_snapshot(real("node-h200-timesliced.json"))
    report = doctor.diagnose(load_policy(), doctor.Facts(pod=pod, snapshot=snapshot))
    placement = next(s for s in report.steps if s.title == "Placement")
    assert placement.status == "fail"
    assert placement.summary.startswith("the Pod is on node kit-gpu-node (phase Failed), and the kubelet refused it: "
                                        "its node shares each GPU (time-slicing)")
    assert "ask for 1 nvidia.com/gpu, or use a class of whole GPUs" in placement.summary
    assert placement.evidence[0].startswith("UnexpectedAdmissionError: Pod was rejected: Allocate failed")
    assert report.conclusion.startswith("Placement: the Pod is on node kit-gpu-node (phase Failed)")
    webhook = next(s for s in report.steps if s.title == "This webhook")
    assert webhook.status == "fail" and "[gpu-time-sliced-max]" in " ".join(webhook.evidence)


def test_doctor_says_no_plugin_when_no_gpu_node_advertises() -> None:
    node = real("node-h200.json")
    node["status"]["allocatable"].pop("nvidia.com/gpu")  # before the device plugin ran
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    report = doctor.diagnose(load_policy(), doctor.Facts(pod=pod, snapshot=real_snapshot(node)))
    plugin = next(s for s in report.steps if s.title == "Device plugin")
    assert plugin.status == "fail" and "no node advertises a GPU resource" in plugin.summary
    assert "GPU nodes: kit-gpu-node" in plugin.summary


GPU = "nvidia.com/gpu"
ADVERTISED = explanations.Clues({GPU: 1})
NOTHING = explanations.Clues({})
SANDBOX = ('FailedCreatePodSandBox: Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get '
           'sandbox runtime: no runtime for "nvidia" is configured')


def _real_event(fragment: str) -> str:
    line = next(x for x in (REAL / "events.txt").read_text().splitlines() if fragment in x)
    return line[line.index("FailedScheduling"):].replace("FailedScheduling", "FailedScheduling:", 1)


def _fleet(t4_allocatable: str | None) -> inventory.Snapshot:
    """The real H200 node twice: as a T4 node (hand label gpu-type=t4) whose allocatable is `t4_allocatable`
    (None: its plugin is not running), and as an A100 node whose plugin works (4 GPUs)."""
    t4 = with_hand_labels(real("node-h200.json"), **{"gpu-type": "t4"})
    if t4_allocatable is None:
        t4["status"]["allocatable"].pop(GPU)
    else:
        t4["status"]["allocatable"][GPU] = t4["status"]["capacity"][GPU] = t4_allocatable
    a100 = with_hand_labels(real("node-h200.json"), **{"gpu-type": "a100"})
    a100["metadata"]["name"] = "a100-node"
    a100["status"]["allocatable"][GPU] = a100["status"]["capacity"][GPU] = "4"
    return real_snapshot(t4, a100)


def _pending_t4_pod(name: str, gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GPU Pod selecting the T4 node, Pending, and its real FailedScheduling (Insufficient) event."""
    pod = {"kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
           "spec": {"nodeSelector": {"gpu-type": "t4"},
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}]},
           "status": {"phase": "Pending"}}
    reason, message = _real_event("Insufficient").split(": ", 1)
    event = {"type": "Warning", "reason": reason, "message": message,
             "involvedObject": {"kind": "Pod", "name": name, "uid": f"uid-{name}"}}
    return pod, event


def _holder(node: str, gpus: int) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": "holder", "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}]},
            "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("t4_allocatable", "gpus", "held", "matching", "events"),
    [
        pytest.param(None, 1, 0, "1 node(s) match but none advertises nvidia.com/gpu: the device plugin is not "
                     "running (or not registered) on kit-gpu-node; start it there",
                     "none of the nodes the Pod can land on advertises it", id="t4-plugin-stopped-a100s-working"),
        pytest.param("1", 1, 1, "1 node(s) match and 1 could hold the Pod, but none has enough free GPUs now",
                     "the GPUs of the nodes the Pod can land on are in use", id="t4-gpu-in-use"),
        pytest.param("1", 2, 0, "1 node(s) match but none offers enough of nvidia.com/gpu",
                     "the Pod asks for 2, more than any node it can land on has (1)", id="t4-too-small"),
    ],
)
def test_doctor_reads_insufficient_against_the_nodes_the_pod_can_land_on(
        t4_allocatable: str | None, gpus: int, held: int, matching: str, events: str) -> None:
    """The scheduler's one text, "Insufficient nvidia.com/gpu", means three things; which one depends on the nodes
    the Pod can land on, not on the whole fleet: 4 working A100 GPUs elsewhere say nothing about the T4 node."""
    pod, event = _pending_t4_pod("t4-pod", gpus)
    pods = (_holder("kit-gpu-node", held),) if held else ()
    report = doctor.diagnose(load_policy(), doctor.Facts(pod=pod, events=(event,), pods=pods,
                                                         snapshot=_fleet(t4_allocatable)))
    steps = {s.title: s for s in report.steps}
    assert matching in steps["Matching nodes"].summary, steps["Matching nodes"]
    assert events in steps["Events"].summary, steps["Events"]
    assert steps["Events"].status == "warn"
    assert report.broken and steps["Placement"].status == "fail"
    assert ("the nodes it can land on have no GPU free now" in steps["Placement"].summary) is bool(held)


@pytest.mark.parametrize(
    ("text", "clues", "status", "meaning"),
    [
        pytest.param(real("pod-timesliced-two-replicas-rejected.json")["status"]["message"], ADVERTISED, "fail",
                     "a container asked for 2; ask for 1 nvidia.com/gpu, or use a class of whole GPUs",
                     id="kubelet-shared-replicas"),
        pytest.param("container cuda: RunContainerError: failed to inject CDI devices: unresolvable CDI devices "
                     "nvidia.com/gpu=all", ADVERTISED, "fail",
                     "could not inject the CDI device nvidia.com/gpu=all: the node's CDI spec (/etc/cdi or "
                     "/var/run/cdi) has no such device; run `nvidia-ctk cdi generate", id="cdi-unresolvable"),
        pytest.param(SANDBOX, ADVERTISED, "fail", 'containerd on the node has no runtime handler "nvidia"',
                     id="containerd-runtime-handler"),
        pytest.param(_real_event("Insufficient"), ADVERTISED, "warn",
                     "no node with nvidia.com/gpu free: the GPUs of the nodes the Pod can land on are in use",
                     id="gpus-in-use"),
        pytest.param(_real_event("Insufficient"), NOTHING, "warn",
                     "none of the nodes the Pod can land on advertises it, so the device plugin is not running",
                     id="plugin-not-running"),
        pytest.param(_real_event("Insufficient"), explanations.Clues({GPU: 8}, {GPU: 4}, {GPU: 8}), "warn",
                     "the Pod asks for 8, more than any node it can land on has (4); ask for at most 4",
                     id="more-than-any-node-has"),
        pytest.param(_real_event("didn't match"), ADVERTISED, "warn",
                     "no node with the labels the Pod's nodeSelector or node affinity asks for", id="selector"),
        # kube-scheduler v1.36.3's own words, from tests/e2e/test_26_dra_scheduler.py
        pytest.param("0/5 nodes are available: 2 cannot allocate all claims, 3 node(s) didn't match Pod's node "
                     "affinity/selector. still not schedulable, preemption: 0/5 nodes are available: 5 Preemption is "
                     "not helpful for scheduling.", ADVERTISED, "warn",
                     "the scheduler found no node whose DRA devices satisfy the Pod's claims", id="dra-claims"),
        pytest.param("UnexpectedAdmissionError: Pod was rejected: something new", ADVERTISED, "fail",
                     "the kubelet refused the Pod at admission", id="other-kubelet-rejection"),
        pytest.param("MissingClusterDNS: kubelet does not have ClusterDNS IP configured", ADVERTISED, None, "",
                     id="not-ours"),
    ],
)
def test_doctor_explains_real_texts(text: str, clues: explanations.Clues, status: str | None, meaning: str) -> None:
    found = explanations.explain(text, clues)
    if status is None:
        assert found is None
        return
    assert found is not None and found[0] == status
    assert meaning in found[1], found[1]


def test_doctor_counts_the_dra_devices_that_serve_the_gpu_resource() -> None:
    """KEP-5004: no device plugin on the node, but the DeviceClass that maps nvidia.com/gpu has devices there: the
    resource is served, by DRA, and doctor says so instead of "not advertised"."""
    node = real("node-h200.json")
    node["status"]["allocatable"].pop(GPU)
    device_class = {**dra_load("deviceclass-gpu.nvidia.com.json")}
    device_class["spec"] = {**device_class["spec"], "extendedResourceName": GPU}
    index = DraIndex()
    index.replace("resourceslices", [slice_from_api(gpu_slice("kit-gpu-node", H100, 2))])
    index.replace("deviceclasses", [device_class_from_api(device_class)])
    snapshot = dataclasses.replace(real_snapshot(node), dra=index.view())
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "c", "resources": {"limits": {GPU: 1}}}]}}
    report = doctor.diagnose(load_policy(), doctor.Facts(pod=pod, snapshot=snapshot))
    matching = next(s for s in report.steps if s.title == "Matching nodes")
    assert (matching.status, matching.summary) == ("ok", "1 node(s) match; 1 have enough free GPUs now: kit-gpu-node")
    assert "kit-gpu-node: 2 nvidia.com/gpu through DRA, 2 free" in matching.evidence
    advertised = next(s for s in report.steps if s.title == "Advertised")
    assert advertised.status == "ok", advertised
    assert advertised.evidence == (
        "nvidia.com/gpu: no device plugin advertises it; DeviceClass gpu.nvidia.com serves it through DRA (its "
        "extendedResourceName): 2 device(s) on 1 node(s): kit-gpu-node",)
    plugin = next(s for s in report.steps if s.title == "Device plugin")
    assert (plugin.status, plugin.summary) == ("info", "not needed for this Pod: DeviceClass gpu.nvidia.com serves "
                                               "nvidia.com/gpu through DRA (its extendedResourceName); a device plugin "
                                               "advertising it on a node would take it over there")
