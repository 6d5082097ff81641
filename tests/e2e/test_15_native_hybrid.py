"""Hybrid mode on the real API server: the native policies, gpu-webhook's mutating webhook narrowed by the
match condition of manifests/components/hybrid to the Pods native mode defers, and its validating webhook for
the rules that need the live cluster. The module starts its own control plane (`running_cluster`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import Cluster, gpu_pod, running_cluster, wait_until
from test_15_native import apply_native

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
        component = yaml.safe_load((REPO / "manifests" / "components" / "hybrid" / "kustomization.yaml").read_text())
        (operation,) = yaml.safe_load(component["patches"][0]["patch"])
        cluster.kubectl("patch", "mutatingwebhookconfiguration", "gpu-webhook", "--type=json",
                        "-p", json.dumps([operation]))
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
