"""DRA CEL selectors evaluated as the scheduler's allocator evaluates them (webhook/policy/device_selectors.py), on
devices shaped like NVIDIA's DRA driver's (DRA-FACTS §3.3)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from webhook.policy import device_selectors as ds
from webhook.policy import dra_inventory as dra
from webhook.policy.device_selectors import Condition, DeviceQuery

NVIDIA = "gpu.nvidia.com"


def nvidia_device(name: str, product: str, architecture: str, capability: str, memory: str) -> ds.Device:
    return dra.slice_from_api({"metadata": {"name": "s"}, "spec": {"driver": NVIDIA, "nodeName": "n", "devices": [{
        "name": name,
        "attributes": {
            "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{name}"}, "productName": {"string": product},
            "brand": {"string": "Nvidia"}, "architecture": {"string": architecture},
            "cudaComputeCapability": {"version": capability}, "driverVersion": {"version": "580.159.4"},
            "cudaDriverVersion": {"version": "13.0.0"}, "resource.kubernetes.io/pciBusID": {"string": "0000:01:00.0"},
            "numa": {"int": 1}, "healthy": {"bool": True}},
        "capacity": {"memory": {"value": memory}}}]}}).devices[0]


H100 = nvidia_device("gpu-0", "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi")
T4 = nvidia_device("gpu-1", "Tesla T4", "Turing", "7.5.0", "15360Mi")
A = 'device.attributes["gpu.nvidia.com"]'
C = 'device.capacity["gpu.nvidia.com"]'

EXPRESSIONS = [
    # (id, expression, verdict on the H100, verdict on the T4)
    ("driver", 'device.driver == "gpu.nvidia.com"', True, True),
    ("other-driver", 'device.driver == "gpu.amd.com"', False, False),
    ("attribute", f'{A}.productName == "NVIDIA H100 80GB HBM3"', True, False),
    ("lower-contains", f'{A}.productName.lowerAscii().contains("t4")', False, True),
    ("upper", f'{A}.architecture.upperAscii() == "HOPPER"', True, False),
    ("matches", f"{A}.productName.lowerAscii().matches('^.*h100.*$')", True, False),
    ("starts-ends", f'{A}.productName.startsWith("NVIDIA") && {A}.uuid.endsWith("gpu-0")', True, False),
    ("split-trim", f'{A}.productName.split(" ")[1].trim() == "H100"', True, False),
    ("replace-indexOf", f'{A}.productName.replace("NVIDIA ", "").indexOf("80GB") == 5', True, False),
    ("substring", f'{A}.productName.substring(0, 5) == "Tesla"', False, True),
    ("int-and-bool", f'{A}.numa == 1 && {A}.healthy', True, True),
    ("qualified-domain", 'device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:")', True, True),
    ("quantity-compareTo", f'{C}.memory.compareTo(quantity("40Gi")) >= 0', True, False),
    ("quantity-greater", f'{C}.memory.isGreaterThan(quantity("16Gi"))', True, False),
    ("quantity-less", f'{C}.memory.isLessThan(quantity("15Gi"))', False, False),
    ("quantity-equal-another-spelling", f'{C}.memory == quantity("81920Mi")', True, False),
    ("quantity-arithmetic", f'{C}.memory.sub(quantity("79Gi")).asInteger() == 1073741824', True, False),
    ("quantity-sign-float", f'{C}.memory.sign() == 1 && {C}.memory.asApproximateFloat() > 5e10', True, False),
    ("quantity-isInteger-add", f'quantity("500m").add(quantity("500m")).isInteger() && {C}.memory.isInteger()',
     True, True),
    ("isQuantity", 'isQuantity("1Gi") && !isQuantity("1 Gi")', True, True),
    ("semver-compareTo", f'{A}.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0', True, False),
    ("semver-greater-less", f'{A}.driverVersion.isGreaterThan(semver("570.0.0")) && '
                            f'{A}.cudaComputeCapability.isLessThan(semver("10.0.0"))', True, True),
    ("semver-parts", f'{A}.cudaComputeCapability.major() == 9 && {A}.driverVersion.minor() == 159 && '
                     f'{A}.driverVersion.patch() == 4', True, False),
    ("semver-equal-ignores-build", f'{A}.cudaDriverVersion == semver("13.0.0+build.7")', True, True),
    ("semver-normalize", 'semver("v1.2", true) == semver("1.2.0") && isSemver("1.2.3") && !isSemver("1.2")',
     True, True),
    ("cel-bind", f'cel.bind(name, {A}.productName.lowerAscii(), name.contains("h100") || name.contains("a100"))',
     True, False),
    ("nested-cel-bind", f'cel.bind(a, {A}, cel.bind(b, a.architecture, b == "Turing"))', False, True),
    ("unknown-domain-in", '"foo" in device.attributes["x.com"]', False, False),
    ("known-attribute-in", f'"productName" in {A} && !("index" in {A})', True, True),
    ("has", f'has({A}.productName) && !has({A}.index)', True, True),
    ("exists-over-names", f'{A}.exists(k, k.startsWith("cuda"))', True, True),
    ("false-absorbs-an-error", f'{A}.index == 0 && device.driver == "x"', False, False),
    ("heterogeneous-equality", f'{A}.numa == "1"', False, False),
    # undecided: the allocator fails the claim's allocation on a runtime error
    ("unknown-domain-field", 'device.attributes["x.com"].foo == "a"', None, None),
    ("missing-attribute", f'{A}.index == 0', None, None),
    ("unknown-function", f'{A}.productName.frobnicate()', None, None),
    ("wrong-type", f'{A}.productName > 3', None, None),
    ("bad-quantity", 'quantity("lots") == quantity("1")', None, None),
    ("version-against-quantity", f'{A}.driverVersion.compareTo(quantity("1"))', None, None),
    ("not-a-bool", f'{A}.productName', None, None),
    ("allow-multiple-allocations-not-tracked", "device.allowMultipleAllocations", None, None),
]


@pytest.mark.parametrize(("expression", "on_h100", "on_t4"), [pytest.param(*row[1:], id=row[0]) for row in EXPRESSIONS])
def test_an_expression_on_nvidias_devices(expression: str, on_h100: bool | None, on_t4: bool | None) -> None:
    query, by_cel = DeviceQuery.of([expression]), ds.compiled(expression)
    assert query is not None, "a generated form (without CEL) or compiled"
    assert (query.verdict(NVIDIA, H100), query.verdict(NVIDIA, T4)) == (on_h100, on_t4)
    assert (by_cel.verdict(NVIDIA, H100), by_cel.verdict(NVIDIA, T4)) == (on_h100, on_t4)
    assert (by_cel.verdict(NVIDIA, H100), by_cel.verdict(NVIDIA, T4)) == (on_h100, on_t4), "the projection cache"


@pytest.mark.parametrize(
    ("expressions", "conditions"),
    [
        pytest.param(['device.driver == "gpu.nvidia.com"'], [Condition("", "==", NVIDIA)], id="driver"),
        pytest.param(["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"],
                     [Condition("", "==", NVIDIA), Condition("gpu.nvidia.com/type", "==", "gpu")],
                     id="nvidias-class"),
        pytest.param([f'{A}.productName.lowerAscii().contains("t4")'],
                     [Condition("gpu.nvidia.com/productName", "contains", "t4")], id="packaged-t4"),
        pytest.param([f'({A}.productName == "Tesla T4")', 'device.driver == "x"'],
                     [Condition("", "==", "x"), Condition("gpu.nvidia.com/productName", "==", "Tesla T4")],
                     id="parenthesised-and-two-selectors"),
        pytest.param([f'{A}.productName.matches("H1")'], [], id="other-function-by-cel"),
        pytest.param(['device.driver == "a" || device.driver == "b"'], [], id="or-by-cel"),
    ],
)
def test_the_generated_forms_skip_cel(expressions: list[str], conditions: list[Condition]) -> None:
    query = DeviceQuery.of(expressions)
    assert query is not None and list(query.conditions) == conditions


@pytest.mark.parametrize(
    ("expression", "on_h100", "on_t4"),
    [
        pytest.param(f'{A}.productName == "Tesla T4"', False, True, id="equal"),
        pytest.param(f'{A}.productName.lowerAscii().contains("h100")', True, False, id="contains"),
        pytest.param(f'{A}.index == "0"', None, None, id="missing-is-an-error"),
        pytest.param(f'{A}.numa == "1"', False, False, id="an-int-is-not-equal"),
        pytest.param(f'{A}.driverVersion == "580.159.4"', False, False, id="a-version-is-no-string"),
        pytest.param(f'device.driver == "x" && {A}.index == "0"', False, False, id="false-absorbs-an-error"),
    ],
)
def test_the_generated_forms_decide_as_cel(expression: str, on_h100: bool | None, on_t4: bool | None) -> None:
    fast = DeviceQuery.of([expression])
    assert fast is not None and fast.selectors[0].terms is not None
    by_cel = ds.compiled(expression)
    assert (fast.verdict(NVIDIA, H100), fast.verdict(NVIDIA, T4)) == (on_h100, on_t4)
    assert (by_cel.verdict(NVIDIA, H100), by_cel.verdict(NVIDIA, T4)) == (on_h100, on_t4)


def test_selectors_in_order_stop_at_the_first_false_one() -> None:
    query = DeviceQuery.of(['device.driver == "gpu.amd.com"', f"{A}.index == 0"])
    assert query is not None and query.verdict(NVIDIA, H100) is False, "the error is never reached"
    query = DeviceQuery.of([f"{A}.index == 0", 'device.driver == "gpu.amd.com"'])
    assert query is not None and query.verdict(NVIDIA, H100) is None


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("device.driver ==", id="syntax-error"),
        pytest.param('device.driver == "unterminated', id="unterminated-string"),
        pytest.param("cel.bind(x, 1)", id="bind-with-two-arguments"),
        pytest.param("true || " * 1500 + "true", id="longer-than-kubernetes-allows"),
    ],
)
def test_an_expression_that_does_not_compile_answers_nothing(expression: str, caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    with caplog.at_level(logging.WARNING, "webhook.policy.device_selectors"):
        assert DeviceQuery.of([expression]) is None
        assert DeviceQuery.of([expression]) is None
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) <= 1 and all("does not compile" in m and "fix the selector" in m for m in logged)
    assert ds.compiled(expression).program is None


def test_a_runtime_error_is_logged_once_with_the_expression(caplog: pytest.LogCaptureFixture) -> None:
    expression = f'{A}.neverPublished == "x" && device.driver != "y"'
    query = DeviceQuery.of([expression])
    assert query is not None
    with caplog.at_level(logging.WARNING, "webhook.policy.device_selectors"):
        assert query.count([(NVIDIA, H100), (NVIDIA, T4), (NVIDIA, H100)]) == (0, 3)
    (message,) = [r.getMessage() for r in caplog.records]
    assert expression in message and "gpu-0" in message and "no decision" in message


def test_an_expression_compiles_once(monkeypatch: pytest.MonkeyPatch) -> None:
    compiles: list[str] = []
    library = ds._compile_program

    def counting(expression: str) -> Any:
        compiles.append(expression)
        return library(expression)

    monkeypatch.setattr(ds, "_compile_program", counting)
    expression = f'{A}.cudaComputeCapability.isGreaterThan(semver("8.9.0")) && "once" != ""'
    for _ in range(3):
        query = DeviceQuery.of([expression])
        assert query is not None
        assert query.count([(NVIDIA, H100), (NVIDIA, T4)] * 50) == (50, 0)
    assert compiles == [expression]


def test_identical_devices_are_evaluated_once_per_projection(monkeypatch: pytest.MonkeyPatch) -> None:
    expression = f'{A}.productName.lowerAscii().matches("h1[0-9]0") && "x" != "y"'
    compiled = ds.compiled(expression)
    evaluations: list[str] = []
    activation = ds.activation

    def counting(driver: str, *args: Any) -> ds.CelMap:
        evaluations.append(driver)
        return activation(driver, *args)

    monkeypatch.setattr(ds, "activation", counting)
    others = [nvidia_device(f"gpu-{i}", "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi") for i in range(2, 10)]
    assert compiled.reach.names is not None and f"{NVIDIA}/uuid" not in compiled.reach.names
    assert sum(compiled.verdict(NVIDIA, d) is True for d in [H100, *others]) == 9
    assert len(evaluations) <= 1, "the UUIDs differ, the projection does not"


@pytest.mark.parametrize(
    ("expression", "by_name"),
    [
        pytest.param(f'{A}.productName == "x" && {C}.memory.isGreaterThan(quantity("1"))', True, id="by-name"),
        pytest.param(f'"productName" in {A}', False, id="a-whole-map-in"),
        pytest.param(f"{A}.exists(k, k == 'x')", False, id="iterated"),
        pytest.param('cel.bind(d, device, d.driver == "x")', False, id="device-bound"),
        pytest.param(f'{A}["productName"] == "x"', False, id="indexed"),
    ],
)
def test_what_an_expression_can_reach(expression: str, by_name: bool) -> None:
    found = ds.reach(ds.tokens(expression))
    assert found.domains == ({NVIDIA} if "attributes" in expression else set())
    assert (found.names is not None) == by_name
    if found.names is not None:
        assert {f"{NVIDIA}/productName", f"{NVIDIA}/memory"} <= found.names and f"{NVIDIA}/uuid" not in found.names


def test_bind_is_rewritten_to_a_comprehension() -> None:
    assert ds.rewrite_bind('cel.bind(x, "a,b", cel.bind(y, x.split(","), y[0] == "a"))') == \
        '["a,b"].map(x, [x.split(",")].map(y, y[0] == "a")[0])[0]'
    assert ds.rewrite_bind('"cel.bind(x, 1, x)" == device.driver') == '"cel.bind(x, 1, x)" == device.driver'


def test_nodes_with_is_undecided_while_a_selector_fails_on_a_device() -> None:
    def node_slice(node: str, version: Any) -> dict[str, Any]:
        return {"metadata": {"name": node}, "spec": {"driver": NVIDIA, "nodeName": node, "devices": [
            {"name": "gpu-0", "attributes": {"cudaComputeCapability": version}}]}}

    query = DeviceQuery.of([f'{A}.cudaComputeCapability.isGreaterThan(semver("8.0.0"))'])
    assert query is not None
    index = dra.DraIndex()
    index.replace("resourceslices", [dra.slice_from_api(node_slice("a", {"version": "9.0.0"})),
                                     dra.slice_from_api(node_slice("b", {"string": "9.0"}))])
    assert index.view().nodes_with(query) is None
    index.remove("resourceslices", ("", "b"))
    assert index.view().nodes_with(query) == dra.DeviceSummary(1, 1, ("a",), 1)
