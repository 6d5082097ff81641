"""`dra-unsatisfiable` (webhook/policy/dra_fit.py): a GPU request of a claim or template that no node's devices can
satisfy, judged against the DRA inventory with the packaged rules (t4 is the default gpu-type, its selector
`productName.lowerAscii().contains("t4")`), and a placed default that nothing matches held back."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest
from support.dra import H100, NVIDIA, T4, gpu_slice, load

from webhook.admission.loader import load_policy
from webhook.policy import inventory
from webhook.policy.dra_inventory import view_from_api
from webhook.policy.engine import Context, evaluate
from webhook.policy.findings import Verdict
from webhook.policy.patch import operations

SLICES = [gpu_slice("h100-0", H100, 8, memory="81559Mi"), gpu_slice("h100-1", H100, 8, memory="81559Mi"),
          gpu_slice("t4-0", T4, 4, memory="15Gi")]
CLASSES = [load("deviceclass-gpu.nvidia.com.json")]


def template(*requests: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpus", "namespace": "default", "labels": labels or {}},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def exactly(count: int = 1, selector: str | None = None, device_class: str = NVIDIA, name: str = "gpu"
            ) -> dict[str, Any]:
    ask: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selector is not None:
        ask["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": ask}


def decide(obj: dict[str, Any], slices: list[dict[str, Any]] | None = None,
           classes: list[dict[str, Any]] | None = None, synced: bool = True) -> Verdict:
    dra = view_from_api(SLICES if slices is None else slices, CLASSES if classes is None else classes)
    snapshot = inventory.snapshot_from_api(dra=dra, synced=synced)
    return evaluate(load_policy(None), obj, Context("default", mode="mutate", operation="CREATE",
                                                    inventory=snapshot))


def said(verdict: Verdict, rule: str) -> list[str]:
    return [f.message for f in (*verdict.violations, *verdict.warnings) if f.rule == rule]


def added_selectors(verdict: Verdict, obj: dict[str, Any]) -> list[str]:
    patched = jsonpatch.apply_patch(obj, operations(obj, verdict.edits))
    requests = patched["spec"]["spec"]["devices"]["requests"]
    return [s["cel"]["expression"] for r in requests for s in r.get("exactly", {}).get("selectors", [])]


H100_SELECTOR = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("h100")'
MEMORY_40GI = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'


@pytest.mark.parametrize(
    ("requests", "labels", "expected"),
    [
        pytest.param([exactly(1)], None, [], id="default-t4-fits"),
        pytest.param([exactly(8, H100_SELECTOR)], None, [], id="eight-h100-on-one-node"),
        pytest.param([exactly(1, MEMORY_40GI)], None, [], id="quantity-selector-fits-the-h100s"),
        pytest.param([exactly(9, H100_SELECTOR)], None,
                     ["asks for 9 devices of DeviceClass gpu.nvidia.com", "16 match, at most 8 on one node",
                      "ask for 8 or fewer"], id="more-than-one-node-has"),
        pytest.param([exactly(5)], {"gpu-webhook.io/gpu-type": "t4"},
                     ["asks for 5 devices of DeviceClass gpu.nvidia.com", 'contains(\\"t4\\")',
                      "4 match, at most 4 on one node"], id="the-labelled-class-has-too-few-on-one-node"),
        pytest.param([exactly(5)], None, [], id="a-default-with-too-few-is-held-back-the-h100s-fit"),
        pytest.param([exactly(1, 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA B200"')], None,
                     ["can be allocated on no node", "productName NVIDIA H100 80GB HBM3 (2 nodes, 16 devices), "
                      "Tesla T4 (1 node, 4 devices)"], id="no-such-product"),
        pytest.param([exactly(1, 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("100Gi")) >= 0')],
                     None, ["can be allocated on no node", "20 devices of that DeviceClass on 3 nodes"],
                     id="no-device-has-the-memory"),
        pytest.param([exactly(1, device_class="gpu.example.com")], None, [], id="not-a-gpu-class-not-judged"),
        pytest.param([{"name": "gpu", "firstAvailable": [
            {"name": "b200", "deviceClassName": NVIDIA, "count": 1,
             "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "B200"'}}]},
            {"name": "h100", "deviceClassName": NVIDIA, "count": 1,
             "selectors": [{"cel": {"expression": H100_SELECTOR}}]}]}], None, [], id="first-available-one-fits"),
        pytest.param([{"name": "gpu", "firstAvailable": [
            {"name": "b200", "deviceClassName": NVIDIA, "count": 1,
             "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == "B200"'}}]},
            {"name": "h100", "deviceClassName": NVIDIA, "count": 9,
             "selectors": [{"cel": {"expression": H100_SELECTOR}}]}]}], None,
            ['request "gpu": none of its firstAvailable subrequests can be allocated', "at most 8 on one node"],
            id="first-available-none-fits"),
        pytest.param([exactly(1, 'device.attributes["gpu.nvidia.com"].productName.nope()')], None, [],
                     id="a-selector-that-fails-decides-nothing"),
    ],
)
def test_requests_against_the_devices(requests: list[dict[str, Any]], labels: dict[str, str] | None,
                                      expected: list[str]) -> None:
    messages = said(decide(template(*requests, labels=labels)), "dra-unsatisfiable")
    if not expected:
        assert messages == []
        return
    (message,) = messages
    assert message.startswith('ResourceClaimTemplate "gpus": ')
    for part in expected:
        assert part in message, message


def test_a_device_class_that_does_not_exist() -> None:
    mig = {**CLASSES[0], "metadata": {"name": "mig.nvidia.com"}}
    (message,) = said(decide(template(exactly(1)), classes=[mig]), "dra-unsatisfiable")
    assert "DeviceClass gpu.nvidia.com, which does not exist in the cluster (it has: mig.nvidia.com)" in message
    assert message.endswith("use a DeviceClass that exists, or create gpu.nvidia.com")


@pytest.mark.parametrize(
    ("slices", "classes", "synced"),
    [
        pytest.param([], [], True, id="devices-not-listed"),
        pytest.param(SLICES, CLASSES, False, id="inventory-not-synced"),
    ],
)
def test_nothing_is_said_without_the_devices(slices: list[dict[str, Any]], classes: list[dict[str, Any]],
                                             synced: bool) -> None:
    verdict = decide(template(exactly(1, 'device.attributes["gpu.nvidia.com"].productName == "B200"')), slices,
                     classes, synced)
    assert said(verdict, "dra-unsatisfiable") == []


def test_the_warning_is_a_warning_and_the_claim_is_admitted() -> None:
    verdict = decide(template(exactly(5, 'device.attributes["gpu.nvidia.com"].productName == "Tesla T4"')))
    assert verdict.allowed
    assert [f.rule for f in verdict.warnings] == ["dra-unsatisfiable"]


def test_a_default_no_device_matches_is_held_back() -> None:
    """Only H100s in the cluster: the default gpu-type t4's selector would leave the template no device, so it is not
    added, and the warning says why and what the cluster has."""
    obj = template(exactly(1))
    verdict = decide(obj, slices=SLICES[:2])
    assert verdict.allowed
    assert said(verdict, "dra-unsatisfiable") == []
    (held,) = said(verdict, "gpu-class-skipped")
    assert held.startswith('gpu-type t4 (from the defaults) not applied to ResourceClaimTemplate "gpus" request "gpu"')
    assert "productName NVIDIA H100 80GB HBM3 (2 nodes, 16 devices)" in held
    assert not any("contains(\"t4\")" in e for e in added_selectors(verdict, obj))


def test_a_default_that_matches_is_placed() -> None:
    obj = template(exactly(1))
    verdict = decide(obj)
    assert said(verdict, "gpu-class-skipped") == []
    assert added_selectors(verdict, obj) == ['device.attributes["gpu.nvidia.com"].productName.lowerAscii()'
                                             '.contains("t4")']


def test_a_class_the_author_chose_is_kept_and_reported() -> None:
    """The claim's own label (gpu-type t4) is never held back: the request is reported instead."""
    obj = template(exactly(1), labels={"gpu-webhook.io/gpu-type": "t4"})
    verdict = decide(obj, slices=SLICES[:2])
    assert said(verdict, "gpu-class-skipped") == []
    (message,) = said(verdict, "dra-unsatisfiable")
    assert 'contains(\\"t4\\")' in message and "productName NVIDIA H100 80GB HBM3 (2 nodes, 16 devices)" in message
    assert any('contains("t4")' in e for e in added_selectors(verdict, obj))


@pytest.mark.parametrize(
    ("obj", "kwargs"),
    [
        pytest.param(template(exactly(1, 'device.attributes["gpu.nvidia.com"].productName == "B200"')), {},
                     id="no-device"),
        pytest.param(template(exactly(9, H100_SELECTOR)), {}, id="too-few-on-one-node"),
        pytest.param(template(exactly(1)), {"classes": [{**CLASSES[0], "metadata": {"name": "mig.nvidia.com"}}]},
                     id="no-device-class"),
        pytest.param(template(exactly(1)), {"slices": SLICES[:2]}, id="held-back"),
    ],
)
def test_kubectl_shows_the_fix(obj: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """A warning goes on the wire cut to 120 characters, keeping what follows its last "; " when that is short."""
    from webhook.admission.review import WARNING_MAX_CHARS, sanitize_warning

    verdict = decide(obj, **kwargs)
    (finding,) = [f for f in verdict.warnings if f.rule in ("dra-unsatisfiable", "gpu-class-skipped")]
    fix = finding.message.rpartition("; ")[2]
    assert len(fix) <= WARNING_MAX_CHARS // 2 and sanitize_warning(finding.render()).endswith(fix)

