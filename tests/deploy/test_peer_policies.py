"""The peers' GPU policies in bench/peers/policies (Kyverno, Gatekeeper) parse, have the expected kinds, and say
the same class map as the packaged rules (rules/gpu-policy.yaml): the same class values, defaults, exempt
namespaces and injected fields. The peers themselves are never built or run here (bench/peers/run.py does that);
this keeps the comparison honest when the rules change. The harness's parsing (the API server's histogram, the
outcome cells) is checked on fixed inputs.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "bench" / "peers" / "policies"
RULES = yaml.safe_load((REPO / "rules" / "gpu-policy.yaml").read_text())["spec"]
AXES = RULES["classes"]["axes"]
COMMON = RULES["classes"]["common"]

Json = dict[str, Any]


def _docs(*parts: str) -> list[Json]:
    return [d for d in yaml.safe_load_all(POLICIES.joinpath(*parts).read_text()) if d]


def _kinds(docs: list[Json]) -> Counter[str]:
    return Counter(d["kind"] for d in docs)


KYVERNO = _docs("kyverno", "gpu-policy.yaml")
GK_TEMPLATE = _docs("gatekeeper", "01-template.yaml")
GK_CONSTRAINT = _docs("gatekeeper", "02-constraint.yaml")
GK_MUTATORS = _docs("gatekeeper", "03-mutators.yaml")


@pytest.mark.parametrize(("docs", "expected"), [
    pytest.param(KYVERNO, {"ClusterPolicy": 2}, id="kyverno"),
    pytest.param(GK_TEMPLATE, {"ConstraintTemplate": 1}, id="gatekeeper-template"),
    pytest.param(GK_CONSTRAINT, {"K8sGpuPolicy": 1, "ExpansionTemplate": 2}, id="gatekeeper-constraint"),
    pytest.param(GK_MUTATORS, {"AssignMetadata": 4, "Assign": 6}, id="gatekeeper-mutators"),
])
def test_kinds(docs: list[Json], expected: dict[str, int]) -> None:
    assert _kinds(docs) == Counter(expected)
    assert all(d["metadata"]["name"] for d in docs)


def _class_values() -> dict[str, list[str]]:
    """{pod label: the values the rules define}."""
    return {axis["label"]: sorted(axis["values"]) for axis in AXES.values()}


def test_kyverno_validation_enforces_and_knows_the_classes() -> None:
    validate = next(d for d in KYVERNO if d["metadata"]["name"] == "gpu-limits")
    rules = {r["name"]: r for r in validate["spec"]["rules"]}
    assert set(rules) == {"gpu-limits-required", "gpu-requests-equal-limits", "gpu-whole-number", "gpu-class-known"}
    assert {r["validate"]["failureAction"] for r in rules.values()} == {"Enforce"}
    pattern = rules["gpu-class-known"]["validate"]["pattern"]["metadata"]["=(labels)"]
    assert {k[2:-1]: sorted(v.split(" | ")) for k, v in pattern.items()} == _class_values()
    for rule in rules.values():
        assert rule["exclude"]["any"][0]["resources"]["namespaces"] == RULES["exemptNamespaces"]


def test_kyverno_mutation_is_pods_only_and_add_if_absent() -> None:
    mutate = next(d for d in KYVERNO if d["metadata"]["name"] == "gpu-class-injection")
    assert mutate["metadata"]["annotations"]["pod-policies.kyverno.io/autogen-controllers"] == "none"
    rules = {r["name"]: r for r in mutate["spec"]["rules"]}
    placement = rules["gpu-class-placement"]["mutate"]["patchStrategicMerge"]["spec"]
    assert placement["+(runtimeClassName)"] == COMMON["runtimeClassName"]
    assert set(placement["nodeSelector"]) == {f"+({key})" for axis in AXES.values() for value in axis["values"].values()
                                              for key in value["nodeSelector"]}
    context = {c["name"]: c["variable"]["jmesPath"] for c in rules["gpu-class-placement"]["context"]}
    assert f"'{AXES['workload']['default']}'" in context["workload"]
    assert f"'{AXES['gpu-type']['default']}'" in context["gputype"]
    for rule in rules.values():
        assert rule["match"]["any"][0]["resources"]["kinds"] == ["Pod"]
        assert rule["match"]["any"][0]["resources"]["operations"] == ["CREATE"]
        assert rule["exclude"]["any"][0]["resources"]["namespaces"] == RULES["exemptNamespaces"]
    toleration = yaml.safe_load(rules["gpu-toleration-append"]["mutate"]["patchesJson6902"])[0]["value"]
    assert [toleration] == COMMON["tolerations"]


def test_gatekeeper_template_and_constraint_agree() -> None:
    (template,) = GK_TEMPLATE
    kind = template["spec"]["crd"]["spec"]["names"]["kind"]
    (code,) = template["spec"]["targets"][0]["code"]
    assert code["engine"] == "Rego"
    assert code["source"]["rego"].startswith(f"package {template['metadata']['name']}\n")
    assert code["source"]["rego"].count("violation contains") == 5
    constraint = next(d for d in GK_CONSTRAINT if d["kind"] == kind)
    assert constraint["spec"]["enforcementAction"] == "deny"
    params = constraint["spec"]["parameters"]
    assert {k: sorted(v) for k, v in params["classes"].items()} == _class_values()
    assert set(RULES["exemptNamespaces"]) <= set(constraint["spec"]["match"]["excludedNamespaces"])
    properties = template["spec"]["crd"]["spec"]["validation"]["openAPIV3Schema"]["properties"]
    assert set(params) == set(properties)


def test_gatekeeper_mutators_reproduce_the_class_map() -> None:
    label = {name: axis["label"] for name, axis in AXES.items()}
    # Every class value's nodeSelector key, set only where absent, for Pods labelled with that value.
    selectors = {}
    for doc in GK_MUTATORS:
        if doc["kind"] == "Assign" and doc["spec"]["location"].startswith("spec.nodeSelector."):
            (expr,) = doc["spec"]["match"]["labelSelector"]["matchExpressions"]
            selectors[(expr["key"], expr["values"][0])] = (doc["spec"]["location"].rsplit(".", 1)[1],
                                                           doc["spec"]["parameters"]["assign"]["value"])
            assert doc["spec"]["parameters"]["pathTests"] == [{"subPath": doc["spec"]["location"],
                                                               "condition": "MustNotExist"}]
    assert selectors == {(label[name], value): next(iter(spec["nodeSelector"].items()))
                         for name, axis in AXES.items() for value, spec in axis["values"].items()}
    # The default one class value sets for the other axis (its `defaults`, else the cluster default), as labels
    # filled in by AssignMetadata.
    defaults = {}
    for doc in GK_MUTATORS:
        if doc["kind"] == "AssignMetadata":
            have, missing = doc["spec"]["match"]["labelSelector"]["matchExpressions"]
            assert missing["operator"] == "DoesNotExist"
            defaults[(have["key"], have["values"][0])] = (missing["key"], doc["spec"]["parameters"]["assign"]["value"])
    want = {(label[name], value): (label[other], spec.get("defaults", {}).get(other, AXES[other]["default"]))
            for name, axis in AXES.items() for value, spec in axis["values"].items() for other in AXES if other != name}
    assert defaults == want
    common = {d["spec"]["location"]: d["spec"]["parameters"]["assign"]["value"] for d in GK_MUTATORS
              if d["kind"] == "Assign" and not d["spec"]["location"].startswith("spec.nodeSelector.")}
    assert common == {"spec.runtimeClassName": COMMON["runtimeClassName"],
                      'spec.tolerations[key: "nvidia.com/gpu"]': COMMON["tolerations"][0]}


# ----------------------------------------------------------------------------------------- the harness's parsing

@functools.cache
def _harness() -> Any:
    """bench/peers/run.py as a module (it imports tests/e2e/cluster.py; nothing is started)."""
    spec = importlib.util.spec_from_file_location("bench_peers_run", REPO / "bench" / "peers" / "run.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
_GPU_CREATE = 'name="mutate.gpu-webhook.io",operation="CREATE",rejected="false",type="admit"'
_GPU_UPDATE = 'name="mutate.gpu-webhook.io",operation="UPDATE",rejected="true",type="admit"'
_GK = 'name="validation.gatekeeper.sh",operation="CREATE",rejected="false",type="validating"'
METRICS = "\n".join([
    f"# TYPE {_METRIC} histogram",
    f'{_METRIC}_bucket{{{_GPU_CREATE},le="0.005"}} 3',
    f'{_METRIC}_bucket{{{_GPU_CREATE},le="+Inf"}} 4',
    f"{_METRIC}_sum{{{_GPU_CREATE}}} 0.012",
    f"{_METRIC}_count{{{_GPU_CREATE}}} 4",
    f"{_METRIC}_sum{{{_GPU_UPDATE}}} 0.003",
    f"{_METRIC}_count{{{_GPU_UPDATE}}} 1",
    f"{_METRIC}_sum{{{_GK}}} 0.5",
    f"{_METRIC}_count{{{_GK}}} 10",
])


def test_harness_sums_the_api_servers_histogram_per_webhook() -> None:
    parsed = _harness().histogram(METRICS, _METRIC)
    assert {name: (round(total, 6), count) for name, (total, count, _) in parsed.items()} == {
        "mutate.gpu-webhook.io": (0.015, 5.0), "validation.gatekeeper.sh": (0.5, 10.0)}
    assert parsed["mutate.gpu-webhook.io"][2] == {0.005: 3.0, float("inf"): 4.0}


@pytest.mark.parametrize(("obj", "cell"), [
    pytest.param({"kind": "Pod", "spec": {"nodeSelector": {"workload": "training", "gpu-type": "a100"},
                                          "tolerations": [{"key": "nvidia.com/gpu"}, {"key": "other"}],
                                          "runtimeClassName": "nvidia"}},
                 "sel gpu-type=a100,workload=training; tol×1; rc nvidia", id="pod"),  # noqa: RUF001
    pytest.param({"kind": "Deployment", "spec": {"template": {"spec": {"runtimeClassName": "nvidia"}}}},
                 "rc nvidia", id="template"),
    pytest.param({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {}}}}}}, "-",
                 id="cronjob-nothing-placed"),
    pytest.param({"kind": "ConfigMap", "data": {}}, "(no pod spec)", id="no-pod-spec"),
])
def test_harness_placement_cells(obj: Json, cell: str) -> None:
    assert _harness().placement(obj) == cell


@pytest.mark.parametrize(("stderr", "cell"), [
    pytest.param('Error from server (Forbidden): error when creating "STDIN": admission webhook '
                 '"validation.gatekeeper.sh" denied the request: [gpu-policy] ...',
                 "denied by validation.gatekeeper.sh", id="webhook"),
    pytest.param('The Pod "x" is invalid: spec.containers[0].resources.limits: Required value',
                 "invalid (API server)", id="api-server"),
    pytest.param('error: resource mapping not found for name: "x": no matches for kind "RayJob" in version "ray.io/v1"'
                 "\nensure CRDs are installed first", "no such kind (CRD not installed)", id="no-crd"),
])
def test_harness_denial_cells(stderr: str, cell: str) -> None:
    assert _harness().denial(stderr, "any") == cell
