"""`gpu-webhook check` as a person runs it: files, `-` for stdin, output formats, --namespace, exit codes."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "tests" / "data" / "manifests"
# Third-party manifests in the shared/ folder beside the checkout (as on the team machines and CI); only where present.
REAL_MANIFESTS = REPO.parent / "shared" / "fixtures" / "real-manifests"


def check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", "check", *args], cwd=REPO, capture_output=True,
                          text=True, input=stdin, timeout=120, check=False)


def m(name: str) -> str:
    return str((MANIFESTS / name).relative_to(REPO))


def as_json(*args: str, stdin: str | None = None) -> tuple[int, list[dict[str, Any]]]:
    result = check("-o", "json", *args, stdin=stdin)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


EXIT_CODES = [
    pytest.param([m("gpu-pod.yaml")], 0, id="allowed"),
    pytest.param([m("mismatch.yaml")], 1, id="denied"),
    pytest.param([m("gpu-pod.yaml"), m("mismatch.yaml")], 1, id="any-denied"),
    pytest.param([m("multi.yaml")], 1, id="multi-document-with-a-denial"),
    pytest.param([m("list.yaml")], 0, id="list"),
    pytest.param([m("pod.json")], 1, id="json-fraction"),
    pytest.param([m("bad.yaml")], 2, id="bad-yaml"),
    pytest.param([m("gpu-pod.yaml"), m("bad.yaml")], 2, id="bad-yaml-among-good"),
    pytest.param([m("does-not-exist.yaml")], 2, id="missing-file"),
    pytest.param([], 2, id="no-files"),
    pytest.param([m("gpu-pod.yaml"), "-o", "xml"], 2, id="bad-output-format"),
    pytest.param([m("own-namespace.yaml")], 0, id="exempt-own-namespace"),
]


@pytest.mark.parametrize(("args", "code"), EXIT_CODES)
def test_exit_code(args: list[str], code: int) -> None:
    result = check(*args)
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_human_output_allowed() -> None:
    result = check(m("gpu-pod.yaml"))
    out = result.stdout
    assert "ALLOWED Pod default/gpu-pod (tests/data/manifests/gpu-pod.yaml:1, 1 GPU, class " \
           "workload=inference,gpu-type=t4)" in out
    assert 'inject: /spec/nodeSelector = {"workload": "inference", "gpu-type": "t4"}' in out
    assert "inject: /spec/tolerations = " in out and 'inject: /spec/runtimeClassName = "nvidia"' in out
    assert "1 object(s): 1 allowed, 0 denied" in out


def test_human_output_denied_says_what_where_and_how() -> None:
    out = check(m("mismatch.yaml")).stdout
    assert "DENIED  Pod default/mismatch" in out
    assert ("deny: [gpu-requests-equal-limits] spec.containers[0] (train): resources.requests: Invalid value: "
            '"1": must be equal to nvidia.com/gpu limit of 2') in out
    assert "inject:" not in out


def test_human_output_multi_document_and_template_preview() -> None:
    out = check(m("multi.yaml")).stdout
    assert "ALLOWED Deployment default/infer (tests/data/manifests/multi.yaml:2" in out
    assert "pods of this template get: /spec/template/spec/nodeSelector" in out
    assert "ALLOWED ConfigMap default/settings (tests/data/manifests/multi.yaml:16)" in out
    assert "DENIED  Job default/requests-only (tests/data/manifests/multi.yaml:23, class workload=inference," in out
    assert "[gpu-limits-required] spec.template.spec.containers[0] (job)" in out
    assert "  class: workload=inference from the cluster default" in out
    assert "3 object(s): 2 allowed, 1 denied" in out


def test_human_output_warning() -> None:
    text = ("apiVersion: v1\nkind: Pod\nmetadata: {name: w}\nspec:\n  runtimeClassName: nvidia\n"
            "  containers: [{name: a, image: x}]\n")
    result = check("-", stdin=text)
    assert result.returncode == 0
    assert "WARN    Pod default/w (<stdin>:1)" in result.stdout
    assert "warn: [gpu-runtime-without-request]" in result.stdout


def test_json_output_fields() -> None:
    code, results = as_json(m("gpu-pod.yaml"), m("mismatch.yaml"))
    assert code == 1
    allowed, denied = results
    for entry in results:
        assert {"kind", "name", "namespace", "allowed", "violations", "warnings", "patch", "object"} <= set(entry)
    assert (allowed["kind"], allowed["name"], allowed["namespace"], allowed["allowed"]) == (
        "Pod", "gpu-pod", "default", True)
    assert allowed["violations"] == [] and allowed["warnings"] == []
    assert {op["path"] for op in allowed["patch"]} >= {"/spec/nodeSelector", "/spec/tolerations"}
    assert allowed["object"]["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    assert denied["allowed"] is False and denied["patch"] == []
    assert [v["rule"] for v in denied["violations"]] == ["gpu-requests-equal-limits"]
    assert "must be equal to nvidia.com/gpu limit of 2" in denied["violations"][0]["message"]
    assert denied["object"]["spec"] == yaml.safe_load((MANIFESTS / "mismatch.yaml").read_text())["spec"]


def test_yaml_output_prints_the_mutated_manifests() -> None:
    result = check("-o", "yaml", m("gpu-pod.yaml"), m("list.yaml"))
    assert result.returncode == 0
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["metadata"]["name"] for d in docs] == ["gpu-pod", "first", "second"]
    assert docs[0]["spec"]["runtimeClassName"] == "nvidia"
    assert docs[0]["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert docs[2] == yaml.safe_load((MANIFESTS / "list.yaml").read_text())["items"][1]


def test_list_kinds_are_expanded() -> None:
    _, results = as_json(m("list.yaml"))
    assert [(r["kind"], r["name"]) for r in results] == [("Pod", "first"), ("Service", "second")]


def test_stdin() -> None:
    code, results = as_json("-", stdin=(MANIFESTS / "mismatch.yaml").read_text())
    assert code == 1 and results[0]["name"] == "mismatch" and results[0]["file"] == "<stdin>"


def test_stdin_json() -> None:
    code, results = as_json("-", stdin=(MANIFESTS / "pod.json").read_text())
    assert code == 1 and [v["rule"] for v in results[0]["violations"]] == ["gpu-whole-number"]


@pytest.mark.parametrize(("args", "namespace", "allowed"), [
    pytest.param([], "default", False, id="default-namespace"),
    pytest.param(["--namespace", "team-a"], "team-a", False, id="given-namespace"),
    pytest.param(["-n", "kube-system"], "kube-system", True, id="exempt-given-namespace"),
])
def test_namespace_option(args: list[str], namespace: str, allowed: bool) -> None:
    _, results = as_json(*args, m("mismatch.yaml"))
    assert results[0]["namespace"] == namespace and results[0]["allowed"] is allowed


def test_object_namespace_wins_over_the_option() -> None:
    _, results = as_json("--namespace", "team-a", m("own-namespace.yaml"))
    assert results[0]["namespace"] == "kube-system" and results[0]["allowed"] is True


def test_bad_yaml_is_named_with_its_line() -> None:
    result = check(m("gpu-pod.yaml"), m("bad.yaml"))
    assert result.returncode == 2
    assert "tests/data/manifests/bad.yaml:4: not valid YAML" in result.stderr
    assert result.stdout == ""


def test_missing_file_is_named() -> None:
    result = check(m("does-not-exist.yaml"))
    assert "does-not-exist.yaml: cannot be read" in result.stderr


def test_document_without_kind_is_an_input_error() -> None:
    result = check("-", stdin="apiVersion: v1\nmetadata: {name: x}\n")
    assert result.returncode == 2 and "<stdin>:1" in result.stderr and "no kind" in result.stderr


def test_rules_option(tmp_path: Path) -> None:
    policy = (REPO / "rules" / "gpu-policy.yaml").read_text().replace("enforcement: {}",
                                                                       "enforcement: {gpu-requests-equal-limits: warn}")
    (tmp_path / "gpu-policy.yaml").write_text(policy)
    result = check("--rules", str(tmp_path), m("mismatch.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warn: [gpu-requests-equal-limits]" in result.stdout


def test_wrongly_typed_field_is_reported_not_a_crash() -> None:
    text = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  nodeSelector: [a]\n"
            "  containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]\n")
    result = check("-", stdin=text)
    assert "Traceback" not in result.stderr
    assert result.returncode in (1, 2)


def test_namespace_of_another_type_is_named_with_its_line() -> None:
    text = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n---\napiVersion: v1\nkind: Pod\n"
            "metadata: {name: q, namespace: {nvidia.com/gpu: 0}}\n"
            "spec: {containers: [{name: a, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]}\n")
    result = check("-", stdin=text)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "<stdin>:5: metadata.namespace must be a string, got dict" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not REAL_MANIFESTS.is_dir(), reason=f"{REAL_MANIFESTS} is not present on this machine")
def test_real_manifests() -> None:
    files = sorted(str(p) for p in REAL_MANIFESTS.glob("*.yaml"))
    result = check("-o", "json", *files)
    assert result.returncode == 1, result.stderr
    results = json.loads(result.stdout)
    denied = {(r["kind"], r["name"]): [v["rule"] for v in r["violations"]] for r in results if not r["allowed"]}
    assert denied == {("MPIJob", "deepspeed-mpijob"): ["gpu-requests-equal-limits"],
                      ("LeaderWorkerSet", "nginx-leaderworkerset"): ["gpu-limits-required"]}


# --------------------------------------------------------------------------------------------- --nodes

REAL = REPO / "tests" / "data" / "real-h200"
SEED = """apiVersion: v1
kind: Pod
metadata: {name: cuda-gpu-test}
spec:
  restartPolicy: Never
  containers:
  - name: cuda
    image: nvidia/cuda:12.4.1-base-ubuntu22.04
    command: [nvidia-smi]
    resources: {limits: {nvidia.com/gpu: %d}}
"""


def seed_file(tmp_path: Path, gpus: int = 1) -> str:
    path = tmp_path / f"seed-{gpus}.yaml"
    path.write_text(SEED % gpus)
    return str(path)


def real_node(name: str) -> str:
    return str((REAL / f"{name}.json").relative_to(REPO))


def test_check_with_the_live_nodes_holds_back_a_default_they_lack(tmp_path: Path) -> None:
    code, [result] = as_json(seed_file(tmp_path), "--nodes", real_node("node-h200"))
    assert code == 0
    assert result["object"]["spec"]["nodeSelector"] == {"workload": "inference"}
    assert any(w.startswith("[gpu-class-skipped] gpu-type t4 not applied") and "NVIDIA-H200 (kit-gpu-node)" in w
               for w in result["warnings"])
    code, [offline] = as_json(seed_file(tmp_path))
    assert offline["object"]["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}


def test_check_with_time_sliced_nodes_denies_two_replicas(tmp_path: Path) -> None:
    result = check(seed_file(tmp_path, 2), "--nodes", real_node("node-h200-timesliced"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("nodes: 1 from tests/data/real-h200/node-h200-timesliced.json (1 Ready, 1 of them "
                                    "advertising GPUs)\n")
    assert "deny: [gpu-time-sliced-max] spec.containers[0] (cuda): asks for 2 nvidia.com/gpu" in result.stdout
    assert "taken to exist: nvidia" in result.stdout


def test_check_reads_a_yaml_node_list_from_stdin_with_runtime_classes(tmp_path: Path) -> None:
    """`kubectl get nodes,runtimeclasses -o yaml`: a List; its RuntimeClasses are checked (none is `nvidia`)."""
    node = json.loads((REAL / "node-h200.json").read_text())
    kata = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"}, "handler": "kata"}
    listing = {"apiVersion": "v1", "kind": "List", "items": [node, kata]}
    code, [result] = as_json(seed_file(tmp_path), "--nodes", "-", stdin=yaml.safe_dump(listing))
    assert code == 0
    assert any(w.startswith("[gpu-runtime-class-missing] runtimeClassName nvidia was not set")
               for w in result["warnings"])
    assert "runtimeClassName" not in result["object"]["spec"]


@pytest.mark.parametrize(
    ("nodes", "stdin", "message"),
    [
        pytest.param("MANIFEST", None, "holds no Node (found Pod); give the output of `kubectl get nodes -o json`",
                     id="not-nodes"),
        pytest.param("tests/data/real-h200/missing.json", None, "missing.json: cannot be read", id="missing"),
        pytest.param("-", "-", "standard input can be read once", id="stdin-twice"),
    ],
)
def test_check_nodes_usage_errors(tmp_path: Path, nodes: str, stdin: str | None, message: str) -> None:
    manifest = seed_file(tmp_path)
    args = ["-" if stdin else manifest, "--nodes", manifest if nodes == "MANIFEST" else nodes]
    result = check(*args, stdin=SEED % 1 if stdin else None)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_check_judges_and_places_claim_templates() -> None:
    code, results = as_json(m("dra-claim-templates.yaml"))
    assert code == 1
    big, ok = results
    assert (big["name"], big["allowed"], big["gpus"]) == ("big", False, 12)
    assert sorted(v["rule"] for v in big["violations"]) == ["dra-admin-access", "dra-claim-max"]
    assert (ok["name"], ok["allowed"], ok["class"]) == ("ok", True, "workload=inference,gpu-type=t4")
    assert ok["patch"] == [{"op": "add", "path": "/spec/spec/devices/requests/0/exactly/selectors", "value": [
        {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("t4")'}}]}]


def test_check_reads_a_pods_claim_template_from_the_files() -> None:
    """A template and its Pods in one file: the Pod using it is a GPU Pod (placed by class, its GPU toleration
    expected); a Pod naming a template the files do not hold is judged without it, as before."""
    code, results = as_json(m("dra-template-and-pods.yaml"))
    assert code == 0
    template, uses, missing = results
    assert template["class"] == uses["class"] == "workload=inference,gpu-type=t4"
    assert uses["warnings"] == []
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in uses["patch"]
    assert [w.split("]")[0] for w in missing["warnings"]] == ["[gpu-toleration-without-request"]
    assert missing["class"] is None


def test_rules_lists_the_dra_part_of_the_policy() -> None:
    result = subprocess.run([sys.executable, "-m", "webhook", "rules"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "dra-unsatisfiable                warn  (default warn)" in out
    assert "\nDRA: GPU DeviceClasses\n" in out and "  gpu.nvidia.com " in out
    assert ('  gpu-type t4 -> gpu.nvidia.com: device.attributes["gpu.nvidia.com"].productName.lowerAscii()'
            '.contains("t4")') in out
    assert "DRA: adminAccess allowed in:" in out


def test_check_nodes_reads_the_devices_of_one_kubectl_list(tmp_path: Path) -> None:
    """`kubectl get nodes,resourceslices,deviceclasses -o yaml` in one List: a template no device can satisfy is
    warned, and the default t4 selector, which the H200's slice does not match, is held back."""
    dra = REPO / "tests" / "data" / "dra"
    items = [json.loads((REAL / "node-h200.json").read_text()),
             json.loads((dra / "resourceslice-nvidia-h200-composed.json").read_text()),
             json.loads((dra / "deviceclass-gpu.nvidia.com.json").read_text())]
    nodes = tmp_path / "cluster.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    _, results = as_json(m("dra-claim-templates.yaml"), "--nodes", str(nodes))
    ok = next(r for r in results if r["name"] == "ok")
    assert any(w.startswith("[gpu-class-skipped] gpu-type t4 (from the defaults) not applied") and
               "productName NVIDIA H200 (1 node, 1 device)" in w for w in ok["warnings"]), ok["warnings"]
    assert ok["patch"] == []
    big = next(r for r in results if r["name"] == "big")
    assert any(w.startswith('[dra-unsatisfiable] ResourceClaimTemplate "big"') and
               "the cluster has productName NVIDIA H200 (1 node, 1 device)" in w for w in big["warnings"])


def test_a_cluster_scoped_object_is_shown_without_a_namespace() -> None:
    result = check("-", stdin="apiVersion: v1\nkind: Namespace\nmetadata: {name: gpu-test1}\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ALLOWED Namespace gpu-test1 (<stdin>:1)"), result.stdout


def test_check_nodes_counts_the_dra_devices_that_serve_nvidia_gpu(tmp_path: Path) -> None:
    """KEP-5004 offline: the H200 node without a device plugin, its DRA slice (one GPU) and the DeviceClass mapping
    nvidia.com/gpu: the seed's Pod is served there once the node carries the class's labels; two GPUs are never
    schedulable; without the labels the warning names the label the node lacks."""
    dra = REPO / "tests" / "data" / "dra"
    node = json.loads((REAL / "node-h200.json").read_text())
    for field in ("allocatable", "capacity"):
        node["status"][field].pop("nvidia.com/gpu")
    device_class = json.loads((dra / "deviceclass-gpu.nvidia.com.json").read_text())
    device_class["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    slices = json.loads((dra / "resourceslice-nvidia-h200-composed.json").read_text())

    def dump(labels: dict[str, str]) -> str:
        labelled = copy.deepcopy(node)
        labelled["metadata"]["labels"].update(labels)
        path = tmp_path / f"cluster-{len(labels)}.yaml"
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [labelled, slices, device_class]}))
        return str(path)

    _, [unlabelled] = as_json(seed_file(tmp_path), "--nodes", dump({}))
    assert any(w.startswith("[gpu-class-no-node]") and "1 node(s) have devices of DeviceClass gpu.nvidia.com but "
               "none matches (kit-gpu-node: gpu-type=t4 (node has no such label))" in w
               for w in unlabelled["warnings"]), unlabelled["warnings"]
    code, [served] = as_json(seed_file(tmp_path), "--nodes", dump({"gpu-type": "t4"}))
    assert code == 0 and served["warnings"] == [], served["warnings"]
    result = check(seed_file(tmp_path, 2), "--nodes", dump({"gpu-type": "t4"}))
    assert result.returncode == 1, result.stdout
    assert ("deny: [gpu-never-schedulable] the Pod asks for 2 nvidia.com/gpu but the most any Ready node of class "
            "workload=inference,gpu-type=t4 (nodeSelector gpu-type=t4, workload=inference) offers is 1 (kit-gpu-node: "
            "devices of DeviceClass gpu.nvidia.com, through DRA)") in result.stdout
