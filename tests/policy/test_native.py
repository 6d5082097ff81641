"""The native-mode compiler (webhook.policy.native): the params it renders agree with the engine, and the
policies do not depend on the rules. The CEL itself is proven on the real API server (tests/e2e/test_15_native.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from webhook.admission.loader import load_policy
from webhook.policy import cel_bind, engine, native, native_cel
from webhook.policy.rules import RULES, parse_sources

REPO = Path(__file__).resolve().parents[2]
PACKAGED = load_policy(REPO / "rules")


def _params() -> dict:
    return native.params(PACKAGED)


@pytest.mark.parametrize(("key", "cls", "selector"), [
    ("*#=*/*#=*/*", "workload=inference,gpu-type=t4", {"workload": "inference", "gpu-type": "t4"}),
    ("*#training=*/*#=*/*", "workload=training,gpu-type=a100", {"workload": "training", "gpu-type": "a100"}),
    ("*#=*/*#=a100/*", "workload=training,gpu-type=a100", {"workload": "training"}),  # own selection: not added
    ("*#=*/*#a100=*/*", "workload=training,gpu-type=a100", {"workload": "training", "gpu-type": "a100"}),
], ids=["default", "workload-label", "own-selection-a100", "gpu-type-label"])
def test_the_table_holds_what_the_engine_injects(key: str, cls: str, selector: dict) -> None:
    p = _params()
    plan = p["plans"][p["table"][key]]
    assert plan["className"] == cls
    assert plan["nodeSelector"] == selector
    assert plan["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert plan["runtimeClassName"] == "nvidia"
    assert plan["findings"] == []


def test_a_label_against_the_pods_own_selection_is_a_conflict_with_placeholders() -> None:
    p = _params()
    plan = p["plans"][p["table"]["*#=*/*#t4=a100/*"]]
    assert [f["rule"] for f in plan["findings"]] == ["gpu-class-conflict"]
    message = plan["findings"][0]["message"]
    assert message.startswith('{meta}.labels[gpu-webhook.io/gpu-type] is "t4" but the Pod\'s own selection {selection}')
    assert plan["findings"][0]["axis"] == "gpu-type"


def test_a_validfor_resource_narrows_the_class_and_its_messages_name_the_pods_own_container() -> None:
    p = _params()
    families = {e["regex"]: e for e in p["validFor"]}
    assert families[r"^nvidia\.com/mig\-1g\.5gb$"] == {"regex": r"^nvidia\.com/mig\-1g\.5gb$",
                                                      "values": {"gpu-type": ["a100"]}, "shadowed": []}
    # The packaged rules' other MIG profiles exist on no gpu-type value; the exact names listed take precedence.
    catch_all = families[r"^nvidia\.com/mig\-.*$"]
    assert catch_all["values"] == {"gpu-type": []}
    assert "nvidia.com/mig-1g.5gb" in catch_all["shadowed"] and len(catch_all["shadowed"]) == 11
    assert p["plans"][p["table"]["*#=*/*#=*/a100"]]["className"] == "workload=training,gpu-type=a100"
    (finding,) = p["plans"][p["table"]["*#=*/*#t4=*/a100"]]["findings"]
    assert finding["rule"] == "gpu-class-conflict"
    assert finding["message"].startswith('{meta}.labels[gpu-webhook.io/gpu-type] is "t4" but {limitWhere} asks '
                                         "for {limitResource}, which exists only on gpu-type a100")


def test_namespace_policy_reaches_the_table() -> None:
    policy = parse_sources([("a.yaml", (REPO / "rules" / "gpu-policy.yaml").read_text()), ("b.yaml", """
apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata: {name: ns}
spec:
  namespaces:
    research: {defaults: {workload: training}, allowed: {gpu-type: [a100]}}
""")])
    p = native.params(policy)
    assert p["namespaces"] == {"research": "ns:research"}
    assert p["plans"][p["table"]["ns:research#=*/*#=*/*"]]["className"] == "workload=training,gpu-type=a100"
    refused = p["plans"][p["table"]["ns:research#=*/*#t4=*/*"]]
    assert [f["rule"] for f in refused["findings"]] == ["gpu-class-not-allowed"]
    assert "namespace research may not use gpu-type t4" in refused["findings"][0]["message"]
    # A Pod labelled t4 says one value per axis, and is refused there: the deny policy cannot skip such Pods.
    assert p["levels"]["plain"] == ["deny"]


def test_aliases_are_full_match_regexes_of_the_globs() -> None:
    import re

    aliases = _params()["aliases"]
    product = re.compile(aliases["gpu-type|a100|nvidia.com/gpu.product"])
    assert product.match("NVIDIA-A100-SXM4-80GB") and not product.match("Tesla-T4")
    exact = re.compile(aliases["gpu-type|a100|accelerator"])
    assert exact.match("nvidia-a100") and not exact.match("nvidia-a100x") and not exact.match("nvidiaXa100")


def test_the_policies_do_not_depend_on_the_rules() -> None:
    other = load_policy(REPO / "tests" / "data" / "rules" / "a100-default")
    first = native.render(PACKAGED)
    second = native.render(other)
    assert first[2:] == second[2:]  # a rule edit is a data change: only the params object differs
    assert first[1] != second[1]
    assert [o["kind"] for o in first] == [
        "CustomResourceDefinition", "GPUClassMap", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding"]


def test_enforcement_levels_map_to_validation_actions() -> None:
    objects = native.render(PACKAGED)
    bindings = {o["metadata"]["name"]: o["spec"].get("validationActions") for o in objects
                if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bindings == {"gpu-webhook.io-deny": ["Deny"], "gpu-webhook.io-warn": ["Warn", "Audit"]}
    assert native.params(PACKAGED)["enforcement"] == {r: PACKAGED.enforcement_of(r) for r in RULES}


def test_every_rule_has_a_place_and_a_reason() -> None:
    for rule in RULES:
        where, why = native.placement_of(rule)
        assert where in (native.NATIVE, native.WEBHOOK, native.BOTH) and why, rule
    assert native.placement_of("gpu-never-schedulable")[0] == native.WEBHOOK


def test_the_params_fit_the_crds_bounds() -> None:
    import jsonschema

    schema = native.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.validate(native.params_object(PACKAGED), schema)


def test_class_affinity_is_refused_with_a_clear_error() -> None:
    text = (REPO / "rules" / "gpu-policy.yaml").read_text().replace(
        "          inference:\n            nodeSelector: {workload: inference}\n",
        "          inference:\n            nodeSelector: {workload: inference}\n            affinity: {nodeAffinity: "
        "{preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, preference: {matchExpressions: [{key: a, "
        "operator: Exists}]}}]}}\n")
    with pytest.raises(native.NativeError, match="node affinity"):
        native.params(parse_sources([("gpu-policy.yaml", text)]))


def test_mutating_templates_is_refused_with_a_clear_error() -> None:
    text = (REPO / "rules" / "gpu-policy.yaml").read_text().replace("mutate: false", "mutate: true")
    with pytest.raises(native.NativeError, match=r"templates\.mutate is true"):
        native.params(parse_sources([("gpu-policy.yaml", text)]))


def test_render_cli_prints_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli.main import main

    assert main(["policies", "render", "--rules", str(REPO / "rules")]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert docs[1]["kind"] == "GPUClassMap" and docs[2]["metadata"]["name"] == native_cel.MUTATING_NAME
    json.dumps(docs)  # plain data only


def test_the_engine_is_the_oracle() -> None:
    """Each table entry is what the engine said about a Pod with those tokens (spot check one by hand)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "labels": {"gpu-webhook.io/workload":
           "training"}}, "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    verdict = engine.evaluate(PACKAGED, pod, engine.Context("default"))
    p = _params()
    assert p["plans"][p["table"]["*#training=*/*#=*/*"]]["className"] == verdict.gpu_class


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_render_cli_helm_values_carry_the_params_and_the_hybrid_conditions(
        capsys: pytest.CaptureFixture[str], mode: str) -> None:
    from webhook.cli.main import main

    assert main(["policies", "render", "--rules", str(REPO / "rules"), "--mode", mode, "--format", "helm-values"]) == 0
    values = yaml.safe_load(capsys.readouterr().out)
    assert values["mode"] == mode
    assert values["native"]["params"] == native.params_object(PACKAGED)
    conditions = native.hybrid_match_conditions(PACKAGED) if mode == "hybrid" else []
    assert values["native"]["hybridMatchConditions"] == conditions


def test_render_cli_webhook_patch_is_the_hybrid_components_patch(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli.main import main

    assert main(["policies", "render", "--rules", str(REPO / "rules"), "--mode", "hybrid",
                 "--format", "webhook-patch"]) == 0
    operations = yaml.safe_load(capsys.readouterr().out)
    component = yaml.safe_load((REPO / "manifests" / "components" / "hybrid" / "kustomization.yaml").read_text())
    assert operations == yaml.safe_load(component["patches"][0]["patch"])


def test_render_cli_webhook_patch_needs_hybrid_mode(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli.main import main

    assert main(["policies", "render", "--rules", str(REPO / "rules"), "--format", "webhook-patch"]) == 1
    assert "add --mode hybrid" in capsys.readouterr().err


def test_levels_say_which_validating_policy_has_work_for_each_group() -> None:
    policy = parse_sources([("a.yaml", (REPO / "rules" / "gpu-policy.yaml").read_text()), ("b.yaml", """
apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata: {name: levels}
spec:
  enforcement: {gpu-class-skipped: deny, gpu-node-name-preset: "off", gpu-env-without-request: "off",
                gpu-runtime-without-request: "off", gpu-toleration-without-request: "off"}
""")])
    assert native.params(PACKAGED)["levels"] == {"gpu": ["deny", "warn"], "unaccounted": ["warn"],
                                                 "gpuAlways": ["deny"], "selection": ["deny", "warn"],
                                                 "nodeName": ["warn"], "plain": []}
    # What the MAP injects for the packaged classes, read back without a regex; a label value the aliases give
    # to several values would not be here.
    assert native.params(PACKAGED)["ownSel"] == {
        "workload|workload=inference": "inference", "workload|workload=training": "training",
        "gpu-type|gpu-type=a100": "a100", "gpu-type|gpu-type=t4": "t4"}
    assert native.params(policy)["levels"] == {"gpu": ["deny"], "unaccounted": [], "gpuAlways": ["deny"],
                                               "selection": ["deny"], "nodeName": [], "plain": []}
    conditions = {p["metadata"]["name"]: p["spec"]["matchConditions"][-1]["expression"] for p in native_cel.policies()
                  if p["kind"] == "ValidatingAdmissionPolicy"}
    assert "'warn' in params.spec.levels.gpu" in conditions["gpu-webhook.io-warn"]
    assert "'deny' in params.spec.levels.unaccounted" in conditions["gpu-webhook.io-deny"]


@pytest.mark.parametrize("name", ["cpu", "memory", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb",
                                  "nvidia.com/mig-9g.99gb", "example.com/foo"])
def test_the_regex_short_cuts_agree_with_the_regexes(name: str) -> None:
    p = _params()
    is_gpu = name in p["gpuExact"] or any(re.search(g["regex"], name) for g in p["gpuGlobs"])
    in_family = any(re.search(f["regex"], name) and name not in f["shadowed"] for f in p["validFor"])
    capped = any(r["maxPerContainer"] and re.search(r["regex"], name) for r in p["resources"])
    assert name not in p["notGPU"] or not is_gpu
    assert name not in p["notFamily"] or not in_family
    assert name not in p["uncapped"] or not capped
    assert ("nvidia.com/gpu" in p["notFamily"], "cpu" in p["notGPU"]) == (True, True)


def test_the_guards_read_no_params_where_they_must_not() -> None:
    mutating = next(p for p in native_cel.policies() if p["kind"] == "MutatingAdmissionPolicy")
    guard = mutating["spec"]["matchConditions"][-1]
    assert guard["name"] == "may-concern-gpus" and "params" not in guard["expression"]
    for p in native_cel.policies():
        for v in p["spec"].get("validations", []):
            assert v["messageExpression"].startswith("variables.failed") and v["messageExpression"].endswith(": ''")


def test_the_failing_guard_reads_no_variables_and_binds_each_once_in_order() -> None:
    for p in native_cel.policies():
        if p["kind"] != "ValidatingAdmissionPolicy":
            continue
        guard = p["spec"]["matchConditions"][-1]
        assert guard["name"].startswith("some-rule-at-") and "variables." not in guard["expression"]
        bound = re.findall(r"\]\.exists\(v_(\w+),", guard["expression"])
        names = [v["name"] for v in p["spec"]["variables"]]
        assert bound == [n for n in names if n in bound] and len(set(bound)) == len(bound)
        assert {"spec", "gpus", "key", "tabled", "exempt"} <= set(bound)
        assert not {"specPath", "metaPath", "limitWhere", "limitResource"} & set(bound)  # messages only


@pytest.mark.parametrize(("expr", "variables", "bound"), [
    ("variables.a > 1", [("a", "object.x"), ("b", "variables.a")], "[object.x].exists(v_a, v_a > 1)"),
    ("variables.b", [("a", "object.x"), ("b", "variables.a + 1"), ("c", "2")],
     "[object.x].exists(v_a, [v_a + 1].exists(v_b, v_b))"),
    ("true", [("a", "1")], "true"),
    ("variables.ab && variables.a", [("a", "1"), ("ab", "2")], "[1].exists(v_a, [2].exists(v_ab, v_ab && v_a))"),
])
def test_bind_evaluates_each_variable_needed_once(expr: str, variables: list[tuple[str, str]], bound: str) -> None:
    assert cel_bind.bind(expr, variables) == bound


@pytest.mark.parametrize(("expr", "variables", "error"), [
    ("variables.z", [("a", "1")], "reads variables.z, which the policy does not define"),
    ("variables.a", [("a", "variables.b"), ("b", "1")], "variable a reads b, defined after it"),
])
def test_bind_refuses_what_a_policy_could_not_evaluate(expr: str, variables: list[tuple[str, str]],
                                                       error: str) -> None:
    with pytest.raises(ValueError, match=error):
        cel_bind.bind(expr, variables)
