"""The webhook as shipped by kustomize, on the real node: `manifests/overlays/self-managed` (certificates from
`gpu-webhook certs`), applied with the built kubectl, running the image from the Dockerfile; the API server calls
it through the Service and the seed's Pod, mutated by it, runs through the NVIDIA runtime.

The overlay is used as shipped, from a kustomization in the test's directory that adds only what this machine
needs: the certificate files (the overlay's tls/ is git-ignored), the real node's nodeSelector and GPU taint
toleration, and no per-node spread (one real node for both replicas).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cluster import REPO, WEBHOOK_NAMESPACE, Cluster, wait_until
from installed import HOOK_KINDS, RELEASE, InstalledWebhook, container_status, strip_server_fields
from realnode import GPU_UUIDS, NODE_NAME, RealNode
from test_01_placement import CUDA_GPU_TEST

pytestmark = pytest.mark.e2e


def _overlay(workdir: Path, cluster: Cluster) -> Path:
    """A kustomization over manifests/overlays/self-managed's secret and caBundle wiring, with this node's needs."""
    certs = workdir / "certs"
    subprocess.run([sys.executable, "-m", "webhook", "certs", "--service", RELEASE, "--namespace", WEBHOOK_NAMESPACE,
                    "--out", str(certs)], check=True, capture_output=True, env=cluster.env())
    shipped = yaml.safe_load((REPO / "manifests" / "overlays" / "self-managed" / "kustomization.yaml").read_text())
    overlay = workdir / "overlay"
    (overlay / "tls").mkdir(parents=True)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (overlay / "tls" / name).write_bytes((certs / name).read_bytes())
    shipped["resources"] = [os.path.relpath(REPO / "manifests" / "base", overlay)]  # kustomize takes no absolute
    shipped["patches"] = [{"target": {"kind": "Deployment", "name": RELEASE}, "patch": json.dumps([
        {"op": "remove", "path": "/spec/template/spec/topologySpreadConstraints"},
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"kubernetes.io/hostname": NODE_NAME}},
        {"op": "add", "path": "/spec/template/spec/tolerations",
         "value": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    ])}]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(shipped, sort_keys=False))
    return overlay


@pytest.fixture(scope="module")
def kustomized(cluster: Cluster, real_node: RealNode,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledWebhook]:
    webhook = InstalledWebhook(cluster=cluster, node=real_node, home=tmp_path_factory.mktemp("kustomized"))
    webhook.prepare()
    rendered = cluster.kubectl("kustomize", "--load-restrictor=LoadRestrictionsNone",
                               str(_overlay(webhook.home, cluster))).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    saved = {}
    for kind in HOOK_KINDS:
        done = cluster.kubectl("get", kind, RELEASE, "-o", "json", check=False)
        if done.returncode == 0:
            saved[kind] = json.loads(done.stdout)
            cluster.kubectl("delete", kind, RELEASE)
    try:
        cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))
        cluster.kubectl("rollout", "status", f"deployment/{RELEASE}", "-n", WEBHOOK_NAMESPACE, "--timeout=240s",
                        timeout=260)
        cluster.wait_webhook_active(timeout=60)
        yield webhook
    finally:
        # The configurations first (nothing blocks Pod creation while the server goes), never the Namespace.
        for doc in sorted(docs, key=lambda d: d["kind"] not in ("MutatingWebhookConfiguration",
                                                                 "ValidatingWebhookConfiguration")):
            if doc["kind"] != "Namespace":
                cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "-n", WEBHOOK_NAMESPACE,
                                "--ignore-not-found", "--wait=false", check=False)
        if saved:
            cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                            input=yaml.safe_dump_all([strip_server_fields(d) for d in saved.values()]))
        cluster.wait_webhook_active(timeout=60)


def test_kustomize_install_runs_the_seed_pod(cluster: Cluster, kustomized: InstalledWebhook, real_node: RealNode,
                                             namespace: str) -> None:
    """Both replicas Ready on the real node behind the Service; the seed's Pod mutated by them Succeeds."""
    pods = kustomized.pods()
    assert len(pods) == 2
    assert all(p["spec"]["nodeName"] == NODE_NAME and container_status(p).get("ready") for p in pods)
    for kind in HOOK_KINDS:
        stored = json.loads(cluster.kubectl("get", kind, RELEASE, "-o", "json").stdout)
        assert all("service" in h["clientConfig"] and h["clientConfig"]["caBundle"] for h in stored["webhooks"])
    real_node.start_device_plugin(uuids=GPU_UUIDS[:1])
    wait_until(lambda: real_node.gpus()[1] == "1", 60, "nvidia.com/gpu: 1")
    stored = real_node.run_to_end(namespace, CUDA_GPU_TEST, "cuda-gpu-test")
    assert stored["status"]["phase"] == "Succeeded"
    assert stored["spec"]["runtimeClassName"] == "nvidia"
    logs = "".join(cluster.kubectl("logs", p["metadata"]["name"], "-n", WEBHOOK_NAMESPACE).stdout for p in pods)
    assert '"name":"cuda-gpu-test"' in logs.replace(" ", "")
