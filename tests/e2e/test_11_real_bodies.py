"""What the real API server sends a webhook, checked against what the contract and the recorded fixtures assume.

Two capture webhooks are registered next to gpu-webhook for one labelled namespace: a mutating one named so that the
API server calls it before gpu-webhook's (configurations are called in name order), which sees the Pod exactly as
`/mutate` first does, and a validating one, which sees the final object as `/validate` does. Both allow everything.

Set GPU_WEBHOOK_E2E_CAPTURE_DIR to keep the captured AdmissionReview bodies (tests/e2e/captured/ holds a set).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import GPU, LOOPBACK, Cluster, free_port, gpu_pod, new_ca, new_leaf, wait_until, yaml_of

pytestmark = pytest.mark.e2e

CAPTURE_LABEL = "e2e.gpu-webhook.io/capture"
ERT_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}


class _Capture(BaseHTTPRequestHandler):
    bodies: dict[str, list[dict[str, Any]]]

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.setdefault(self.path.split("?")[0].strip("/"), []).append(review)
        answer = json.dumps({"apiVersion": review["apiVersion"], "kind": "AdmissionReview",
                             "response": {"uid": review["request"]["uid"], "allowed": True}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the bodies are the record."""


def _hook(name: str, url: str, bundle: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Ignore",
            "timeoutSeconds": 5, "clientConfig": {"url": url, "caBundle": bundle}, "rules": rules,
            "namespaceSelector": {"matchLabels": {CAPTURE_LABEL: "true"}}}


@pytest.fixture
def captured(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[str, dict[str, list[dict[str, Any]]]]]:
    """A labelled namespace and the capture webhooks; yields (namespace, bodies by webhook path)."""
    ca, ca_key, ca_cert = new_ca("e2e-capture-ca")
    leaf = new_leaf(ca_key, ca_cert, "capture", ips=[LOOPBACK], server=True)
    (tmp_path / "tls.crt").write_bytes(leaf.cert)
    (tmp_path / "tls.key").write_bytes(leaf.key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    bodies: dict[str, list[dict[str, Any]]] = {}
    handler = type("Handler", (_Capture,), {"bodies": bodies})
    server = ThreadingHTTPServer((LOOPBACK, free_port()), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"https://{LOOPBACK}:{server.server_address[1]}"
    bundle = base64.b64encode(ca.cert).decode()
    pods = [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
    workloads = [{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
                  "resources": ["deployments"]}]
    configs = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "0-e2e-capture-first"},
         "webhooks": [_hook("first.capture.e2e.io", f"{base}/mutating-first", bundle, pods)]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "zz-e2e-capture-final"},
         "webhooks": [_hook("final.capture.e2e.io", f"{base}/validating-final", bundle, pods + workloads)]},
    ]
    namespace = "e2e-capture"
    cluster.ensure_namespace(namespace, labels={CAPTURE_LABEL: "true"})
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(configs))

    def capturing() -> bool:
        bodies.clear()
        cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod("probe")))
        return "mutating-first" in bodies and "validating-final" in bodies

    wait_until(capturing, 30, "the capture webhooks to be called")
    bodies.clear()
    try:
        yield namespace, bodies
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", "0-e2e-capture-first", check=False)
        cluster.kubectl("delete", "validatingwebhookconfiguration", "zz-e2e-capture-final", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        server.shutdown()
        keep = os.environ.get("GPU_WEBHOOK_E2E_CAPTURE_DIR")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for path, reviews in bodies.items():
                for review in reviews:
                    req = review["request"]
                    name = req.get("name") or req["object"]["metadata"].get("generateName", "x")
                    dry = "-dry-run" if req.get("dryRun") else ""
                    file = f"{req['kind']['kind'].lower()}-{req['operation'].lower()}-{name}{dry}.{path}.json"
                    (Path(keep) / file).write_text(json.dumps(review, indent=2, sort_keys=True) + "\n")


def test_what_the_api_server_sends(cluster: Cluster, captured: tuple[str, dict[str, list[dict[str, Any]]]]) -> None:
    namespace, bodies = captured
    seed_pod = gpu_pod("cuda-gpu-test")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(seed_pod))
    cluster.kubectl("label", "pod", "cuda-gpu-test", "-n", namespace, "team=ml")
    cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod("dry-one")))
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "infer"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "infer"}},
                           "template": {"metadata": {"labels": {"app": "infer"}},
                                        "spec": {"containers": [{"name": "infer", "image": "vllm/vllm-openai:v0.6.3",
                                                                 "resources": {"limits": {GPU: "1"}}}]}}}}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(deployment))
    wait_until(lambda: any(r["request"]["object"]["metadata"].get("generateName", "").startswith("infer-")
                           for r in bodies.get("mutating-first", [])), 30, "the Deployment's Pod to be admitted")

    first = {(r["request"]["operation"], r["request"].get("name") or "", bool(r["request"]["dryRun"])): r["request"]
             for r in bodies["mutating-first"]}
    final = {(r["request"]["operation"], r["request"]["kind"]["kind"], r["request"].get("name") or ""): r["request"]
             for r in bodies["validating-final"]}

    # The Pod as /mutate first sees it: defaulted, ServiceAccount and ExtendedResourceToleration already applied.
    req = first[("CREATE", "cuda-gpu-test", False)]
    pod = req["object"]
    container = pod["spec"]["containers"][0]
    assert container["resources"] == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert ERT_TOLERATION in pod["spec"]["tolerations"]
    assert {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": 300} in pod["spec"]["tolerations"]
    assert pod["spec"]["serviceAccountName"] == "default"
    assert any(v["name"].startswith("kube-api-access-") for v in pod["spec"]["volumes"])
    assert req["oldObject"] is None and req["dryRun"] is False
    assert req["options"]["kind"] == "CreateOptions"
    assert req["userInfo"]["username"] == "system:admin"
    assert "nodeSelector" not in pod["spec"] and "runtimeClassName" not in pod["spec"]

    # The final object at /validate carries gpu-webhook's patch, and what RuntimeClass admission added after it.
    final_pod = final[("CREATE", "Pod", "cuda-gpu-test")]["object"]
    assert final_pod["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    assert final_pod["spec"]["runtimeClassName"] == "nvidia"
    assert [t for t in final_pod["spec"]["tolerations"] if t.get("key") == GPU] == [ERT_TOLERATION]

    # A controller's Pod: at the mutating call no name at all (neither request.name nor metadata.name), only
    # generateName; by the validating call the API server has generated the name.
    owned = next(r for (op, name, _), r in first.items() if op == "CREATE" and not name)
    assert "name" not in owned and "name" not in owned["object"]["metadata"]
    assert owned["object"]["metadata"]["generateName"].startswith("infer-")
    named = [r for (op, kind, name), r in final.items() if kind == "Pod" and name.startswith("infer-")]
    assert named and named[0]["object"]["metadata"]["name"] == named[0]["name"]
    # A workload template arrives without Pod defaulting: limits only.
    template = final[("CREATE", "Deployment", "infer")]["object"]["spec"]["template"]["spec"]["containers"][0]
    assert template["resources"] == {"limits": {GPU: "1"}}
    # dry-run is flagged; an UPDATE carries both objects.
    assert first[("CREATE", "dry-one", True)]["dryRun"] is True
    update = first[("UPDATE", "cuda-gpu-test", False)]
    assert update["oldObject"]["metadata"]["name"] == "cuda-gpu-test" and update["options"]["kind"] == "UpdateOptions"
