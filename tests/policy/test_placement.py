"""Placement never harms: what the webhook adds never leaves a Pod none of the nodes its own selection admits.

Offline, the nodes are built from the rules: for every class (one value per axis), nodes that carry the
class's nodeSelector and, for each label key the Pod uses, either none or one instance of each alias pattern
of the value (an alias key may be missing on a node: a GKE node has no Karpenter label). A hypothesis property
then shows, for generated Pods with nodeSelectors and required node affinity over those keys: when the Pod as
written matches some model node, so does the Pod as the webhook admits it. With a live snapshot, the same
holds against real node labels: a default whose nodeSelector would leave none is held back, with a warning.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.admission.loader import load_policy
from webhook.policy import inventory, selection
from webhook.policy.checking import decide
from webhook.policy.inventory import Node, snapshot_of
from webhook.policy.rules import Policy, RuleError, parse_sources

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
UNKNOWN_VALUES = ["nvidia-l4", "hopper", "NVIDIA-H100-80GB-HBM3", "p5.48xlarge", "99999", "1"]
NUMBERS = ["0", "7", "8", "15000", "16000", "40000", "90000"]
RESOURCES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb"]


@cache
def policy() -> Policy:
    return load_policy()


def instance(pattern: str, fill: str = "x") -> str:
    """A label value a glob matches (`*A100*` -> `xA100x`)."""
    return pattern.replace("*", fill).replace("?", fill)


def instances(pattern: str) -> list[str]:
    """Two values of a glob, one of them never drawn for a Pod (a glob matches values no Pod lists)."""
    return [pattern] if "*" not in pattern and "?" not in pattern else [instance(pattern), instance(pattern, "z")]


def model_nodes(pol: Policy, keys: Sequence[str]) -> list[Node]:
    """Nodes of every class that carry, for each of `keys` the class's values alias, nothing or one instance."""
    nodes = []
    for combo in itertools.product(*[[(axis, v) for v in axis.values] for axis in pol.axes]):
        base: dict[str, str] = {}
        options: list[list[tuple[str, str] | None]] = []
        for _, value in combo:
            contribution = _contribution(combo, value)
            base.update(contribution.node_selector)
            for key in keys:
                found = contribution.aliases.get(key)
                if found is not None and not found.certain:
                    options.append([None, *((key, i) for p in found.patterns for i in instances(p))])
        for picked in itertools.product(*options):
            labels = dict(base)
            labels.update(dict(p for p in picked if p is not None))
            nodes.append(Node(f"node-{len(nodes)}", labels))
    return nodes


def _contribution(combo: Sequence[tuple[Any, str]], value: str) -> Any:
    return next(axis.values[v] for axis, v in combo if v == value)


def admitted(nodes: Sequence[Node], spec: Mapping[str, Any]) -> list[Node]:
    where = inventory.placement(spec, ("spec",))
    return [n for n in nodes if inventory.selects(n, where)]


@cache
def keys_and_values() -> dict[str, list[str]]:
    """Every node label key the classes know, with the values the generator draws for it."""
    found: dict[str, list[str]] = {}
    for axis in policy().axes:
        for contribution in axis.values.values():
            for key, values in contribution.aliases.items():
                found.setdefault(key, []).extend(instance(p) for p in values.patterns)
    return found


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    table = keys_and_values()
    keys = draw(st.lists(st.sampled_from(sorted(table)), min_size=1, max_size=3, unique=True))

    def value(key: str) -> st.SearchStrategy[str]:
        return st.sampled_from(table[key] + UNKNOWN_VALUES)

    def expression(key: str) -> st.SearchStrategy[dict[str, Any]]:
        listed = st.lists(value(key), min_size=1, max_size=3, unique=True)
        return st.one_of(
            st.builds(lambda v: {"key": key, "operator": "In", "values": v}, listed),
            st.builds(lambda v: {"key": key, "operator": "NotIn", "values": v}, listed),
            st.just({"key": key, "operator": "Exists"}),
            st.just({"key": key, "operator": "DoesNotExist"}),
            st.builds(lambda op, n: {"key": key, "operator": op, "values": [n]},
                      st.sampled_from(["Gt", "Lt"]), st.sampled_from(NUMBERS)),
        )

    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "resources": {
        "limits": {draw(st.sampled_from(RESOURCES)): draw(st.integers(1, 2))}}}]}
    selector_keys = draw(st.lists(st.sampled_from(keys), max_size=2, unique=True))
    if selector_keys:
        spec["nodeSelector"] = {k: draw(value(k)) for k in selector_keys}
    terms = draw(st.lists(st.lists(st.sampled_from(keys).flatmap(expression), min_size=1, max_size=3),
                          max_size=2))
    if terms:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}
    labels = {axis.label: draw(st.sampled_from(list(axis.values))) for axis in policy().axes if draw(st.booleans())}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": labels}, "spec": spec}


def used_keys(spec: Mapping[str, Any]) -> list[str]:
    return sorted({r.key for term in selection.terms_of(spec, ("spec",)) for r in term})


@SETTINGS
@given(pods())
def test_the_webhook_never_leaves_a_pod_without_the_nodes_it_selected(pod: dict[str, Any]) -> None:
    outcome = decide(policy(), pod, "default")
    nodes = model_nodes(policy(), used_keys(pod["spec"]))
    before = admitted(nodes, pod["spec"])
    if not outcome.verdict.allowed or not before:
        return
    after = admitted(nodes, outcome.patched["spec"])
    assert after, (f"the Pod as written matches {len(before)} model node(s), e.g. {dict(before[0].labels)}; "
                   f"after the patch none: {outcome.patch}; chosen: {outcome.verdict.choices}")
    final = decide(policy(), outcome.patched, "default", mode="validate").verdict
    assert final.allowed, f"the validating endpoint disagrees with the mutating one: {final.message()}"
    assert final.gpu_class == outcome.verdict.gpu_class


@SETTINGS
@given(pods())
def test_a_pod_naming_a_gpu_gets_no_gpu_type_selector(pod: dict[str, Any]) -> None:
    """A Pod whose own selection alone determines its gpu-type keeps that selection as the only one (a class
    label, the developer's explicit choice, adds the class's nodeSelector)."""
    gpu_type = next(a for a in policy().axes if a.name == "gpu-type")
    said = selection.candidates(gpu_type, selection.terms_of(pod["spec"], ("spec",)))
    outcome = decide(policy(), pod, "default")
    labelled = gpu_type.label in pod["metadata"]["labels"]
    if said is None or len(said) != 1 or labelled or not outcome.verdict.allowed:
        return
    assert "gpu-type" not in (outcome.patched["spec"].get("nodeSelector") or {}) or \
        "gpu-type" in (pod["spec"].get("nodeSelector") or {})


# --------------------------------------------------------------------------------------------- live nodes


def seed_node(name: str, labels: dict[str, str], gpus: int = 8) -> Node:
    return Node(name, labels, allocatable={"nvidia.com/gpu": gpus})


def seed_a100_pod(**spec: Any) -> dict[str, Any]:
    body = {"nodeSelector": {"accelerator": "nvidia-a100"},
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}], **spec}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a100-job"}, "spec": body}


LIVE = [
    pytest.param([seed_node("a100-1", {"accelerator": "nvidia-a100", "gpu-type": "a100", "workload": "training"})],
                 {"workload": "training"}, [], id="seed-cluster-labels-fit"),
    pytest.param([seed_node("a100-1", {"accelerator": "nvidia-a100"})], {}, ["gpu-class-skipped"],
                 id="nodes-without-class-labels-keep-the-pod-schedulable"),
    pytest.param([seed_node("a100-1", {"accelerator": "nvidia-a100", "workload": "inference"})],
                 {}, ["gpu-class-skipped"], id="default-held-back-against-live-labels"),
]


@pytest.mark.parametrize(("nodes", "injected", "warned"), LIVE)
def test_live_nodes_hold_back_a_default_that_would_leave_none(nodes: list[Node], injected: dict[str, str],
                                                              warned: list[str]) -> None:
    snapshot = snapshot_of(nodes, [], [], [])
    obj = seed_a100_pod()
    outcome = decide(policy(), obj, "default", inventory=snapshot)
    assert outcome.verdict.allowed, outcome.verdict.message()
    assert [f.rule for f in outcome.verdict.warnings if f.rule == "gpu-class-skipped"] == warned
    selector = dict(outcome.patched["spec"].get("nodeSelector") or {})
    assert selector == {"accelerator": "nvidia-a100", **injected}
    assert admitted(nodes, outcome.patched["spec"]), "the Pod still matches a live node"
    # The validating endpoint, on the same snapshot, agrees with what the mutating one chose.
    final = decide(policy(), outcome.patched, "default", mode="validate", inventory=snapshot)
    assert final.verdict.allowed, final.verdict.message()


def test_held_back_warning_names_the_axis_and_the_nodes() -> None:
    snapshot = snapshot_of([seed_node("a100-1", {"accelerator": "nvidia-a100"})], [], [], [])
    verdict = decide(policy(), seed_a100_pod(), "default", inventory=snapshot).verdict
    [warning] = [f.render() for f in verdict.warnings if f.rule == "gpu-class-skipped"]
    assert "workload training (from the default of gpu-type a100) was not applied" in warning
    assert "nodeSelector workload=training would leave the Pod no node" in warning
    assert "matches 1 GPU node (a100-1)" in warning


def test_a_plain_pod_keeps_the_defaults_the_live_nodes_satisfy() -> None:
    """A Pod that chose no nodes is not made unschedulable by a default: each default axis value no Ready node
    advertising its GPU satisfies is held back (with a warning), the others are kept; /validate agrees."""
    nodes = [seed_node("a100-1", {"gpu-type": "a100", "workload": "inference"})]
    snapshot = snapshot_of(nodes, [], [], [])
    pod = seed_a100_pod()
    del pod["spec"]["nodeSelector"]
    outcome = decide(policy(), pod, "default", inventory=snapshot)
    assert outcome.verdict.allowed and "gpu-class-no-node" not in outcome.verdict.rules
    assert outcome.patched["spec"]["nodeSelector"] == {"workload": "inference"}
    [warning] = [f.render() for f in outcome.verdict.warnings if f.rule == "gpu-class-skipped"]
    assert "gpu-type t4 not applied (from the cluster default)" in warning
    assert warning.endswith("set spec.classes.axes.gpu-type.default: a100"), warning
    assert admitted(nodes, outcome.patched["spec"])
    final = decide(policy(), outcome.patched, "default", mode="validate", inventory=snapshot)
    assert final.verdict.allowed, final.verdict.message()
    assert final.verdict.gpu_class == outcome.verdict.gpu_class == "workload=inference,gpu-type=t4"
    offline = decide(policy(), pod, "default")
    assert offline.patched["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}, \
        "without cluster awareness nothing changes"


LIVE_NODE = st.builds(
    lambda name, workload, gpu_type, ready, gpus: Node(
        name, {k: v for k, v in (("workload", workload), ("gpu-type", gpu_type)) if v},
        (inventory.Taint("nvidia.com/gpu", "present"),), {"nvidia.com/gpu": gpus}, ready),
    st.sampled_from(["n0", "n1", "n2", "n3"]), st.sampled_from(["inference", "training", "", "batch"]),
    st.sampled_from(["t4", "a100", "", "h200"]), st.booleans(), st.integers(0, 2))


@SETTINGS
@given(st.lists(LIVE_NODE, min_size=1, max_size=4, unique_by=lambda n: n.name), st.integers(1, 2))
def test_a_plain_pod_is_never_left_without_the_live_gpu_nodes(nodes: list[Node], gpus: int) -> None:
    """With live nodes, a plain GPU Pod admitted by /mutate matches a Ready node that advertises its GPU whenever
    one exists, and /validate on the same snapshot agrees with the class /mutate chose."""
    snapshot = snapshot_of(nodes, [inventory.RuntimeClass("nvidia", "nvidia")], [], [])
    pod = seed_a100_pod()
    del pod["spec"]["nodeSelector"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    outcome = decide(policy(), pod, "default", inventory=snapshot)
    if not outcome.verdict.allowed:
        assert outcome.verdict.rules[0] == "gpu-never-schedulable", outcome.verdict.message()
        return
    hosts = [n for n in nodes if n.ready and n.offers("nvidia.com/gpu") > 0]
    if hosts:
        assert admitted(hosts, outcome.patched["spec"]), (outcome.patch, outcome.verdict.choices)
    final = decide(policy(), outcome.patched, "default", mode="validate", inventory=snapshot).verdict
    assert final.allowed, final.message()
    assert final.gpu_class == outcome.verdict.gpu_class


def test_a_plain_pod_gets_the_platform_default_when_no_gpu_node_is_ready() -> None:
    """No Ready node advertises the GPU at all: nothing is held back (gpu-class-no-node says why)."""
    snapshot = snapshot_of([Node("a100-1", {"gpu-type": "a100"}, allocatable={"nvidia.com/gpu": 8}, ready=False)],
                           [], [], [])
    pod = seed_a100_pod()
    del pod["spec"]["nodeSelector"]
    outcome = decide(policy(), pod, "default", inventory=snapshot)
    assert "gpu-class-no-node" in outcome.verdict.rules and "gpu-class-skipped" not in outcome.verdict.rules
    assert outcome.patched["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}


# --------------------------------------------------------------------------------------------- rule files


def rule_doc(body: str) -> list[tuple[str, str]]:
    return [("gpu-policy.yaml", "apiVersion: gpu-webhook.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: t}\n"
                                "spec:\n" + body)]


AXES = """
  classes:
    axes:
      gpu-type:
        label: gpu-webhook.io/gpu-type
        values:
          a100:
            nodeSelector: {gpu-type: a100}
            aliases: {%s}
            defaults: {%s}
"""

BAD_RULES = [
    pytest.param(AXES % ('nvidia.com/gpu.product: ["A100 80GB"]', ""),
                 ["line 13", "spec.classes.axes.gpu-type.values.a100.aliases.nvidia.com/gpu.product[0]",
                  "'A100 80GB' is not a label value or a glob of one"], id="pattern-with-a-space"),
    pytest.param(AXES % ('nvidia.com/gpu.product: []', ""), ["aliases.nvidia.com/gpu.product", "non-empty"],
                 id="empty-alias-list"),
    pytest.param(AXES % ("gpu-type: [a100]", ""), ['"gpu-type" is already this value\'s nodeSelector key'],
                 id="alias-repeats-the-selector-key"),
    pytest.param(AXES % ("", "workload: training"), ['"workload" is not another class axis'],
                 id="default-for-an-unknown-axis"),
    pytest.param(AXES % ("", "gpu-type: t4"), ['"gpu-type" is not another class axis'], id="default-for-itself"),
    pytest.param('  gpuResources:\n    "nvidia.com/mig-*": {validFor: {gpu-type: [t4]}}\n' + AXES % ("", ""),
                 ["spec.gpuResources.nvidia.com/mig-*.validFor.gpu-type", '"t4" is not a gpu-type value'],
                 id="valid-for-an-unknown-value"),
]


@pytest.mark.parametrize(("body", "substrings"), BAD_RULES)
def test_bad_placement_rules_are_refused_naming_the_field(body: str, substrings: list[str]) -> None:
    with pytest.raises(RuleError) as caught:
        parse_sources(rule_doc(body))
    message = str(caught.value)
    assert message.startswith("gpu-policy.yaml")
    for part in substrings:
        assert part in message, message


def test_globs_are_compiled_once_when_the_rules_load() -> None:
    axis = next(a for a in policy().axes if a.name == "gpu-type")
    product = axis.values["a100"].aliases["nvidia.com/gpu.product"]
    assert product.globs is not None and product.globs.match("NVIDIA-A100-SXM4-80GB")
    assert not product.matches("Tesla-T4")
    assert axis.values["t4"].aliases["nvidia.com/gpu.product"].matches("Tesla-T4-SHARED")


def _either(*terms: dict[str, Any]) -> dict[str, Any]:
    """A GPU Pod whose required node affinity is `terms` ORed, each one expression."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {}},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [t]} for t in terms]}}}}}


NO_WORKLOAD = {"key": "workload", "operator": "DoesNotExist"}


@pytest.mark.parametrize(("pod", "gpu_class"), [
    pytest.param(_either(NO_WORKLOAD, {"key": "accelerator", "operator": "In", "values": ["nvidia-a100"]}),
                 "workload=inference,gpu-type=a100", id="workload-default-leaves-an-a100-term"),
    pytest.param(_either(NO_WORKLOAD, {"key": "cloud.google.com/gke-accelerator", "operator": "In",
                                       "values": ["nvidia-tesla-t4"]}),
                 "workload=inference,gpu-type=t4", id="workload-default-leaves-a-t4-term"),
])
def test_a_default_that_narrows_the_selection_to_one_gpu_makes_it_the_pods_own(pod: dict[str, Any],
                                                                               gpu_class: str) -> None:
    """A hypothesis counterexample: the workload default drops the Pod's `workload DoesNotExist` term, and the
    term left names one GPU. That GPU is the Pod's own choice (no gpu-type selector added), and /mutate reports
    the class /validate reads from the patched Pod."""
    outcome = decide(policy(), pod, "default")
    assert outcome.verdict.allowed and outcome.verdict.gpu_class == gpu_class, outcome.verdict
    assert outcome.patched["spec"]["nodeSelector"] == {"workload": "inference"}
    final = decide(policy(), outcome.patched, "default", mode="validate").verdict
    assert final.allowed and final.gpu_class == gpu_class


T4_OR_NO_WORKLOAD = _either({"key": "accelerator", "operator": "In", "values": ["nvidia-tesla-t4"]}, NO_WORKLOAD)


def test_a_label_that_keeps_only_terms_no_class_holds_is_a_conflict() -> None:
    """A hypothesis counterexample: the label says a100, and the only term that admits it (`workload
    DoesNotExist`) selects nodes no class has; the one term the rules cover selects a T4. Refused, as a label
    against the Pod's own selection is, naming both."""
    pod = json.loads(json.dumps(T4_OR_NO_WORKLOAD))
    pod["metadata"]["labels"] = {"gpu-webhook.io/gpu-type": "a100"}
    verdict = decide(policy(), pod, "default").verdict
    assert not verdict.allowed
    assert verdict.message() == (
        "[gpu-class-conflict] label gpu-webhook.io/gpu-type chooses gpu-type a100, but the Pod's own node selection "
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0] accelerator "
        "In [nvidia-tesla-t4] admits only gpu-type t4 on the nodes the rules class (its other terms select nodes no "
        "class has); make them agree: change the label or that selector")


def test_a_resource_that_keeps_only_terms_no_class_holds_leaves_the_axis_out() -> None:
    """The same with a resource that exists only on a100 instead of the label: the axis is left out with a
    warning, as when the selection and the resource exclude each other outright; /validate agrees."""
    pod = json.loads(json.dumps(T4_OR_NO_WORKLOAD))
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-1g.5gb": 1}
    outcome = decide(policy(), pod, "default")
    assert outcome.verdict.allowed and outcome.verdict.gpu_class == "workload=inference"
    assert [w.rule for w in outcome.verdict.warnings] == ["gpu-class-skipped"]
    assert "so gpu-type is left as the Pod chose it" in outcome.verdict.warnings[0].message
    assert "gpu-type" not in outcome.patched["spec"]["nodeSelector"]
    final = decide(policy(), outcome.patched, "default", mode="validate").verdict
    assert final.allowed and final.gpu_class == "workload=inference"
