"""Hybrid mode on the real API server: the native policies, gpu-webhook's mutating webhook narrowed by the
match condition of manifests/components/hybrid to the Pods native mode defers, and its validating webhook, narrowed
to the GPU Pods and workloads, for the rules that need the live cluster. The module starts its own control plane
(`running_cluster`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, gpu_pod, running_cluster, wait_until
from test_15_native import apply_native, narrow_for_hybrid

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NS = "hybrid"


def _reviews(cluster: Cluster, endpoint: str) -> float:
    """gpu_webhook_reviews_total summed over kinds and decisions for one endpoint."""
    pattern = re.compile(r'^gpu_webhook_reviews_total\{([^}]*)\} ([0-9.e+]+)$')
    total = 0.0
    for line in cluster.webhook_metrics().splitlines():
        found = pattern.match(line)
        if found and f'endpoint="{endpoint}"' in found.group(1):
            total += float(found.group(2))
    return total


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("hybrid")) as cluster:
        narrow_for_hybrid(cluster)
        apply_native(cluster)
        cluster.ensure_namespace(NS)
        yield cluster


def _create(cluster: Cluster, pod: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", NS, "-f", "-", input=json.dumps(pod),
                           check=False)


def test_a_plain_gpu_pod_is_placed_natively_and_only_validated_by_the_webhook(hybrid: Cluster) -> None:
    mutate, validate = _reviews(hybrid, "mutate"), _reviews(hybrid, "validate")
    done = _create(hybrid, gpu_pod("plain"))
    assert done.returncode == 0, done.stderr
    pod = json.loads(done.stdout)
    assert pod["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    assert pod["metadata"]["annotations"]["gpu-webhook.io/class"] == "workload=inference,gpu-type=t4"
    wait_until(lambda: _reviews(hybrid, "validate") > validate, 10, "the validating webhook's review to be counted")
    assert _reviews(hybrid, "mutate") == mutate, "a plain GPU Pod must not reach the mutating webhook"


def test_a_pod_placed_by_required_node_affinity_gets_its_class_from_the_webhook(hybrid: Cluster) -> None:
    mutate = _reviews(hybrid, "mutate")
    pod = gpu_pod("aks-a100")
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                     "values": ["Standard_NC24ads_A100_v4"]}]}]}}}
    done = _create(hybrid, pod)
    assert done.returncode == 0, done.stderr
    stored = json.loads(done.stdout)
    assert stored["metadata"]["annotations"]["gpu-webhook.io/class"] == "workload=training,gpu-type=a100"
    assert stored["spec"]["nodeSelector"] == {"workload": "training"}
    wait_until(lambda: _reviews(hybrid, "mutate") > mutate, 10, "the mutating webhook's review to be counted")


def test_a_mig_pod_gets_its_class(hybrid: Cluster) -> None:
    """The MAP places one validFor family itself; the narrowed webhook still sees such Pods (its match condition
    names the validFor families, for the Pods with two) and adds nothing over the MAP's class."""
    pod = gpu_pod("mig", limits={"nvidia.com/mig-1g.5gb": "1"})
    done = _create(hybrid, pod)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["metadata"]["annotations"]["gpu-webhook.io/class"] == (
        "workload=training,gpu-type=a100")


def test_the_live_cluster_rules_still_speak(hybrid: Cluster) -> None:
    done = _create(hybrid, gpu_pod("too-big", gpus=8))  # the class allows 8; no T4 node has more than 4
    assert done.returncode != 0
    assert "[gpu-never-schedulable]" in done.stderr and 'admission webhook "validate.gpu-webhook.io"' in done.stderr


def _settled(cluster: Cluster) -> tuple[float, float]:
    """The (mutate, validate) review counts once they have not moved for 1.5 s (a review may be counted a moment
    after the API server has its answer)."""
    last: tuple[float, float] | None = None
    since = time.monotonic()
    while True:
        now = _reviews(cluster, "mutate"), _reviews(cluster, "validate")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.5:
            return now
        time.sleep(0.2)


def _after_a_gpu_pod(cluster: Cluster) -> tuple[float, float]:
    """The settled (mutate, validate) review counts once a plain GPU Pod created now has been validated."""
    validate = _settled(cluster)[1]
    assert _create(cluster, gpu_pod("barrier")).returncode == 0
    wait_until(lambda: _reviews(cluster, "validate") > validate, 10, "the barrier Pod's review to be counted")
    return _settled(cluster)


def test_a_cpu_only_pod_never_reaches_the_webhook_and_still_gets_the_native_warnings(hybrid: Cluster) -> None:
    mutate, validate = _after_a_gpu_pod(hybrid)
    pod = gpu_pod("cpu-only", limits={"cpu": "100m", "memory": "64Mi", "hugepages-2Mi": "2Mi"})
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In",
                                                     "values": ["linux"]}]}]}}}
    done = _create(hybrid, pod)
    assert done.returncode == 0, done.stderr
    assert "[gpu-env-without-request]" in done.stderr  # the warn policy's
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cpu-only"}, "spec": {
        "selector": {"matchLabels": {"app": "cpu-only"}}, "template": {
            "metadata": {"labels": {"app": "cpu-only"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"limits": {"cpu": "100m"}}}]}}}}
    assert _create(hybrid, deployment).returncode == 0
    assert _after_a_gpu_pod(hybrid) == (mutate, validate + 1), "only the barrier Pod may reach the webhook"


def test_a_gpu_workload_still_reaches_the_validating_webhook(hybrid: Cluster) -> None:
    validate = _reviews(hybrid, "validate")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpu"}, "spec": {
        "selector": {"matchLabels": {"app": "gpu"}}, "template": {
            "metadata": {"labels": {"app": "gpu"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}
    done = _create(hybrid, deployment)
    assert done.returncode != 0 and "[gpu-never-schedulable]" in done.stderr, done.stderr
    wait_until(lambda: _reviews(hybrid, "validate") > validate, 10, "the Deployment's review to be counted")
