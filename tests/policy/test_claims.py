"""DRA claims and templates (webhook.policy.claims): parsing of every request form, rule-file errors for the DRA
fields, type safety on any JSON in any field, and the placement patch (applied with jsonpatch, idempotent, never
over what the author wrote). The rule cases in tests/rule-cases/dra hold the per-rule decisions."""

from __future__ import annotations

import copy
import json
import textwrap
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.rule_errors import assert_refused

from webhook.admission.loader import load_policy
from webhook.policy import claims
from webhook.policy.engine import Context, evaluate
from webhook.policy.patch import operations
from webhook.policy.rules import parse_sources

REPO = Path(__file__).resolve().parents[2]
DRA_RULES = REPO / "tests" / "rule-cases" / "dra" / "rules"
H100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _policy() -> Any:
    return load_policy(DRA_RULES)


def template(*requests: dict[str, Any], version: str = "v1", labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "t"}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaimTemplate", "metadata": meta,
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


PARSED = [
    pytest.param({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}},
                 [("gpu.nvidia.com", 3, False, False)], 3, id="v1-exactly"),
    pytest.param({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                 [("gpu.nvidia.com", 1, False, False)], 1, id="count-defaults-to-1"),
    pytest.param({"name": "g", "deviceClassName": "gpu.nvidia.com", "count": 2, "adminAccess": True},
                 [("gpu.nvidia.com", 2, False, True)], 2, id="v1beta1-fields-on-the-request"),
    pytest.param({"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com", "count": 4},
                                                  {"name": "b", "deviceClassName": "mig.nvidia.com", "count": 2}]},
                 [("gpu.nvidia.com", 4, False, False), ("mig.nvidia.com", 2, False, False)], 4,
                 id="firstAvailable-counts-its-largest-alternative"),
    pytest.param({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
                 [("gpu.nvidia.com", None, True, False)], 0, id="all-has-no-count"),
    pytest.param({"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": True}},
                 [("gpu.nvidia.com", None, False, False)], 0, id="a-boolean-is-no-count"),
    pytest.param({"name": "g", "exactly": {"deviceClassName": "sriov.example.com", "count": 9}},
                 [("sriov.example.com", 9, False, False)], 0, id="not-a-gpu-class-counts-nothing"),
    pytest.param({"name": "g", "exactly": {"deviceClassName": 5}}, [], 0, id="class-of-the-wrong-type-ignored"),
    pytest.param("not a request", [], 0, id="request-of-the-wrong-type-ignored"),
]


@pytest.mark.parametrize(("request_", "asks", "gpus"), PARSED)
def test_parse(request_: Any, asks: list[tuple[str, int | None, bool, bool]], gpus: int) -> None:
    claim = claims.parse(template(request_))
    got = [(a.device_class, a.count, a.all_devices, a.admin_access) for r in claim.requests for a in r.asks]
    assert got == asks
    assert claim.gpu_devices(_policy()) == gpus


def test_paths_name_each_subrequest() -> None:
    claim = claims.parse(template({"name": "g", "firstAvailable": [{"name": "a", "deviceClassName": "x"},
                                                                   {"deviceClassName": "y"}]}))
    assert [a.where() for a in claim.requests[0].asks] == [
        'request "g", subrequest "a" (spec.spec.devices.requests[0].firstAvailable[0])',
        'request "g", subrequest "1" (spec.spec.devices.requests[0].firstAvailable[1])',
    ]


def test_what_the_author_wrote_is_escaped_in_messages() -> None:
    assert claims.shown('a"\n<b>') == '"a\\"\\n<b>"'
    assert claims.shown("x" * 200).endswith('..."') and len(claims.shown("x" * 200)) < 90


def test_a_hostile_name_is_escaped_in_the_denial() -> None:
    obj = template({"name": "g\u001b[31m\n", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 99}})
    verdict = evaluate(_policy(), obj, Context("default"))
    assert verdict.rules == ("dra-claim-max",)
    assert "\n" not in verdict.message() and "\u001b" not in verdict.message()
    assert 'request "g\\u001b[31m\\n"' in verdict.message()


# --------------------------------------------------------------------------------------------- rule files

BASE = textwrap.dedent("""\
    apiVersion: gpu-webhook.io/v1alpha1
    kind: GPUPolicy
    metadata: {name: base}
    spec:
      gpuResources: {nvidia.com/gpu: {}}
      classes:
        axes:
          gpu-type:
            label: gpu-webhook.io/gpu-type
            values:
              t4: {nodeSelector: {gpu-type: t4}, deviceSelectors: {gpu.nvidia.com: "true"}}
      gpuDeviceClasses: [gpu.nvidia.com]
    """)

RULE_ERRORS = [
    pytest.param(BASE.replace('deviceSelectors: {gpu.nvidia.com: "true"}', 'deviceSelectors: {gpu.amd.com: "true"}'),
                 ["gpu-policy.yaml: document 1", 'GPUPolicy "base"', "line 11",
                  "spec.classes.axes.gpu-type.values.t4.deviceSelectors.gpu.amd.com",
                  '"gpu.amd.com" is not a GPU DeviceClass of the rules'], id="selector-of-an-unknown-class"),
    pytest.param(BASE + "  dra: {deviceClasses: {mig.nvidia.com: {maxDevices: 0}}}\n",
                 ["line 13", "spec.dra.deviceClasses.mig.nvidia.com.maxDevices", "must be at least 1, got 0"],
                 id="max-below-1"),
    pytest.param(BASE + "  dra: {deviceClasses: {mig.nvidia.com: {maxDevice: 2}}}\n",
                 ["line 13", 'unknown field "maxDevice" (did you mean "maxDevices"?)'], id="misspelt-field"),
    pytest.param(BASE + "  namespaces: {team: {dra: {deviceClasses: [mig.nvidia.com]}}}\n",
                 ["line 13", "spec.namespaces.team.dra.deviceClasses.0",
                  '"mig.nvidia.com" is not a GPU DeviceClass of the rules (gpuDeviceClasses or dra.deviceClasses: '
                  "gpu.nvidia.com); add it there"], id="namespace-names-an-unknown-class"),
    pytest.param(BASE + "  dra: {adminAccessNamespaces: monitoring}\n",
                 ["spec.dra.adminAccessNamespaces", "expected array, got a string"], id="string-instead-of-list"),
]


@pytest.mark.parametrize(("text", "parts"), RULE_ERRORS)
def test_rule_file_errors_name_file_document_and_field(text: str, parts: list[str]) -> None:
    assert_refused(text, parts)


def test_gpu_device_classes_and_dra_device_classes_merge() -> None:
    policy = parse_sources([("gpu-policy.yaml", BASE + "  dra: {deviceClasses: {mig.nvidia.com: {maxDevices: 7}}}\n")])
    assert policy.gpu_device_classes == {"gpu.nvidia.com", "mig.nvidia.com"}
    assert policy.dra.device_classes["mig.nvidia.com"].max_devices == 7


def test_packaged_rules_name_nvidia_and_amd_classes() -> None:
    policy = load_policy(None)
    assert {"gpu.nvidia.com", "mig.nvidia.com", "gpu.amd.com"} <= policy.gpu_device_classes
    assert not policy.dra.is_classed("gpu.amd.com") and policy.dra.is_classed("gpu.nvidia.com")


# --------------------------------------------------------------------------------------------- properties

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
FIELDS = ["name", "deviceClassName", "count", "allocationMode", "adminAccess", "selectors", "exactly",
          "firstAvailable", "tolerations"]


@st.composite
def garbled_claims(draw: st.DrawFn) -> dict[str, Any]:
    """Claims and templates whose fields hold any JSON, around mostly well-formed GPU requests."""
    def ask() -> dict[str, Any]:
        found: dict[str, Any] = {"deviceClassName": draw(st.sampled_from(["gpu.nvidia.com", "mig.nvidia.com",
                                                                          "gpu.amd.com", "other"]))}
        for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
            found[name] = draw(JSON)
        return found
    requests: list[Any] = []
    for index in range(draw(st.integers(0, 3))):
        form = draw(st.sampled_from(["exactly", "firstAvailable", "v1beta1", "garbage"]))
        if form == "exactly":
            requests.append({"name": f"r{index}", "exactly": ask()})
        elif form == "firstAvailable":
            requests.append({"name": f"r{index}", "firstAvailable": [{"name": f"s{i}", **ask()}
                                                                     for i in range(draw(st.integers(1, 3)))]})
        elif form == "v1beta1":
            requests.append({"name": f"r{index}", **ask()})
        else:
            requests.append(draw(JSON))
    kind = draw(st.sampled_from(claims.CLAIM_KINDS))
    devices: Any = {"requests": requests} if draw(st.booleans()) else draw(JSON)
    spec: Any = {"devices": devices}
    labels = draw(st.sampled_from([None, {"gpu-webhook.io/gpu-type": "h100"}, {"gpu-webhook.io/gpu-type": 3}]))
    meta: dict[str, Any] = {"name": draw(st.sampled_from(["c", 7, None]))}
    if labels is not None:
        meta["labels"] = labels
    if kind == "ResourceClaimTemplate":
        spec = {"spec": spec, "metadata": draw(st.sampled_from([{}, {"labels": labels}, "x"]))}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": spec}


@SETTINGS
@given(obj=garbled_claims(), namespace=st.sampled_from(["default", "team-mig", "benchmarks", "gpu-monitoring"]),
       mode=st.sampled_from(["mutate", "validate"]))
def test_any_json_never_crashes_and_the_patch_applies_once(obj: dict[str, Any], namespace: str, mode: str) -> None:
    before = copy.deepcopy(obj)
    verdict = evaluate(_policy(), obj, Context(namespace, "CREATE", mode))  # type: ignore[arg-type]
    assert obj == before  # the engine never changes its input
    json.dumps(verdict.message())
    ops = operations(obj, list(verdict.edits))
    if not ops:
        return
    assert mode == "mutate" and verdict.allowed
    patched = jsonpatch.apply_patch(obj, ops)
    again = evaluate(_policy(), patched, Context(namespace, "CREATE", mode))  # type: ignore[arg-type]
    assert again.edits == ()  # idempotent: the selector added is the request's own now
    assert again.allowed
    for request, old in zip(claims.parse(patched).requests, claims.parse(obj).requests, strict=True):
        for ask, was in zip(request.asks, old.asks, strict=True):
            if was.has_selectors:
                assert ask.selectors == was.selectors  # never over what the author wrote


def test_the_selector_goes_on_each_gpu_request_without_one() -> None:
    obj = template({"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": []}},
                   {"name": "b", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                             "selectors": [{"cel": {"expression": "true"}}]}},
                   {"name": "c", "exactly": {"deviceClassName": "sriov.example.com"}},
                   labels={"gpu-webhook.io/gpu-type": "h100"})
    verdict = evaluate(_policy(), obj, Context("default"))
    patched = jsonpatch.apply_patch(obj, operations(obj, list(verdict.edits)))
    requests = patched["spec"]["spec"]["devices"]["requests"]
    assert requests[0]["exactly"]["selectors"] == [{"cel": {"expression": H100}}]
    assert requests[1]["exactly"]["selectors"] == [{"cel": {"expression": "true"}}]
    assert "selectors" not in requests[2]["exactly"]


def test_update_with_the_same_spec_is_not_judged() -> None:
    obj = template({"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 99}})
    verdict = evaluate(_policy(), obj, Context("default", "UPDATE", old_object=obj))
    assert verdict.allowed and verdict.edits == () and verdict.notes
    changed = evaluate(_policy(), obj, Context("default", "UPDATE", old_object=template()))
    assert changed.rules == ("dra-claim-max",) and changed.edits == ()
