"""Classes on GPU feature discovery's own labels (rules/examples/gfd): values that place Pods by required node
affinity (matchExpressions) instead of hand-set nodeSelector labels.

What is shown: the real H200's GFD label sets select h200 and 141gb and nothing else; every product name the
example lists selects one gpu-type; the class's expressions go into every one of the Pod's nodeSelectorTerms
without clobbering them, once (a second pass adds nothing, /validate agrees); a Pod's own selection on those
labels is read through the expressions; and a bad expression is refused naming the field.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from webhook.admission.loader import load_policy
from webhook.policy import inventory, selection
from webhook.policy.checking import decide
from webhook.policy.inventory import Node
from webhook.policy.rules import Policy, RuleError, parse_sources

REPO = Path(__file__).parents[2]
GFD_RULES = REPO / "rules" / "examples" / "gfd"
REAL = REPO / "tests" / "data" / "real-h200"
PRODUCT, MEMORY = "nvidia.com/gpu.product", "nvidia.com/gpu.memory"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@cache
def gfd() -> Policy:
    return load_policy(GFD_RULES)


def axis(name: str) -> Any:
    return next(a for a in gfd().axes if a.name == name)


def selected(node: Node, axis_name: str) -> list[str]:
    return [v for v, c in axis(axis_name).values.items()
            if inventory.value_selects(node, c.node_selector, c.match_expressions)]


def gfd_node(labels_file: str) -> Node:
    lines = (REAL / labels_file).read_text().splitlines()
    return Node("kit-gpu-node", dict(line.split("=", 1) for line in lines if line.strip()),
                allocatable={"nvidia.com/gpu": 1})


def test_the_example_rules_pass_lint(capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli import main as cli

    assert cli.main(["lint", str(GFD_RULES)]) == 0
    assert "gpu-type (gpu-webhook.io/gpu-type): t4, a10, l4, l40s, a100-40gb, a100-80gb, h100, h200, b200" in \
        capsys.readouterr().out


@pytest.mark.parametrize("labels_file", ["gfd-labels.txt", "gfd-labels-timesliced.txt", "gfd-labels-shared.txt"])
def test_the_real_h200_labels_select_h200_and_141gb(labels_file: str) -> None:
    node = gfd_node(labels_file)
    assert selected(node, "gpu-type") == ["h200"]
    assert selected(node, "gpu-memory") == ["141gb"]


# GFD's labels of other GPUs: the product name as NVML reports it (spaces as '-') and one GPU's memory in MiB,
# as documented by NVIDIA for GFD and these products.
DOCUMENTED = [
    pytest.param("Tesla-T4", "15360", "t4", "16gb", id="t4"),
    pytest.param("Tesla-T4-SHARED", "15360", "t4", "16gb", id="t4-time-sliced"),
    pytest.param("NVIDIA-A10G", "23028", "a10", "24gb", id="a10g"),
    pytest.param("NVIDIA-L4", "23034", "l4", "24gb", id="l4"),
    pytest.param("NVIDIA-L40S", "46068", "l40s", "48gb", id="l40s"),
    pytest.param("NVIDIA-A100-SXM4-40GB", "40960", "a100-40gb", "40gb", id="a100-40gb"),
    pytest.param("NVIDIA-A100-SXM4-80GB", "81920", "a100-80gb", "80gb", id="a100-80gb"),
    pytest.param("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "4864", "a100-40gb", None, id="a100-mig-single"),
    pytest.param("NVIDIA-H100-80GB-HBM3", "81559", "h100", "80gb", id="h100"),
    pytest.param("NVIDIA-H200", "143771", "h200", "141gb", id="h200"),
    pytest.param("NVIDIA-B200", "183359", "b200", "180gb", id="b200"),
]


@pytest.mark.parametrize(("product", "memory", "gpu_type", "gpu_memory"), DOCUMENTED)
def test_documented_gfd_labels_select_one_value_each(product: str, memory: str, gpu_type: str,
                                                     gpu_memory: str | None) -> None:
    node = Node("n", {PRODUCT: product, MEMORY: memory})
    assert selected(node, "gpu-type") == [gpu_type]
    assert selected(node, "gpu-memory") == ([gpu_memory] if gpu_memory else [])


def test_every_listed_product_name_belongs_to_one_gpu_type() -> None:
    names = [v for c in axis("gpu-type").values.values() for e in c.match_expressions for v in e.values]
    assert len(names) == len(set(names)) > 50
    for name in names:
        assert len(selected(Node("n", {PRODUCT: name}), "gpu-type")) == 1, name


# --------------------------------------------------------------------------------------------- merging


def gpu_pod(affinity: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
            **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                            **spec}
    if affinity is not None:
        body["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": labels if labels is not None else {"gpu-webhook.io/gpu-type": "h200"}},
            "spec": body}


def terms(*expressions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": e} for e in expressions]}}}


ZONE_A = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
ZONE_B = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}
PREFERRED = {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 1, "preference": {"matchExpressions": [ZONE_A]}}]}


def h200() -> dict[str, Any]:
    return axis("gpu-type").values["h200"].match_expressions[0].to_api()


MERGES = [
    pytest.param(None, [[h200()]], id="no-affinity: one term of the class"),
    pytest.param(terms([ZONE_A], [ZONE_B]), [[ZONE_A, h200()], [ZONE_B, h200()]], id="two-terms: added to each"),
    pytest.param({"nodeAffinity": PREFERRED}, [[h200()]], id="only-preferred: a required term, preferred kept"),
    pytest.param({"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}}, [[h200()]], id="empty-term-list"),
    pytest.param(terms([ZONE_A, h200()]), [[ZONE_A, h200()]], id="already-there: nothing added"),
    pytest.param({"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["kit-gpu-node"]}]}, {}]}}},
        [[h200()], []], id="match-fields-term-gets-them; an-empty-term-stays-empty"),
]


@pytest.mark.parametrize(("affinity", "expected"), MERGES)
def test_class_expressions_go_into_every_term(affinity: dict[str, Any] | None,
                                              expected: list[list[dict[str, Any]]]) -> None:
    pod = gpu_pod(affinity, nodeSelector={"workload": "inference"})
    outcome = decide(gfd(), pod, "default")
    assert outcome.verdict.allowed, outcome.verdict.message()
    spec = outcome.patched["spec"]
    got = spec["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert [t.get("matchExpressions", []) for t in got] == expected
    assert spec["nodeSelector"] == {"workload": "inference"}, "the Pod's nodeSelector is kept"
    if affinity and "preferredDuringSchedulingIgnoredDuringExecution" in affinity["nodeAffinity"]:
        assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
            PREFERRED["preferredDuringSchedulingIgnoredDuringExecution"]
    again = decide(gfd(), outcome.patched, "default")
    assert again.patch == [], "idempotent: a second pass adds nothing"
    final = decide(gfd(), outcome.patched, "default", mode="validate").verdict
    assert final.allowed and final.gpu_class == outcome.verdict.gpu_class, final.message()


def test_validate_requires_the_expressions_when_mutate_was_skipped() -> None:
    verdict = decide(gfd(), gpu_pod(terms([ZONE_A])), "default", mode="validate").verdict
    [violation] = verdict.violations
    assert violation.rule == "gpu-class-missing"
    assert "in every required node affinity term: nvidia.com/gpu.product In [NVIDIA-H200, " in violation.message


# --------------------------------------------------------------------------------------------- the Pod's selection


SELECTIONS = [
    pytest.param({"nodeSelector": {PRODUCT: "NVIDIA-H200-SHARED"}}, "gpu-type", {"h200"}, id="product-by-selector"),
    pytest.param({"affinity": terms([{"key": MEMORY, "operator": "In", "values": ["143771"]}])}, "gpu-memory",
                 {"141gb"}, id="exact-memory"),
    pytest.param({"affinity": terms([{"key": MEMORY, "operator": "Gt", "values": ["100000"]}])}, "gpu-memory",
                 {"141gb", "180gb"}, id="memory-above"),
    pytest.param({"affinity": terms([{"key": MEMORY, "operator": "Gt", "values": ["140000"]},
                                     {"key": MEMORY, "operator": "Lt", "values": ["145000"]}])}, "gpu-memory",
                 {"141gb"}, id="memory-between"),
    pytest.param({"affinity": terms([{"key": PRODUCT, "operator": "NotIn", "values": ["Tesla-T4"]}])}, "gpu-type",
                 {v for v in ("t4", "a10", "l4", "l40s", "a100-40gb", "a100-80gb", "h100", "h200", "b200")},
                 id="not-in-one-name-leaves-all"),
    pytest.param({"nodeSelector": {PRODUCT: "NVIDIA-GH200-480GB"}}, "gpu-type", set(), id="a-product-not-listed"),
]


@pytest.mark.parametrize(("spec", "axis_name", "values"), SELECTIONS)
def test_a_pods_own_selection_is_read_through_the_expressions(spec: dict[str, Any], axis_name: str,
                                                              values: set[str]) -> None:
    assert selection.candidates(axis(axis_name), selection.terms_of(spec, ("spec",))) == frozenset(values)


def test_a_pod_selecting_the_product_itself_gets_no_affinity() -> None:
    pod = gpu_pod(labels={}, nodeSelector={PRODUCT: "NVIDIA-H200"})
    outcome = decide(gfd(), pod, "default")
    assert outcome.verdict.gpu_class == "gpu-type=h200"
    assert "affinity" not in outcome.patched["spec"]


# --------------------------------------------------------------------------------------------- live nodes


def real_nodes(name: str) -> inventory.Snapshot:
    node = json.loads((REAL / f"{name}.json").read_text())
    return inventory.snapshot_from_api([node], [{"metadata": {"name": "nvidia"}, "handler": "nvidia"}])


@pytest.mark.parametrize(("node", "labels", "warned"), [
    pytest.param("node-h200", {"gpu-webhook.io/gpu-type": "h200", "gpu-webhook.io/gpu-memory": "141gb"}, [],
                 id="h200-141gb-fits"),
    pytest.param("node-h200-timesliced", {"gpu-webhook.io/gpu-type": "h200"}, [], id="time-sliced-h200-fits"),
    pytest.param("node-h200", {"gpu-webhook.io/gpu-type": "a100-80gb"}, ["gpu-class-no-node"], id="a100-no-node"),
])
def test_expression_classes_against_the_real_node(node: str, labels: dict[str, str], warned: list[str]) -> None:
    verdict = decide(gfd(), gpu_pod(labels=labels), "default", inventory=real_nodes(node)).verdict
    assert verdict.allowed and [w.rule for w in verdict.warnings] == warned, verdict.warnings


# --------------------------------------------------------------------------------------------- rule files


def rule_doc(expressions: str, selector: str = "") -> list[tuple[str, str]]:
    return [("gpu-policy.yaml", "apiVersion: gpu-webhook.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: t}\nspec:\n"
             "  classes:\n    axes:\n      gpu-type:\n        label: gpu-webhook.io/gpu-type\n        values:\n"
             f"          h200:\n{selector}            matchExpressions:\n{expressions}")]


@pytest.mark.parametrize(("body", "selector", "message"), [
    pytest.param('              - {key: nvidia.com/gpu.memory, operator: Gt, values: ["1", "2"]}\n', "",
                 "matchExpressions.0: nvidia.com/gpu.memory Gt needs exactly one integer value", id="gt-two-values"),
    pytest.param('              - {key: nvidia.com/gpu.memory, operator: Lt, values: ["80GB"]}\n', "",
                 "Lt needs exactly one integer value", id="lt-not-a-number"),
    pytest.param("              - {key: nvidia.com/gpu.product, operator: In}\n", "",
                 "In needs at least one value", id="in-without-values"),
    pytest.param("              - {key: nvidia.com/gpu.product, operator: Exists, values: [x]}\n", "",
                 "Exists takes no values", id="exists-with-values"),
    pytest.param("              - {key: gpu-type, operator: Exists}\n", "            nodeSelector: {gpu-type: h200}\n",
                 '"gpu-type" is already this value\'s nodeSelector or alias key', id="same-key-twice"),
    pytest.param("              - {key: nvidia.com/gpu.product, operator: Like, values: [x]}\n", "",
                 "must be one of 'In', 'NotIn', 'Exists', 'DoesNotExist', 'Gt', 'Lt'", id="unknown-operator"),
])
def test_bad_expressions_are_refused_naming_the_field(body: str, selector: str, message: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse_sources(rule_doc(body, selector))
    assert message in str(caught.value) and "spec.classes.axes.gpu-type.values.h200" in str(caught.value), \
        str(caught.value)
