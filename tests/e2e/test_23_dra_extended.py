"""Scenario 23 (DRA, continued): GPUs asked for by a DeviceClass's implicit extended resource
`deviceclass.resource.kubernetes.io/<class>` (KEP-5004, beta and on in 1.36) through the real API server, with the
packaged rules: counted against the class maximum and refused with the rule's message, placed by class when within
it. And what the API server itself accepts for that name (a native resource name to its validation: requests
without limits, below them, fractional), so that the webhook, not the API server, is what holds the line.

kwok nodes and no DRA driver: admission needs neither (kube-scheduler makes the Pod's claim later)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from cluster import GPU, Cluster, edited_rules, yaml_of

pytestmark = pytest.mark.e2e

DENIED = re.compile(r'admission webhook "(mutate|validate)\.gpu-webhook\.io" denied the request: ')
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def _pod(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": resources}]}}


def test_the_implicit_name_over_the_class_maximum_is_refused(cluster: Cluster, namespace: str) -> None:
    pod = _pod("sixteen", {"limits": {IMPLICIT: "16"}})
    done = cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml_of(pod), check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert DENIED.search(done.stderr), done.stderr
    assert "[gpu-class-max]" in done.stderr
    assert (f"the Pod needs 16 GPUs ({IMPLICIT}: containers and sidecars, or the largest init container) but class "
            "workload=inference,gpu-type=t4 allows at most 8 (set by gpu-type t4)") in done.stderr
    assert cluster.kubectl("get", "pod", "sixteen", "-n", namespace, check=False).returncode == 1


def test_the_implicit_name_within_the_maximum_is_placed_by_class(cluster: Cluster, namespace: str) -> None:
    done = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-",
                           input=yaml_of(_pod("one", {"limits": {IMPLICIT: "1"}})))
    stored = json.loads(done.stdout)
    assert stored["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in stored["spec"]["tolerations"]
    assert stored["metadata"]["annotations"]["gpu-webhook.io/class"] == "workload=inference,gpu-type=t4"
    # The API server defaulted the request to the limit: what kube-scheduler will allocate.
    assert stored["spec"]["containers"][0]["resources"]["requests"] == {IMPLICIT: "1"}


def test_the_api_server_accepts_what_the_rules_refuse(cluster: Cluster, namespace: str) -> None:
    """With the webhook's quantity rules off, the API server takes the implicit name requests-only, below its limit
    and fractional (it is in the kubernetes.io namespace, so not an extended resource to its validation), while an
    extended resource (nvidia.com/gpu) with requests below limits is its own refusal."""
    def quantity_rules_off(policy: dict[str, Any]) -> None:
        policy["spec"]["enforcement"] = {r: "off" for r in (
            "gpu-limits-required", "gpu-requests-equal-limits", "gpu-whole-number")}

    with edited_rules(cluster, quantity_rules_off):
        for name, resources in (("requests-only", {"requests": {IMPLICIT: "2"}}),
                                ("below-limit", {"requests": {IMPLICIT: "1"}, "limits": {IMPLICIT: "2"}}),
                                ("fraction", {"limits": {IMPLICIT: "500m"}})):
            done = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                                   input=yaml_of(_pod(name, resources)), check=False)
            assert done.returncode == 0, f"{name}: {done.stderr}"
        plain = _pod("plain", {"requests": {GPU: "1"}, "limits": {GPU: "2"}})
        done = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml_of(plain),
                               check=False)
        assert done.returncode == 1 and f"must be equal to {GPU} limit of 2" in done.stderr, done.stderr
        assert not DENIED.search(done.stderr)  # the API server's own validation, not the webhook
