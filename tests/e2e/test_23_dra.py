"""Scenario 23: DRA claims through the real API server (resource.k8s.io/v1, GA in 1.36): ResourceClaimTemplates and
ResourceClaims placed by class and refused with the rule's message, and a Pod that asks for a GPU both ways.

No DRA driver runs here (kwok nodes): admission does not need one, and the API server neither checks that a
DeviceClass exists nor allocates at create. What a driver adds (allocation, a Pod running on the devices) is
not shown by this file; docs/dra.md says so."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from cluster import GPU, Cluster, edited_rules, wait_until, webhook_readyz, yaml_of

pytestmark = pytest.mark.e2e

DENIED = re.compile(r'admission webhook "(mutate|validate)\.gpu-webhook\.io" denied the request: ')
T4 = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("t4")'
A100 = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")'


def _template(name: str, *requests: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def _gpu(name: str = "gpu", **exactly: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}


def _create(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    done = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=yaml_of(obj))
    return dict(json.loads(done.stdout))


def _refused(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> str:
    done = cluster.kubectl("create", "-n", namespace, "-f", "-", input=yaml_of(obj), check=False)
    assert done.returncode == 1, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    kind = "resourceclaimtemplate" if obj["kind"] == "ResourceClaimTemplate" else obj["kind"].lower()
    absent = cluster.kubectl("get", kind, obj["metadata"]["name"], "-n", namespace, check=False)
    assert absent.returncode == 1, f"a refused {obj['kind']} was created"
    assert DENIED.search(done.stderr), done.stderr
    return done.stderr


def _selectors(stored: dict[str, Any], index: int = 0) -> list[str]:
    exactly = stored["spec"]["spec"]["devices"]["requests"][index]["exactly"]
    return [s["cel"]["expression"] for s in exactly.get("selectors", [])]


def test_a_template_gets_its_class_selector(cluster: Cluster, namespace: str) -> None:
    default = _create(cluster, namespace, _template("one-gpu", _gpu()))
    assert _selectors(default) == [T4]  # the cluster default class (gpu-type t4)
    labelled = _create(cluster, namespace, _template("a100", _gpu(count=2), labels={"gpu-webhook.io/gpu-type": "a100"}))
    assert _selectors(labelled) == [A100]
    own = _create(cluster, namespace, _template("own", _gpu(selectors=[{"cel": {"expression": "true"}}])))
    assert _selectors(own) == ["true"]  # never over what the author wrote


def test_a_claim_over_the_class_maximum_is_refused(cluster: Cluster, namespace: str) -> None:
    err = _refused(cluster, namespace, _template("nine", _gpu(count=9)))
    assert "[dra-claim-max]" in err
    assert ('ResourceClaimTemplate "nine": request "gpu" (spec.spec.devices.requests[0].exactly) asks for 9 '
            "gpu.nvidia.com devices but at most 8 are allowed") in err
    assert "set count to 8 or fewer" in err


def test_admin_access_is_refused_with_the_rules_message(cluster: Cluster, namespace: str) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "peek"},
             "spec": {"devices": {"requests": [_gpu(adminAccess=True)]}}}
    err = _refused(cluster, namespace, claim)
    # /mutate runs before the API server's own admin-access check (the namespace label), so its message wins.
    assert "[dra-admin-access]" in err
    assert 'ResourceClaim "peek": request "gpu"' in err and "remove adminAccess" in err


def test_a_device_class_the_namespace_may_not_use_is_refused(cluster: Cluster, namespace: str) -> None:
    def mig_only(policy: dict[str, Any]) -> None:
        policy["spec"].setdefault("namespaces", {})[namespace] = {"dra": {"deviceClasses": ["mig.nvidia.com"]}}

    with edited_rules(cluster, mig_only):
        err = _refused(cluster, namespace, _template("whole", _gpu()))
        assert "[dra-class-not-allowed]" in err
        assert f"asks for DeviceClass gpu.nvidia.com, which namespace {namespace} may not use; use one of: " \
               "mig.nvidia.com" in err
        mig = _create(cluster, namespace, _template("mig", {"name": "mig", "exactly": {
            "deviceClassName": "mig.nvidia.com"}}))
        assert mig["metadata"]["name"] == "mig"


def test_a_pod_asking_for_a_gpu_both_ways_is_refused(cluster: Cluster, namespace: str) -> None:
    _create(cluster, namespace, _template("two-gpus", _gpu(count=2)))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "both"},
           "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"limits": {GPU: "1"}, "claims": [{"name": "gpus"}]}}]}}

    def refused() -> str | None:  # once the webhook's inventory has the template (a watch event away)
        done = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml_of(pod),
                               check=False)
        return done.stderr if done.returncode == 1 and "[dra-double-allocation]" in done.stderr else None

    err = str(wait_until(refused, 30, "the webhook to refuse the Pod for double allocation", interval=0.5))
    assert DENIED.search(err), err
    assert 'claim "gpus" (ResourceClaimTemplate "two-gpus")' in err and "ask for GPUs one way only" in err


def test_the_inventory_lists_and_watches_the_dra_objects(cluster: Cluster, namespace: str) -> None:
    """ResourceSlices, DeviceClasses and ResourceClaims reach the running webhook's DRA inventory through the real
    API server (its list, then its watch: ADDED and DELETED), as `/readyz` counts them (`checks.inventory.dra`).
    The slice is for a kwok node, under a driver of this test's own, so no other test's devices change."""
    driver = "inventory.e2e.gpu-webhook.io"  # a driver name is at most 63 bytes
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": driver},
                    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}}
    resource_slice = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": driver},
                      "spec": {"driver": driver, "nodeName": "gpu-t4-0", "pool": {
                          "name": "gpu-t4-0", "generation": 1, "resourceSliceCount": 1}, "devices": [
                          {"name": f"gpu-{i}", "attributes": {"productName": {"string": "Tesla T4"}}}
                          for i in range(2)]}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "by-name"},
             "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": driver}}]}}}

    def counts() -> dict[str, int]:
        found = webhook_readyz(cluster)["checks"]["inventory"]
        assert found["synced"] is True, found
        return dict(found["dra"])

    before = counts()
    added = {k: v + 1 for k, v in before.items()}
    try:
        for obj in (device_class, resource_slice):
            cluster.kubectl("create", "-f", "-", input=yaml_of(obj))
        _create(cluster, namespace, claim)
        wait_until(lambda: counts() == added, 30, f"the webhook's DRA inventory to hold one more of each: {added}")
    finally:
        cluster.kubectl("delete", "-n", namespace, "resourceclaim", "by-name", "--ignore-not-found", check=False)
        for kind in ("resourceslice", "deviceclass"):
            cluster.kubectl("delete", kind, driver, "--ignore-not-found", check=False)
    wait_until(lambda: counts() == before, 30, f"the deletions to reach the webhook's DRA inventory: {before}")
