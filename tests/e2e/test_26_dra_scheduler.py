"""Scenario 26: the webhook's view of DRA devices against the real scheduler's allocation, on kwok nodes.

The DeviceClass is NVIDIA's (`gpu.nvidia.com`, selecting `type == "gpu"`); the ResourceSlices are posted through the
API server for the kwok GPU nodes, shaped like NVIDIA's DRA driver's (DRA-FACTS.md §3.3: `type`, `productName`,
`architecture`, `uuid`, `driverVersion` and `cudaComputeCapability` as versions, capacity `memory`): an A100 pool on
the two a100 nodes (8 each) and a T4 pool on the two t4 nodes (4 each). They are hand-made, as kube-scheduler's own
`scheduler_perf` makes them: no DRA driver runs on kwok nodes, kwok runs a Pod once the scheduler has allocated its
claims and bound it. Nothing here is posted for a real kubelet's node (the kubelet deletes such slices at start).

What it shows, all through the real kube-scheduler v1.36.3:
- a template placed by class (the default t4) is allocated on a T4 device of a t4 node (the claim's status);
- a request no device matches is warned at create (`dra-unsatisfiable`), stays Pending, and `doctor` says why;
- a defaulted class value whose devices are too few on one node is held back (`gpu-class-skipped`), and the
  scheduler allocates the template's request elsewhere, as the webhook said it could;
- a ResourceClaim by name counts in the Pod's sum (`dra-pod-max`);
- a table of selectors (quantity, semver, string functions): the webhook's verdict at create and the scheduler's
  allocation agree on every row.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster, wait_until, webhook_readyz, yaml_of

pytestmark = pytest.mark.e2e

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                              "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
# (product, architecture, compute capability, memory) as NVIDIA's driver publishes them for whole GPUs
A100 = ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", "81920Mi")
T4 = ("Tesla T4", "Turing", "7.5.0", "15360Mi")
POOLS = {"gpu-a100-0": (A100, 8), "gpu-a100-1": (A100, 8), "gpu-t4-0": (T4, 4), "gpu-t4-1": (T4, 4)}
LABEL = "gpu-webhook.io/gpu-type"


def _slice(node: str) -> dict[str, Any]:
    (product, architecture, capability, memory), count = POOLS[node]
    devices = [{"name": f"gpu-{minor}", "attributes": {
        "type": {"string": "gpu"}, "productName": {"string": product}, "brand": {"string": "Nvidia"},
        "architecture": {"string": architecture},
        "uuid": {"string": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{minor}')}"},
        "driverVersion": {"version": "580.159.4"}, "cudaDriverVersion": {"version": "13.0.0"},
        "cudaComputeCapability": {"version": capability}},
        "capacity": {"memory": {"value": memory}}} for minor in range(count)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1}, "devices": devices}}


@pytest.fixture(scope="module")
def devices(cluster: Cluster) -> Iterator[None]:
    """NVIDIA's DeviceClass and the kwok nodes' slices, in the webhook's inventory; removed afterwards, and gone
    from the inventory before the next module runs (whose own device counts must not move under it)."""

    def held_now() -> dict[str, int]:
        return dict(webhook_readyz(cluster)["checks"]["inventory"]["dra"])  # slices, classes, claims

    before = held_now()
    cluster.kubectl("apply", "-f", "-", input=yaml_of(DEVICE_CLASS))
    for node in POOLS:
        cluster.kubectl("apply", "-f", "-", input=yaml_of(_slice(node)))

    def held() -> bool:
        found = webhook_readyz(cluster)["checks"]["inventory"]
        return bool(found["synced"] and found["dra"]["resourceslices"] >= len(POOLS))

    wait_until(held, 60, "the webhook's inventory to hold the slices")
    try:
        yield
    finally:
        for node in POOLS:
            cluster.kubectl("delete", "resourceslice", f"{node}-{DRIVER}", "--ignore-not-found", check=False)
        cluster.kubectl("delete", "deviceclass", DRIVER, "--ignore-not-found", check=False)
        # (the claims go with the tests' namespaces, deleted in the background: not waited for)
        def as_before() -> bool:  # at most as many: an earlier module's leftovers may go meanwhile (GC)
            now = held_now()
            return all(now[kind] <= before[kind] for kind in ("resourceslices", "deviceclasses"))

        wait_until(as_before, 60, f"the webhook's inventory to drop the slices and the class: {before}")


def _request(count: int = 1, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": "gpu", "exactly": exactly}


def _template(name: str, request: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"spec": {"devices": {"requests": [request]}}}}


def _claim(name: str, request: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": labels or {}}, "spec": {"devices": {"requests": [request]}}}


def _pod(name: str, claims: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod using the claims {name in the Pod: "template:<name>" or "claim:<name>"}."""
    refs = [{"name": key, ("resourceClaimTemplateName" if value.startswith("template:") else "resourceClaimName"):
             value.split(":", 1)[1]} for key, value in claims.items()]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": key} for key in claims]}}],
                     "resourceClaims": refs}}


def _create(cluster: Cluster, namespace: str, obj: dict[str, Any], check: bool = True
            ) -> tuple[dict[str, Any], str]:
    """(the stored object, kubectl's stderr: the warnings)."""
    done = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=yaml_of(obj), check=check)
    return (json.loads(done.stdout) if done.returncode == 0 else {}), done.stderr


def _get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    done = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def _claim_of(cluster: Cluster, namespace: str, pod: str, claim: str = "gpu") -> dict[str, Any]:
    statuses = _get(cluster, namespace, "pod", pod).get("status", {}).get("resourceClaimStatuses", [])
    made = next((s.get("resourceClaimName") for s in statuses if s.get("name") == claim), None)
    return _get(cluster, namespace, "resourceclaim", made) if made else {}


def _allocated_pools(claim: dict[str, Any]) -> list[str]:
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return [r["pool"] for r in results]


def _outcome(cluster: Cluster, namespace: str, pod: str, claim: dict[str, Any] | None = None) -> str | None:
    """"allocated:<pools>" once the scheduler allocated the Pod's claim and bound it, "unschedulable" once it says
    it cannot, else None (not decided yet)."""
    found = _get(cluster, namespace, "pod", pod)
    if found.get("spec", {}).get("nodeName"):
        allocated = (_get(cluster, namespace, "resourceclaim", claim["metadata"]["name"]) if claim is not None
                     else _claim_of(cluster, namespace, pod))
        return "allocated:" + ",".join(sorted(set(_allocated_pools(allocated))))
    for condition in found.get("status", {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return "unschedulable"
    return None


def _doctor(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "webhook", "doctor", pod, "-n", namespace, "-o", "json"],
                          capture_output=True, text=True, env=cluster.env(), timeout=120, check=False)
    print(f"doctor {namespace}/{pod} exit {done.returncode}:\n{done.stdout}{done.stderr}")
    return dict(json.loads(done.stdout)) if done.stdout.strip() else {}


def test_a_template_placed_by_class_is_allocated_on_its_devices(cluster: Cluster, namespace: str,
                                                                devices: None) -> None:
    template, warnings = _create(cluster, namespace, _template("t4", _request()))
    selectors = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert [s["cel"]["expression"] for s in selectors] == [
        'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("t4")']
    assert "Warning" not in warnings, warnings
    _create(cluster, namespace, _pod("on-a-t4", {"gpu": "template:t4"}))
    outcome = wait_until(lambda: _outcome(cluster, namespace, "on-a-t4"), 90, "the scheduler to place the Pod")
    print(f"template placed by the default class: {outcome}")
    assert outcome in ("allocated:gpu-t4-0", "allocated:gpu-t4-1")


def test_a_request_no_device_matches_is_warned_stays_pending_and_doctor_says_why(cluster: Cluster, namespace: str,
                                                                                devices: None) -> None:
    h100 = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("h100")'
    _, warnings = _create(cluster, namespace, _template("h100", _request(selector=h100)))
    print(f"warnings at create: {warnings}")
    assert "[dra-unsatisfiable]" in warnings and 'ResourceClaimTemplate "h100"' in warnings
    _create(cluster, namespace, _pod("wants-h100", {"gpu": "template:h100"}))
    outcome = wait_until(lambda: _outcome(cluster, namespace, "wants-h100"), 90, "the scheduler's verdict")
    assert outcome == "unschedulable"
    report = _doctor(cluster, namespace, "wants-h100")
    (step,) = [s for s in report["steps"] if s["step"] == "DRA devices"]
    assert step["status"] == "fail" and "can be allocated on no node" in step["summary"], step
    assert "productName NVIDIA A100-SXM4-80GB (2 nodes, 16 devices), Tesla T4 (2 nodes, 8 devices)" in \
        step["summary"]
    assert report["conclusion"].startswith("DRA devices: ")


def test_a_default_with_too_few_devices_on_one_node_is_held_back(cluster: Cluster, namespace: str,
                                                                 devices: None) -> None:
    """Five GPUs: no t4 node has five T4s, so the default t4's selector is held back (warned); the request, with
    the DeviceClass's selector only, is allocated on an A100 node's devices by the scheduler, as the webhook said.
    (The Pod gets the training class's nodeSelector by its label, so it may land there.)"""
    template, warnings = _create(cluster, namespace, _template("five", _request(5)))
    print(f"warnings at create: {warnings}")
    assert "[gpu-class-skipped]" in warnings and "[dra-unsatisfiable]" not in warnings
    assert "selectors" not in template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    _create(cluster, namespace, _pod("five-gpus", {"gpu": "template:five"}, {LABEL: "a100"}))
    outcome = wait_until(lambda: _outcome(cluster, namespace, "five-gpus"), 90, "the scheduler to place the Pod")
    assert outcome in ("allocated:gpu-a100-0", "allocated:gpu-a100-1"), outcome


def test_a_claim_by_name_counts_in_the_pods_sum(cluster: Cluster, namespace: str, devices: None) -> None:
    """A template of 5 and a ResourceClaim of 4: 9 GPU devices, over the class's 8 (`dra-pod-max`)."""
    _create(cluster, namespace, _template("five", _request(5)))
    _create(cluster, namespace, _claim("four", _request(4)))

    def refused() -> str:
        done, err = _create(cluster, namespace, _pod("nine", {"a": "template:five", "b": "claim:four"}), check=False)
        if done:  # admitted before the webhook's inventory held the claim: try again
            cluster.kubectl("delete", "pod", "nine", "-n", namespace, "--wait=true")
        return err if "[dra-pod-max]" in err else ""

    err = wait_until(refused, 30, "the Pod over the class maximum to be refused")
    print(f"refused: {err}")
    assert "ask for up to 9 GPU devices together but at most 8 are allowed" in err, err


SELECTORS = [
    # (selector, the class label that places the Pod where those devices are, devices expected: "a100"/"t4"/none)
    ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', "a100", "a100"),
    ('device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("100Gi"))', "a100", None),
    ('device.attributes["gpu.nvidia.com"].cudaComputeCapability.isLessThan(semver("8.0.0"))', "t4", "t4"),
    ('device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("999.0.0")) >= 0', "t4", None),
    ('device.attributes["gpu.nvidia.com"].productName.matches("^Tesla T[0-9]+$")', "t4", "t4"),
    ('device.attributes["gpu.nvidia.com"].architecture.lowerAscii() == "blackwell"', "a100", None),
    ('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA A")', "a100", "a100"),
    ('"sku" in device.attributes["gpu.nvidia.com"]', "t4", None),
]


def test_selectors_the_webhook_and_the_scheduler_agree_on(cluster: Cluster, namespace: str, devices: None) -> None:
    rows = []
    for index, (selector, label, expected) in enumerate(SELECTORS):
        claim, warnings = _create(cluster, namespace, _claim(f"sel-{index}", _request(selector=selector),
                                                             {LABEL: label}))
        _create(cluster, namespace, _pod(f"sel-{index}", {"gpu": f"claim:sel-{index}"}, {LABEL: label}))
        rows.append((index, selector, expected, "[dra-unsatisfiable]" in warnings, claim))
    table = []
    for index, selector, expected, warned, claim in rows:
        outcome = wait_until(lambda i=index, c=claim: _outcome(cluster, namespace, f"sel-{i}", c), 90,
                             f"the scheduler's verdict on selector {index}")
        scheduled = outcome != "unschedulable"
        table.append(f"{selector} | webhook: {'unsatisfiable' if warned else 'satisfiable'} | scheduler: {outcome}")
        assert warned is (expected is None), f"row {index}: the webhook {'warned' if warned else 'did not warn'}"
        assert scheduled is (expected is not None), f"row {index}: the scheduler said {outcome}"
        if expected is not None:
            assert str(outcome).startswith(f"allocated:gpu-{expected}-"), outcome
    print("selector | the webhook at create | the scheduler\n" + "\n".join(table))
