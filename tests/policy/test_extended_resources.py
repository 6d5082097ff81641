"""GPUs through a DeviceClass's extended resource (KEP-5004, beta and on in Kubernetes 1.36): which names count
(webhook.policy.resources), how they are counted and what the rule files may say of them. The per-rule decisions
are rule cases (tests/rule-cases/dra/cases.yaml, tests/rule-cases/mig-profiles.yaml); the API server's own
acceptance is e2e (tests/e2e/test_23_dra_extended.py). What the Kubernetes source says, kept here as the test
of the facts the code relies on (skipped where the Go module cache is absent)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from support.rule_errors import assert_refused

from webhook.admission.loader import load_policy
from webhook.policy import checks
from webhook.policy.engine import Context, evaluate
from webhook.policy.resources import GPUResource, find, ordered
from webhook.policy.rules import parse_sources

REPO = Path(__file__).resolve().parents[2]
K8S = Path("/root/go/pkg/mod/k8s.io/kubernetes@v1.36.3")
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def _pod(resources: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **meta},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]}}


# --------------------------------------------------------------------------------------------- the Kubernetes facts

SOURCE_FACTS = [
    # The implicit name is in the kubernetes.io namespace: a *native* resource to API validation, so requests may
    # be set without limits and below them (overcommit allowed), and it need not be an integer.
    pytest.param("pkg/apis/core/v1/helper/helpers.go", ["func IsNativeResource(name v1.ResourceName) bool {",
                                                        "IsPrefixedNativeResource(name)"], id="native-by-prefix"),
    pytest.param("pkg/apis/core/helper/helpers.go", [
        "func IsOvercommitAllowed(name core.ResourceName) bool {\n\treturn IsNativeResource(name) &&",
        "return integerResources.Has(name) || IsExtendedResourceName(name)"], id="overcommit-and-integers"),
    pytest.param("pkg/apis/core/validation/validation.go", [
        "if quantity.Cmp(limitQuantity) != 0 && !helper.IsOvercommitAllowed(resourceName) {",
        '"Limit must be set for non overcommitable resources"'], id="requests-equal-limits-only-if-not-native"),
    # Limits default the requests on a Pod (not on a template).
    pytest.param("pkg/apis/core/v1/defaults.go", ["// If limits are specified, but requests are not, default requests "
                                                  "to limits"], id="requests-default-to-limits"),
    # kube-scheduler: the implicit name is a DRA extended resource; it allocates what each container requests.
    pytest.param("pkg/scheduler/util/utils.go",
                 ["strings.HasPrefix(string(name), resourceapi.ResourceDeviceClassPrefix)"],
                 id="scheduler-takes-the-prefix"),
    pytest.param("pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go", [
        "creqs := container.Resources.Requests", "crq, ok := (&rQuant).AsInt64()",
        "reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})"],
        id="scheduler-reads-requests"),
    # A DeviceClass may map only an extended resource name (never one in kubernetes.io).
    pytest.param("pkg/apis/resource/validation/validation.go", [
        "spec.ExtendedResourceName != nil && !v1helper.IsExtendedResourceName("], id="mapped-name-is-extended"),
]


@pytest.mark.parametrize(("path", "needles"), SOURCE_FACTS)
def test_what_the_kubernetes_source_says(path: str, needles: list[str]) -> None:
    source = K8S / path
    if not source.is_file():
        pytest.skip(f"{source} is not in the Go module cache")
    text = source.read_text()
    for needle in needles:
        assert needle in text, f"{path} no longer holds {needle!r}"


# --------------------------------------------------------------------------------------------- which names count

ORDERED = [
    pytest.param(["nvidia.com/mig-*", "nvidia.com/mig-1g.5gb"], "nvidia.com/mig-1g.5gb", "nvidia.com/mig-1g.5gb",
                 id="exact-before-glob-whatever-the-order"),
    pytest.param(["nvidia.com/*", "nvidia.com/mig-*"], "nvidia.com/mig-2g.10gb", "nvidia.com/mig-*",
                 id="the-more-specific-glob-first"),
    pytest.param(["nvidia.com/gpu", "amd.com/gpu"], "amd.com/gpu", "amd.com/gpu", id="exact-names-keep-file-order"),
]


@pytest.mark.parametrize(("patterns", "name", "winner"), ORDERED)
def test_gpu_resources_precedence(patterns: list[str], name: str, winner: str) -> None:
    resources = ordered(GPUResource(p) for p in patterns)
    found = find(resources, load_policy(REPO / "rules").dra, name)
    assert found is not None and found.pattern == winner


def test_packaged_rules_serve_the_implicit_names_of_their_gpu_classes() -> None:
    policy = load_policy(REPO / "rules")
    gpu = policy.gpu_resource(IMPLICIT)
    assert gpu is not None and gpu.device_class == "gpu.nvidia.com" and gpu.implicit and gpu.classes
    mig = policy.gpu_resource("deviceclass.resource.kubernetes.io/mig.nvidia.com")
    assert mig is not None and mig.valid_for == {"gpu-type": frozenset({"a100"})}
    amd = policy.gpu_resource("deviceclass.resource.kubernetes.io/gpu.amd.com")
    assert amd is not None and not amd.classes
    assert policy.gpu_resource("deviceclass.resource.kubernetes.io/sriov.example.com") is None
    assert policy.gpu_resource("nvidia.com/gpu") is not None and not checks.is_dra_served(policy, "nvidia.com/gpu")


COUNTED = [
    pytest.param({"limits": {IMPLICIT: "2"}}, {IMPLICIT: 2}, [], id="limits"),
    pytest.param({"requests": {IMPLICIT: "3"}}, {IMPLICIT: 3}, ["gpu-limits-required"],
                 id="requests-only-counts-what-the-scheduler-allocates"),
    pytest.param({"requests": {IMPLICIT: "1"}, "limits": {IMPLICIT: "4"}}, {IMPLICIT: 1},
                 ["gpu-requests-equal-limits"], id="the-request-not-the-limit"),
    pytest.param({"requests": {"nvidia.com/gpu": "1"}}, {}, ["gpu-limits-required"],
                 id="an-extended-resource-without-limits-is-the-api-servers-to-refuse-uncounted"),
]


@pytest.mark.parametrize(("resources", "counted", "rules"), COUNTED)
def test_how_the_implicit_name_is_counted(resources: dict[str, Any], counted: dict[str, int],
                                          rules: list[str]) -> None:
    policy = load_policy(REPO / "rules")
    verdict = evaluate(policy, _pod(resources), Context("default"))
    assert [v.rule for v in verdict.violations] == rules
    assert verdict.gpus == sum(counted.values())
    # doctor's node view leaves DRA-served names out: no Node advertises them
    assert checks.gpu_requests(policy, _pod(resources)["spec"]) == {}


def test_messages_say_what_the_api_server_would_have_let_through() -> None:
    verdict = evaluate(load_policy(REPO / "rules"), _pod({"requests": {IMPLICIT: "1"}, "limits": {IMPLICIT: "4"}}),
                       Context("default"))
    (finding,) = verdict.violations
    assert finding.message == (
        f'spec.containers[0] (c): resources.requests[{IMPLICIT}] "1" differs from its limit "4"; kube-scheduler hands '
        "out as many gpu.nvidia.com devices as the request says, whatever the limit: set requests equal to limits, "
        "or remove the request (it defaults to the limit)")


# --------------------------------------------------------------------------------------------- rule files

BASE = textwrap.dedent("""\
    apiVersion: gpu-webhook.io/v1alpha1
    kind: GPUPolicy
    metadata: {name: base}
    spec:
      gpuResources: {nvidia.com/gpu: {}}
      gpuDeviceClasses: [gpu.nvidia.com]
    """)

RULE_ERRORS = [
    pytest.param(BASE + "  dra: {deviceClasses: {x.example.com: {extendedResourceName: example.kubernetes.io/gpu}}}\n",
                 ["line 7", "spec.dra.deviceClasses.x.example.com.extendedResourceName",
                  '"example.kubernetes.io/gpu" is in the kubernetes.io namespace',
                  "deviceclass.resource.kubernetes.io/x.example.com"], id="mapped-name-in-kubernetes-io"),
    pytest.param(BASE + "  dra:\n    deviceClasses:\n      a.example.com: {extendedResourceName: example.com/gpu}\n"
                 "      b.example.com: {extendedResourceName: example.com/gpu}\n",
                 ["spec.dra.deviceClasses.b.example.com.extendedResourceName",
                  '"example.com/gpu" is already mapped by DeviceClass a.example.com'], id="mapped-twice"),
    pytest.param(BASE.replace("{nvidia.com/gpu: {}}",
                              "{nvidia.com/gpu: {}, deviceclass.resource.kubernetes.io/nic.example.com: {}}"),
                 ["spec.gpuResources.deviceclass.resource.kubernetes.io/nic.example.com",
                  '"nic.example.com" is not a GPU DeviceClass of the rules (gpuDeviceClasses or dra.deviceClasses: '
                  "gpu.nvidia.com)"], id="implicit-name-of-no-gpu-class"),
    pytest.param(BASE + "  dra: {deviceClasses: {x.example.com: {extendedResourceName: gpu}}}\n",
                 ["spec.dra.deviceClasses.x.example.com.extendedResourceName", "is not a valid name here"],
                 id="mapped-name-not-qualified"),
]


@pytest.mark.parametrize(("text", "parts"), RULE_ERRORS)
def test_rule_file_errors(text: str, parts: list[str]) -> None:
    assert_refused(text, parts)


def test_a_mapped_name_takes_its_gpu_resources_entry() -> None:
    text = BASE.replace("{nvidia.com/gpu: {}}", "{nvidia.com/gpu: {}, example.com/gpu: {maxPerContainer: 2}}")
    text += "  dra: {deviceClasses: {x.example.com: {extendedResourceName: example.com/gpu, maxDevices: 4}}}\n"
    policy = parse_sources([("gpu-policy.yaml", text)])
    mapped = policy.gpu_resource("example.com/gpu")
    assert mapped is not None and mapped.device_class == "x.example.com" and mapped.max_per_container == 2
    # ... and the implicit name of the same class the same entry (the same devices)
    implicit = policy.gpu_resource("deviceclass.resource.kubernetes.io/x.example.com")
    assert implicit is not None and implicit.max_per_container == 2 and implicit.implicit
