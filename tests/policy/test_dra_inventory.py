"""The DRA part of the inventory (webhook/policy/dra_inventory.py): ResourceSlices, DeviceClasses and ResourceClaims
parsed field by field, indexed by driver, node and attribute, and the questions the rules ask of them."""

from __future__ import annotations

from typing import Any

import pytest
from support.dra import H100, NVIDIA, T4, gpu_slice, load

from webhook.policy import dra_inventory as dra
from webhook.policy.device_selectors import DeviceQuery
from webhook.policy.dra_inventory import Alternative, ClaimRequest, DraIndex

# --------------------------------------------------------------------------------------------- parsing


def test_a_whole_gpu_as_nvidias_driver_publishes_it() -> None:
    parsed = dra.slice_from_api(load("resourceslice-nvidia-h200-composed.json"))
    assert (parsed.name, parsed.driver, parsed.node, parsed.pool) == (
        "kit-gpu-node-gpu.nvidia.com-7xk2q", NVIDIA, "kit-gpu-node", "kit-gpu-node")
    (device,) = parsed.devices
    assert device.name == "gpu-0"
    assert device.attribute("gpu.nvidia.com/productName") == ("string", "NVIDIA H200")
    assert device.attribute("gpu.nvidia.com/cudaComputeCapability") == ("version", "9.0.0")
    assert device.attribute("gpu.nvidia.com/missing") is None
    assert device.capacity == (("gpu.nvidia.com/memory", "143771Mi"),)


def test_nvidias_device_class_and_its_driver() -> None:
    parsed = dra.device_class_from_api(load("deviceclass-gpu.nvidia.com.json"))
    assert parsed.name == NVIDIA and parsed.drivers == (NVIDIA,)
    assert parsed.selectors == ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == "
                                "'gpu'",)


def test_a_claim_keeps_its_requests_counts_and_allocation_only() -> None:
    parsed = dra.resource_claim_from_api(load("resourceclaim-allocated.json"))
    assert parsed == dra.ResourceClaim("ml-research", "shared-gpus", (
        ClaimRequest("gpu", (Alternative(NVIDIA, 2),)),
        ClaimRequest("small", (Alternative("mig.nvidia.com", 1), Alternative(NVIDIA, 1)))),
        allocated=True, devices=3, reserved_for=1)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"driver": "d", "nodeName": "n", "pool": {"name": "p"}, "devices": [{"name": "a"}]},
                     ("d", "n", "p", [("a", (), ())]), id="no-attributes"),
        pytest.param({"driver": "d", "pool": {"name": "p"}, "allNodes": True, "devices": [
            {"name": "b", "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:01:00.0"},
                                         "numa": {"int": 1}, "on": {"bool": True}}}]},
            ("d", "", "p", [("b", (("d/numa", "int", "1"), ("d/on", "bool", "true"),
                                   ("resource.kubernetes.io/pciBusID", "string", "0000:01:00.0")), ())]),
            id="qualified-and-typed-not-node-local"),
        pytest.param({"driver": "d", "nodeName": "n", "devices": [
            {"name": "c", "basic": {"attributes": {"model": {"string": "x"}}, "capacity": {"m": {"value": "1Gi"}}}}]},
            ("d", "n", "", [("c", (("d/model", "string", "x"),), (("d/m", "1Gi"),))]), id="v1beta1-basic"),
        pytest.param({"driver": 7, "nodeName": ["n"], "pool": "wrong", "devices": [
            {"name": "e", "attributes": {"bad": "not-a-map", "list": {"strings": ["a"]}, "int-as-text": {"int": "1"},
                                         "bool-as-int": {"bool": 1}, "int-as-bool": {"int": True}},
             "capacity": {"m": {"value": 5}, "n": "x"}},
            "not-a-device", {"name": 3}, {"attributes": {}}]},
            ("", "", "", [("e", (), ())]), id="wrong-types-skipped"),
        pytest.param({"devices": "wrong"}, ("", "", "", []), id="devices-not-a-list"),
        pytest.param("wrong", ("", "", "", []), id="spec-not-a-map"),
    ],
)
def test_slices_field_by_field(spec: Any, expected: tuple[str, str, str, list[Any]]) -> None:
    parsed = dra.slice_from_api({"metadata": {"name": "s"}, "spec": spec})
    assert (parsed.driver, parsed.node, parsed.pool,
            [(d.name, d.attributes, d.capacity) for d in parsed.devices]) == expected


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param({"metadata": {"namespace": "a", "name": "b"}, "spec": {"devices": {"requests": [
            {"name": "r", "exactly": {"deviceClassName": "c", "allocationMode": "All"}}]}}},
            ((("r", (("c", None),)),), False, 0, 0), id="all"),
        pytest.param({"metadata": {"namespace": "a", "name": "b"}, "spec": {"devices": {"requests": [
            {"name": "r", "deviceClassName": "c", "count": 3}]}}},
            ((("r", (("c", 3),)),), False, 0, 0), id="v1beta1-fields-on-the-request"),
        pytest.param({"metadata": {"namespace": "a", "name": "b"}, "spec": {"devices": {"requests": [
            {"name": "r", "exactly": {"deviceClassName": "c", "count": "2"}},
            {"name": "s", "exactly": {"deviceClassName": "c", "count": True}},
            {"name": "t", "exactly": {"deviceClassName": 5}}, {"name": 4}, "x",
            {"name": "u", "firstAvailable": "wrong", "exactly": {"deviceClassName": "c", "count": -1}}]}},
            "status": {"allocation": "wrong", "reservedFor": {"a": 1}}},
            ((("r", (("c", 0),)), ("s", (("c", 0),)), ("u", (("c", 0),))), False, 0, 0), id="wrong-types"),
        pytest.param({"metadata": "wrong", "spec": [], "status": {"allocation": {"devices": {"results": [
            {"device": "a"}, "x"]}}}}, ((), True, 1, 0), id="allocated-without-spec"),
    ],
)
def test_claims_field_by_field(obj: Any, expected: tuple[Any, bool, int, int]) -> None:
    parsed = dra.resource_claim_from_api(obj)
    requests = tuple((r.name, tuple((a.device_class, a.count) for a in r.alternatives)) for r in parsed.requests)
    assert (requests, parsed.allocated, parsed.devices, parsed.reserved_for) == expected


def test_device_classes_field_by_field() -> None:
    assert dra.device_class_from_api({"metadata": {"name": "x"}, "spec": {"selectors": "wrong"}}) == \
        dra.DeviceClass("x")
    assert dra.device_class_from_api({"metadata": {"name": "y"}, "spec": {"selectors": [
        {"cel": {"expression": 7}}, "s", {"cel": {"expression": 'device.driver == "a" || device.driver == "b"'}}]}}) \
        == dra.DeviceClass("y", ('device.driver == "a" || device.driver == "b"',), ("a", "b"))


# --------------------------------------------------------------------------------------------- the index


def cluster() -> DraIndex:
    index = DraIndex()
    index.replace("resourceslices", [dra.slice_from_api(gpu_slice(f"h100-{i}", H100, 8)) for i in range(3)]
                  + [dra.slice_from_api(gpu_slice("t4-0", T4, 4)),
                     dra.slice_from_api(gpu_slice("t4-1", T4, 2)),
                     dra.slice_from_api(gpu_slice("amd-0", "MI300X", 8, driver="gpu.amd.com"))])
    index.replace("deviceclasses", [dra.device_class_from_api(load("deviceclass-gpu.nvidia.com.json"))])
    index.replace("resourceclaims", [dra.resource_claim_from_api(load("resourceclaim-allocated.json"))])
    return index


T4_QUERY = DeviceQuery.of(["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
                           'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("t4")'])
A100_QUERY = DeviceQuery.of(['device.driver == "gpu.nvidia.com"',
                             'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")'])
ANY_NVIDIA = DeviceQuery.of(['device.driver == "gpu.nvidia.com"'])


@pytest.mark.parametrize(
    ("query", "count", "summary"),
    [
        pytest.param(T4_QUERY, 1, dra.DeviceSummary(6, 2, ("t4-0", "t4-1"), 4), id="t4-any"),
        pytest.param(T4_QUERY, 3, dra.DeviceSummary(6, 1, ("t4-0",), 4), id="t4-three-on-one-node"),
        pytest.param(T4_QUERY, 5, dra.DeviceSummary(6, 0, (), 4), id="t4-five-nowhere"),
        pytest.param(A100_QUERY, 1, dra.DeviceSummary(0, 0, (), 0), id="nothing-matches"),
        pytest.param(ANY_NVIDIA, 8, dra.DeviceSummary(30, 3, ("h100-0", "h100-1", "h100-2"), 8), id="driver-only"),
    ],
)
def test_nodes_with_n_matching_devices(query: DeviceQuery | None, count: int, summary: dra.DeviceSummary) -> None:
    assert query is not None
    index = cluster()
    first = index.view()
    assert first.nodes_with(query, count) == summary  # computed once, then tracked
    assert index.view() is not first, "the question is tracked from the next view"
    assert index.view().nodes_with(query, count) == summary


def test_tracked_answers_follow_slice_events() -> None:
    assert T4_QUERY is not None
    index = cluster()
    index.view().nodes_with(T4_QUERY)
    index.view().values(NVIDIA, "productName")
    before = index.view()
    index.put(dra.slice_from_api(gpu_slice("t4-2", T4, 8)))
    index.put(dra.slice_from_api(gpu_slice("h100-0", T4, 8)))  # the same slice name: replaced
    index.remove("resourceslices", ("", "t4-0-gpu.nvidia.com"))
    after = index.view()
    assert after.nodes_with(T4_QUERY, 8) == dra.DeviceSummary(18, 2, ("h100-0", "t4-2"), 8)
    assert after.values(NVIDIA, "productName") == (
        dra.ValueCount(T4, 3, 18), dra.ValueCount(H100, 2, 16))
    assert before.nodes_with(T4_QUERY, 1) == dra.DeviceSummary(6, 2, ("t4-0", "t4-1"), 4), "an old view stays"
    assert before.values(NVIDIA, "gpu.nvidia.com/productName") == (
        dra.ValueCount(H100, 3, 24), dra.ValueCount(T4, 2, 6))
    index.replace("resourceslices", [])
    assert index.view().nodes_with(T4_QUERY) == dra.DeviceSummary(0, 0, (), 0)
    assert index.view().values(NVIDIA, "productName") == ()


def test_claims_and_classes_by_name_and_the_counts() -> None:
    index = cluster()
    view = index.view()
    claim = view.claim("ml-research", "shared-gpus")
    assert claim is not None and claim.allocated and claim.requests[0].alternatives == (Alternative(NVIDIA, 2),)
    assert view.claim("ml-research", "other") is None
    assert view.device_classes() == (NVIDIA,)
    found = view.device_class(NVIDIA)
    assert found is not None and found.drivers == (NVIDIA,)
    assert view.counts == {"resourceslices": 6, "deviceclasses": 1, "resourceclaims": 1}
    index.remove("resourceclaims", ("ml-research", "shared-gpus"))
    index.remove("deviceclasses", ("", NVIDIA))
    index.remove("deviceclasses", ("", "never-there"))
    assert index.view().counts == {"resourceslices": 6, "deviceclasses": 0, "resourceclaims": 0}
    assert sorted(s.name for s in index.view().slices())[:2] == ["amd-0-gpu.amd.com", "h100-0-gpu.nvidia.com"]


def test_a_retyped_slice_is_indexed_without_its_wrong_fields() -> None:
    retyped = gpu_slice("t4-9", T4, 2)
    retyped["spec"]["devices"][0]["attributes"]["productName"] = {"string": ["Tesla T4"]}
    retyped["spec"]["devices"][1]["attributes"] = "wrong"
    index = DraIndex()
    index.put(dra.slice_from_api(retyped))
    assert ANY_NVIDIA is not None and T4_QUERY is not None
    assert index.view().nodes_with(ANY_NVIDIA) == dra.DeviceSummary(2, 1, ("t4-9",), 2)
    assert index.view().nodes_with(T4_QUERY) is None, "no productName on one device: the allocator fails on it"
