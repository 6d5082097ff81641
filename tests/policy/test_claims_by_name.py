"""A Pod's ResourceClaims by name (`resourceClaimName`), read from the DRA inventory, count in `dra-pod-max` and
`dra-double-allocation` like its claim templates (the rules of tests/rule-cases/dra/rules: t4 at most 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook.admission.loader import load_policy
from webhook.policy import inventory
from webhook.policy.dra_inventory import view_from_api
from webhook.policy.engine import Context, evaluate

DRA_RULES = Path(__file__).resolve().parents[2] / "tests" / "rule-cases" / "dra" / "rules"
NODE = {"kind": "Node", "metadata": {"name": "n1", "labels": {"gpu-type": "t4"}},
        "status": {"allocatable": {"nvidia.com/gpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}}
TWO = {"metadata": {"namespace": "default", "name": "two-gpus"},
       "spec": {"spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                             "count": 2}}]}}}}


def claim(name: str, *requests: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {"kind": "ResourceClaim", "metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": list(requests)}}}


def gpus(count: Any, name: str = "a", device_class: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, "count": count}}


CLAIMS = [
    claim("three", gpus(3)),
    claim("all", {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}),
    claim("first-available", {"name": "a", "firstAvailable": [
        {"name": "mig", "deviceClassName": "mig.nvidia.com", "count": 1},
        {"name": "whole", "deviceClassName": "gpu.nvidia.com", "count": 3}]}),
    claim("retyped", gpus("3"), {"name": 7}, "x"),
    claim("not-a-gpu", gpus(8, device_class="example.com/fpga")),
    claim("elsewhere", gpus(3), namespace="other"),
]


def pod(*claims: dict[str, Any], gpu_limit: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"claims": [{"name": c["name"]} for c in claims]}
    if gpu_limit:
        resources["limits"] = {"nvidia.com/gpu": gpu_limit}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"resourceClaims": list(claims), "containers": [{"name": "c", "image": "x",
                                                                     "resources": resources}]}}


def said(verdict: Any) -> list[str]:
    return [f.render() for f in (*verdict.violations, *verdict.warnings)]


def decide(obj: dict[str, Any], *, synced: bool = True) -> Any:
    snapshot = inventory.snapshot_from_api([NODE], claim_templates=[TWO], dra=view_from_api(resource_claims=CLAIMS),
                                           synced=synced)
    return evaluate(load_policy(DRA_RULES), obj, Context("default", inventory=snapshot))


def by_name(name: str, claim_name: str) -> dict[str, Any]:
    return {"name": name, "resourceClaimName": claim_name}


TEMPLATE = {"name": "t", "resourceClaimTemplateName": "two-gpus"}


@pytest.mark.parametrize(
    ("claims", "violations", "text"),
    [
        pytest.param([TEMPLATE, by_name("b", "three")], ["dra-pod-max"],
                     'spec.resourceClaims ("t", "b") ask for up to 5 GPU devices together but at most 4 are allowed',
                     id="template-and-claim-over-the-class-maximum"),
        pytest.param([by_name("b", "three")], [], "", id="one-claim-within"),
        pytest.param([TEMPLATE, by_name("b", "first-available")], ["dra-pod-max"], "up to 5 GPU devices",
                     id="first-available-counts-its-largest-gpu-alternative"),
        pytest.param([TEMPLATE, by_name("b", "all")], [], "", id="allocation-mode-all-adds-nothing"),
        pytest.param([TEMPLATE, by_name("b", "retyped")], [], "", id="retyped-count-adds-nothing"),
        pytest.param([TEMPLATE, by_name("b", "not-a-gpu")], [], "", id="another-device-class"),
        pytest.param([TEMPLATE, by_name("b", "elsewhere")], [], "", id="another-namespaces-claim"),
        pytest.param([TEMPLATE, by_name("b", "missing")], [], "", id="not-in-the-inventory"),
        pytest.param([TEMPLATE, {"name": "b", "resourceClaimName": ["three"]}], [], "", id="retyped-name"),
    ],
)
def test_pod_sums_count_claims_by_name(claims: list[dict[str, Any]], violations: list[str], text: str) -> None:
    verdict = decide(pod(*claims))
    assert sorted(verdict.rules) == violations, said(verdict)
    assert not text or any(text in m for m in said(verdict)), said(verdict)


def test_double_allocation_names_the_resource_claim() -> None:
    verdict = decide(pod(by_name("gpus", "three"), gpu_limit="1"))
    message = next(m for m in said(verdict) if "[dra-double-allocation]" in m)
    assert 'through claim "gpus" (ResourceClaim "three")' in message, message
    assert "ask for GPUs one way only" in message


def test_a_claim_by_name_alone_makes_a_gpu_pod_placed_by_its_class() -> None:
    verdict = decide(pod(by_name("gpus", "three")))
    assert verdict.allowed and verdict.gpu_class == "gpu-type=t4"


def test_an_unsynced_inventory_counts_no_claim_by_name() -> None:
    verdict = decide(pod(TEMPLATE, by_name("b", "three")), synced=False)
    assert "dra-pod-max" not in verdict.rules
