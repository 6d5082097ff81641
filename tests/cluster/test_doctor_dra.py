"""`doctor` on a Pod Pending on a DRA claim: which request, which selectors, how many devices pass each stage, and
why no node can satisfy it (webhook/cluster/doctor.py's "DRA devices" step over webhook/policy/dra_fit.py)."""

from __future__ import annotations

from typing import Any

import pytest
from support.dra import H100, gpu_slice, load

from webhook.admission.loader import load_policy
from webhook.cluster import doctor
from webhook.policy import inventory
from webhook.policy.dra_inventory import view_from_api

A100_SELECTOR = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")'
H100_SELECTOR = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("h100")'


def h100_slice(node: str, gpus: int) -> dict[str, Any]:
    return gpu_slice(node, H100, gpus)


def template(name: str, selector: str, count: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "count": count,
                "selectors": [{"cel": {"expression": selector}}]}}]}}}}


def pod(template_name: str, claim_status: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending"}
    if claim_status:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_status}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}]},
            "status": status}


ALLOCATED = {"metadata": {"namespace": "ml", "name": "trainer-gpu-abc"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-0", "device": "gpu-0"}]}}}}


def devices_step(pod_obj: dict[str, Any]) -> doctor.Step:
    dra = view_from_api([h100_slice("h100-0", 8), h100_slice("h100-1", 8)], [load("deviceclass-gpu.nvidia.com.json")],
                        [ALLOCATED])
    snapshot = inventory.snapshot_from_api(
        claim_templates=[template("a100", A100_SELECTOR), template("h100", H100_SELECTOR),
                         template("nine-h100", H100_SELECTOR, 9)], dra=dra)
    report = doctor.diagnose(load_policy(None), doctor.Facts(pod_obj, snapshot=snapshot))
    (step,) = [s for s in report.steps if s.title == "DRA devices"]
    return step


@pytest.mark.parametrize(
    ("pod_obj", "status", "summary", "evidence"),
    [
        pytest.param(pod("a100"), "fail", "can be allocated on no node: no device of DeviceClass gpu.nvidia.com "
                     "matches", ["its DeviceClass's selectors: 16 devices, at most 8 on one node; and the request's "
                                 "selectors: 0 devices, at most 0 on one node"], id="no-a100-devices"),
        pytest.param(pod("nine-h100"), "fail", "asks for 9 devices of DeviceClass gpu.nvidia.com",
                     ["needs 9 on one node", "and the request's selectors: 16 devices, at most 8 on one node"],
                     id="not-enough-on-one-node"),
        pytest.param(pod("h100"), "ok", "some node has the devices each GPU claim asks for",
                     ["and the request's selectors: 16 devices, at most 8 on one node"], id="fits"),
        pytest.param(pod("a100", claim_status="trainer-gpu-abc"), "ok", "some node has the devices",
                     ["claim gpu (trainer-gpu-abc) is allocated: 1 device(s)"], id="already-allocated"),
    ],
)
def test_the_devices_step(pod_obj: dict[str, Any], status: str, summary: str, evidence: list[str]) -> None:
    step = devices_step(pod_obj)
    assert step.status == status, step
    assert summary in step.summary, step.summary
    said = " | ".join(step.evidence)
    for part in evidence:
        assert part in said, said


def test_the_conclusion_names_the_claim_when_nothing_else_is_broken() -> None:
    dra = view_from_api([h100_slice("h100-0", 8)], [load("deviceclass-gpu.nvidia.com.json")])
    snapshot = inventory.snapshot_from_api(claim_templates=[template("a100", A100_SELECTOR)], dra=dra)
    report = doctor.diagnose(load_policy(None), doctor.Facts(pod("a100"), snapshot=snapshot))
    assert report.broken
    assert "DRA devices: " in report.conclusion and 'request "gpu"' in report.conclusion
