"""The inventory decisions (webhook.policy.inventory) and their use by the engine, as tables over snapshots built
from recorded-style API JSON (tests/data/kube/): GFD label sets of A100, T4, MIG single/mixed and
time-sliced nodes."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from support.dra import T4, gpu_slice
from support.dra import load as dra_load

from webhook.admission.loader import load_policy
from webhook.admission.review import sanitize_warning
from webhook.policy import inventory
from webhook.policy.dra_inventory import DraIndex, device_class_from_api, slice_from_api, view_from_api
from webhook.policy.engine import Context, evaluate
from webhook.policy.findings import Verdict
from webhook.policy.inventory import Node, Snapshot, Taint
from webhook.policy.rules import Policy, parse_sources

KUBE = Path(__file__).parents[1] / "data" / "kube"
POLICY = load_policy()


def items(name: str) -> list[dict[str, Any]]:
    data: dict[str, Any] = json.loads((KUBE / name).read_text())
    return list(data["items"])


FULL = inventory.snapshot_from_api(items("nodes.json"), items("runtimeclasses.json"), items("namespaces.json"),
                                   items("resourceclaimtemplates-v1.json"))
NODES = {n.name: n for n in FULL.nodes}


def snap(*names: str, nodes: tuple[Node, ...] = (), **changes: Any) -> Snapshot:
    """The full snapshot with only the named nodes (plus `nodes`)."""
    return dataclasses.replace(FULL, nodes=tuple(NODES[n] for n in names) + nodes, **changes)


def rules(spec: str) -> Policy:
    """The packaged rules plus one more document (merged like a rule directory)."""
    extra = f"apiVersion: gpu-webhook.io/v1alpha1\nkind: GPUPolicy\nmetadata: {{name: extra}}\nspec:\n{spec}"
    base = [(str(p), p.read_text()) for p in sorted(Path(POLICY.sources[0]).parent.glob("*.yaml"))]
    return parse_sources([*base, ("zz-extra.yaml", extra)])


PRODUCT_RULES = rules("""
  classes:
    axes:
      product:
        label: gpu-webhook.io/product
        values:
          t4: {nodeSelector: {nvidia.com/gpu.product: Tesla-T4}}
          a100-40: {nodeSelector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB}}
""")
MIG_RULES = rules("""
  gpuResources:
    "nvidia.com/mig-*": {validFor: {gpu-type: [a100-mig]}}
  classes:
    axes:
      gpu-type:
        label: gpu-webhook.io/gpu-type
        values:
          a100-mig: {nodeSelector: {gpu-type: a100-mig}}
""")

SANDBOX_RULES = rules("""
  classes:
    axes:
      workload:
        label: gpu-webhook.io/workload
        values:
          sandbox: {nodeSelector: {workload: sandbox}, runtimeClassName: kata-gpu}
          kata-t4: {nodeSelector: {workload: inference}, runtimeClassName: kata-gpu}
""")


def pod(gpus: int = 1, *, labels: dict[str, str] | None = None, resource: str = "nvidia.com/gpu",
        namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    limits = {resource: str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}], **spec},
    }


def deployment(gpus: int, labels: dict[str, str]) -> dict[str, Any]:
    template = pod(gpus, labels=labels)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": template["metadata"], "spec": template["spec"]}}}


ONLY_A100_2 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a100-2"]}]}]}}}
TRAINING = {"gpu-webhook.io/workload": "training", "gpu-webhook.io/gpu-type": "a100"}


def judge(obj: dict[str, Any], snapshot: Snapshot | None, policy: Policy = POLICY, mode: str = "mutate") -> Verdict:
    ns = obj["metadata"].get("namespace")
    return evaluate(policy, obj, Context(ns, mode=mode, inventory=snapshot))  # type: ignore[arg-type]


def inventory_findings(verdict: Verdict) -> list[str]:
    ours = {"gpu-never-schedulable", "gpu-class-no-node", "gpu-runtime-class-missing", "gpu-inventory-unavailable"}
    return [f.render() for f in (*verdict.violations, *verdict.warnings) if f.rule in ours]


# --------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("name", "allocatable", "ready", "product"),
    [
        pytest.param("a100-1", {"nvidia.com/gpu": 8}, True, "NVIDIA-A100-SXM4-80GB", id="a100"),
        pytest.param("t4-1", {"nvidia.com/gpu": 1}, True, "Tesla-T4", id="t4"),
        pytest.param("t4-shared-1", {"nvidia.com/gpu": 4}, True, "Tesla-T4-SHARED", id="time-sliced"),
        pytest.param("t4-renamed-1", {"nvidia.com/gpu": 0, "nvidia.com/gpu.shared": 4}, True, "Tesla-T4",
                     id="time-sliced-renamed"),
        pytest.param("mig-single-1", {"nvidia.com/gpu": 56}, True, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                     id="mig-single"),
        pytest.param("mig-mixed-1", {"nvidia.com/gpu": 0, "nvidia.com/mig-1g.5gb": 16, "nvidia.com/mig-2g.10gb": 8,
                                     "nvidia.com/mig-3g.20gb": 8}, True, "NVIDIA-A100-SXM4-40GB", id="mig-mixed"),
        pytest.param("a100-down", {"nvidia.com/gpu": 16}, False, "NVIDIA-A100-SXM4-80GB", id="not-ready"),
        pytest.param("cpu-1", {}, True, None, id="cpu-only"),
    ],
)
def test_node_from_api(name: str, allocatable: dict[str, int], ready: bool, product: str | None) -> None:
    node = NODES[name]
    assert dict(node.allocatable) == allocatable, "only extended resources, as whole numbers"
    assert node.ready is ready
    assert node.labels.get("nvidia.com/gpu.product") == product


def test_snapshot_parts_from_api() -> None:
    assert FULL.runtime_classes["kata-gpu"].node_selector == {"workload": "sandbox"}
    assert FULL.runtime_classes["nvidia"].handler == "nvidia"
    assert FULL.namespace_labels("ml-research") == {"kubernetes.io/metadata.name": "ml-research",
                                                     "team-type": "research"}
    assert FULL.namespace_labels("nope") is None
    assert dataclasses.replace(FULL, synced=False).namespace_labels("ml-research") is None
    assert FULL.claim_templates[("ml-research", "single-gpu")].device_classes == ("gpu.nvidia.com",)
    assert FULL.claim_templates[("ml-serving", "any-gpu")].device_classes == ("mig.nvidia.com", "gpu.nvidia.com")
    beta = inventory.claim_template_from_api(items("resourceclaimtemplates-v1beta1.json")[0])
    assert beta.device_classes == ("gpu.nvidia.com",)


# --------------------------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        pytest.param({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     Taint("nvidia.com/gpu", "present", "NoSchedule"), True, id="exists-key-effect"),
        pytest.param({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     Taint("nvidia.com/gpu", "present", "NoExecute"), False, id="other-effect"),
        pytest.param({"key": "nvidia.com/gpu", "value": "present"}, Taint("nvidia.com/gpu", "present", "NoExecute"),
                     True, id="equal-default-any-effect"),
        pytest.param({"key": "nvidia.com/gpu", "value": "yes"}, Taint("nvidia.com/gpu", "present", "NoSchedule"),
                     False, id="equal-other-value"),
        pytest.param({"operator": "Exists"}, Taint("anything", "x", "NoExecute"), True, id="wildcard"),
        pytest.param({"value": "x"}, Taint("anything", "x", "NoExecute"), False, id="empty-key-equal"),
    ],
)
def test_tolerates(toleration: dict[str, Any], taint: Taint, expected: bool) -> None:
    assert inventory.tolerates(toleration, taint) is expected


@pytest.mark.parametrize(
    ("expressions", "expected"),
    [
        pytest.param([{"key": "gpu-type", "operator": "In", "values": ["a100", "h100"]}], True, id="in"),
        pytest.param([{"key": "gpu-type", "operator": "NotIn", "values": ["a100"]}], False, id="not-in"),
        pytest.param([{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["4"]}], True, id="gt"),
        pytest.param([{"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["4"]}], False, id="lt"),
        pytest.param([{"key": "nvidia.com/mig.strategy", "operator": "DoesNotExist"}], False, id="does-not-exist"),
        pytest.param([{"key": "gpu-type", "operator": "Exists"},
                      {"key": "workload", "operator": "In", "values": ["inference"]}], False, id="all-of-a-term"),
    ],
)
def test_required_node_affinity(expressions: list[dict[str, Any]], expected: bool) -> None:
    affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": expressions}]}}
    assert inventory.affinity_matches(NODES["a100-1"], affinity) is expected


# --------------------------------------------------------------------------------------------- capacity


@pytest.mark.parametrize(
    ("obj", "snapshot", "policy", "expected"),
    [
        pytest.param(pod(8, labels=TRAINING), snap("a100-1", "a100-2"), POLICY, [], id="a100-fits-largest"),
        pytest.param(pod(6, labels=TRAINING), snap("a100-2", "t4-1"), POLICY,
                     ["[gpu-never-schedulable] the Pod asks for 6 nvidia.com/gpu but the largest Ready node of class "
                      "workload=training,gpu-type=a100 (nodeSelector gpu-type=a100, workload=training) offers 4 "
                      "(a100-2; 1 node match): it would stay Pending with Insufficient nvidia.com/gpu forever; ask for "
                      "at most 4 per Pod, or split the work across Pods"], id="a100-too-big"),
        pytest.param(pod(6, labels=TRAINING), snap("a100-2", "a100-down"), POLICY,
                     ["offers 4 (a100-2; 1 node match)"], id="not-ready-node-does-not-count"),
        pytest.param(deployment(6, TRAINING), snap("a100-2"), POLICY, ["[gpu-never-schedulable]"],
                     id="deployment-template"),
        pytest.param(pod(1), snap("t4-1", "a100-1"), POLICY, [], id="t4-default-class"),
        pytest.param(pod(2), snap("t4-1", "a100-1"), POLICY, ["offers 1 (t4-1; 1 node match)"], id="t4-two"),
        pytest.param(pod(1), snap("t4-renamed-1"), POLICY,
                     ["[gpu-class-no-node] class workload=inference,gpu-type=t4 (nodeSelector gpu-type=t4, "
                      "workload=inference) matches no Ready node that advertises nvidia.com/gpu, so the Pod would "
                      "stay Pending: t4-renamed-1 advertises nvidia.com/gpu.shared instead: time-slicing or MPS with "
                      "renameByDefault renames the resource; request nvidia.com/gpu.shared"],
                     id="time-sliced-renamed"),
        pytest.param(pod(1), snap("t4-renamed-1", "a100-1"), POLICY, [],
                     id="time-sliced-renamed-plain-pod-goes-where-whole-gpus-are"),
        pytest.param(pod(1, resource="nvidia.com/gpu.shared"), snap("t4-renamed-1"), POLICY, [],
                     id="time-sliced-renamed-asks-shared"),
        pytest.param(pod(1, labels={"gpu-webhook.io/product": "t4"}), snap("t4-shared-1", "a100-1"), PRODUCT_RULES,
                     ["t4-shared-1 has nvidia.com/gpu.product=Tesla-T4-SHARED: time-slicing appends -SHARED to the "
                      "product label; select Tesla-T4-SHARED in the class"], id="time-sliced-shared-suffix"),
        pytest.param(pod(1, labels={"gpu-webhook.io/product": "a100-40"}), snap("mig-single-1"), PRODUCT_RULES,
                     ["mig-single-1 has nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.5gb: MIG single mode "
                      "appends the profile to the product label"], id="mig-single-suffix"),
        pytest.param(pod(1, labels={"gpu-webhook.io/gpu-type": "a100-mig"}), snap("mig-mixed-1", "t4-1"), MIG_RULES,
                     ["no node advertises whole GPUs there: MIG mixed strategy splits them into nvidia.com/mig-1g.5gb, "
                      "nvidia.com/mig-2g.10gb, nvidia.com/mig-3g.20gb; request one of those"],
                     id="mig-mixed-whole-gpu"),
        pytest.param(pod(2, labels={"gpu-webhook.io/gpu-type": "a100-mig"}, resource="nvidia.com/mig-1g.5gb"),
                     snap("mig-mixed-1"), MIG_RULES, [], id="mig-mixed-slice-fits"),
        pytest.param(pod(1), snap("cpu-1"), POLICY,
                     ["no node in the cluster advertises nvidia.com/gpu in allocatable; check that its device plugin "
                      "runs"],
                     id="no-device-plugin"),
        pytest.param(pod(1, labels=TRAINING), snap("mig-single-1", "t4-1"), POLICY,
                     ["2 nodes advertise nvidia.com/gpu but none matches (mig-single-1: workload=training (node has "
                      "inference) | t4-1: gpu-type=a100 (node has t4), workload=training (node has inference)); pick "
                      "the class you meant with the class labels"],
                     id="selector-matches-none"),
        pytest.param(pod(1, labels=TRAINING), snap("a100-down"), POLICY,
                     ["the matching node a100-down is not Ready; wait for it, or pick another class"],
                     id="only-not-ready"),
        pytest.param(pod(1, labels=TRAINING),
                     snap(nodes=(dataclasses.replace(NODES["a100-1"],
                                                     taints=(Taint("nvidia.com/gpu", "present", "NoExecute"),)),)),
                     POLICY, ["the matching nodes carry taints the Pod does not tolerate (a100-1: "
                              "nvidia.com/gpu=present:NoExecute); add a toleration to the class"],
                     id="untolerated-taint"),
        pytest.param(pod(1, labels=TRAINING, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
                     snap(nodes=(dataclasses.replace(NODES["a100-1"],
                                                     taints=(Taint("nvidia.com/gpu", "present", "NoExecute"),)),)),
                     POLICY, [], id="own-toleration-counts"),
        pytest.param(pod(2, labels=TRAINING, affinity=ONLY_A100_2),
                     snap("a100-1", "a100-2"), POLICY, [], id="affinity-fits"),
        pytest.param(pod(6, labels=TRAINING, affinity=ONLY_A100_2),
                     snap("a100-1", "a100-2"), POLICY, ["offers 4 (a100-2; 1 node match)"], id="affinity-narrows"),
        pytest.param(pod(1), snap("t4-1", synced=False, reason="initial list of nodes pending"), POLICY,
                     ["[gpu-inventory-unavailable] the cluster inventory is not synced (initial list of nodes "
                      "pending): the checks against GPU nodes and runtime classes were skipped"], id="not-synced"),
        pytest.param(pod(0), snap("cpu-1"), POLICY, [], id="no-gpu-no-checks"),
    ],
)
def test_capacity(obj: dict[str, Any], snapshot: Snapshot, policy: Policy, expected: list[str]) -> None:
    verdict = judge(obj, snapshot, policy)
    found = inventory_findings(verdict)
    assert len(found) == len(expected), found
    for got, want in zip(found, expected, strict=True):
        assert want in got
    for warning in (f.render() for f in verdict.warnings):  # kubectl shows 120 characters: the fix among them
        if "; " in warning:
            assert sanitize_warning(warning).endswith(warning.rpartition("; ")[2]), warning


def test_never_schedulable_denies_and_drops_the_edits() -> None:
    verdict = judge(pod(6, labels=TRAINING), snap("a100-2"))
    assert not verdict.allowed and verdict.edits == ()


def test_enforcement_levels_apply_to_inventory_rules() -> None:
    relaxed = rules("  enforcement: {gpu-never-schedulable: warn, gpu-class-no-node: 'off'}\n")
    verdict = judge(pod(6, labels=TRAINING), snap("a100-2"), relaxed)
    assert verdict.allowed and [w.rule for w in verdict.warnings] == ["gpu-never-schedulable"]
    assert judge(pod(1), snap("cpu-1"), relaxed).warnings == ()


# --------------------------------------------------------------------------------------------- runtime class


def runtime_edit(verdict: Verdict) -> list[Any]:
    return [e.value for e in verdict.edits if e.key == "runtimeClassName"]


@pytest.mark.parametrize(
    ("policy", "runtime_classes", "injected", "expected"),
    [
        pytest.param(POLICY, "full", ["nvidia"], [], id="exists"),
        pytest.param(POLICY, {}, [], ['[gpu-runtime-class-missing] runtimeClassName nvidia was not set: RuntimeClass '
                                      '"nvidia" does not exist, and the API server would reject the Pod with: pod '
                                      'rejected: RuntimeClass "nvidia" not found'], id="missing"),
        pytest.param(SANDBOX_RULES, "full", [],
                     ["its scheduling.nodeSelector contradicts class workload=kata-t4,gpu-type=t4, and the API server "
                      "would reject the Pod with: conflict: runtimeClass.scheduling.nodeSelector[workload] = sandbox; "
                      "pod.spec.nodeSelector[workload] = inference"], id="conflict"),
    ],
)
def test_runtime_class(policy: Policy, runtime_classes: Any, injected: list[str], expected: list[str]) -> None:
    snapshot = snap("t4-1") if runtime_classes == "full" else snap("t4-1", runtime_classes=runtime_classes)
    obj = pod(1, labels={"gpu-webhook.io/workload": "kata-t4"} if policy is SANDBOX_RULES else None)
    verdict = judge(obj, snapshot, policy)
    assert runtime_edit(verdict) == injected
    found = inventory_findings(verdict)
    assert len(found) == len(expected) and all(w in g for g, w in zip(found, expected, strict=True)), found
    assert verdict.allowed
    assert runtime_edit(judge(obj, None, policy)), "without an inventory the default is always injected"


def test_runtime_class_scheduling_is_merged_before_the_capacity_check() -> None:
    node = dataclasses.replace(NODES["t4-1"], name="kata-1",
                               labels={**NODES["t4-1"].labels, "workload": "sandbox"},
                               taints=(*NODES["t4-1"].taints, Taint("sandbox", "", "NoSchedule")))
    verdict = judge(pod(1, labels={"gpu-webhook.io/workload": "sandbox"}), snap(nodes=(node,)), SANDBOX_RULES)
    assert inventory_findings(verdict) == [], "the RuntimeClass's toleration of the sandbox taint counts"
    assert runtime_edit(verdict) == ["kata-gpu"]


def test_runtime_class_is_not_judged_at_validate() -> None:
    verdict = judge(pod(1, runtimeClassName=None), snap("t4-1", runtime_classes={}), mode="validate")
    assert not any(f.rule == "gpu-runtime-class-missing" for f in verdict.warnings)


# --------------------------------------------------------------------------------------------- namespaces, DRA


def test_namespace_policy_by_labels_from_the_snapshot() -> None:
    policy = rules("""
  namespaceSelectors:
    research-teams:
      matchLabels: {team-type: research}
      defaults: {workload: training, gpu-type: a100}
""")
    obj = pod(1, namespace="ml-research")
    with_cluster = judge(obj, snap("a100-1"), policy)
    assert with_cluster.gpu_class == "workload=training,gpu-type=a100"
    assert judge(obj, None, policy).gpu_class == "workload=inference,gpu-type=t4", "no cluster: no labels"
    explicit = evaluate(policy, obj, Context("ml-research", namespace_labels={}, inventory=snap("a100-1")))
    assert explicit.gpu_class == "workload=inference,gpu-type=t4", "labels given by the caller win"


def dra_pod(template: str, namespace: str = "ml-research") -> dict[str, Any]:
    obj = pod(0, namespace=namespace)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    obj["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return obj


@pytest.mark.parametrize(
    ("obj", "gpu_class"),
    [
        pytest.param(dra_pod("single-gpu"), "workload=inference,gpu-type=t4", id="gpu-device-class"),
        pytest.param(dra_pod("any-gpu", "ml-serving"), "workload=inference,gpu-type=t4", id="first-available"),
        pytest.param(dra_pod("fast-nic"), None, id="other-device-class"),
        pytest.param(dra_pod("single-gpu", "ml-serving"), None, id="template-of-another-namespace"),
    ],
)
def test_dra_claims_make_a_gpu_pod(obj: dict[str, Any], gpu_class: str | None) -> None:
    verdict = judge(obj, snap("t4-1"))
    assert verdict.gpu_class == gpu_class and verdict.gpus == 0 and verdict.allowed
    selectors = {e.key: e.value for e in verdict.edits if e.path[-1:] == ("nodeSelector",)}
    assert selectors == ({"workload": "inference", "gpu-type": "t4"} if gpu_class else {})
    assert inventory_findings(verdict) == []


def test_dra_pod_without_inventory_is_unchanged() -> None:
    obj = dra_pod("single-gpu")
    assert judge(obj, None) == evaluate(POLICY, copy.deepcopy(obj), Context("ml-research"))
    assert judge(obj, None).edits == ()
    assert judge(obj, snap("t4-1", synced=False)).edits == (), "unknown templates: not a GPU Pod"


# --------------------------------------------------------------------------------------------- KEP-5004

# T4 nodes with no device plugin: their GPUs are a DRA driver's devices (the H200 fixture's shape, product T4).
DRA_ONLY = tuple(dataclasses.replace(NODES["t4-1"], name=f"t4-dra-{i}", allocatable={}) for i in (1, 2))
UNMAPPED = dra_load("deviceclass-gpu.nvidia.com.json")
MAPPING = {**UNMAPPED, "metadata": {"name": "gpu.nvidia.com", "creationTimestamp": "2026-11-02T10:00:00Z"},
           "spec": {**UNMAPPED["spec"], "extendedResourceName": "nvidia.com/gpu"}}


def dra_snap(*nodes: Node, slices: tuple[dict[str, Any], ...], classes: tuple[dict[str, Any], ...] = (MAPPING,),
             **changes: Any) -> Snapshot:
    """`nodes` and these DRA objects, both kinds listed (as from a server that serves them, however few)."""
    index = DraIndex()
    index.replace("resourceslices", map(slice_from_api, slices))
    index.replace("deviceclasses", map(device_class_from_api, classes))
    return snap(nodes=nodes, dra=index.view(), **changes)


IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
DRA_SLICES = (gpu_slice("t4-dra-1", T4, 2), gpu_slice("t4-dra-2", T4, 1))
ALL_NODES = gpu_slice("t4-dra-1", T4, 2, name="shared")
ALL_NODES["spec"] = {**{k: v for k, v in ALL_NODES["spec"].items() if k != "nodeName"}, "allNodes": True}


@pytest.mark.parametrize(
    ("obj", "snapshot", "expected"),
    [
        pytest.param(pod(2), dra_snap(*DRA_ONLY, slices=DRA_SLICES), [], id="served-by-dra"),
        pytest.param(pod(1, resource=IMPLICIT), dra_snap(*DRA_ONLY, slices=DRA_SLICES, classes=(UNMAPPED,)), [],
                     id="implicit-name"),
        pytest.param(pod(3, resource=IMPLICIT), dra_snap(*DRA_ONLY, slices=DRA_SLICES, classes=(UNMAPPED,)),
                     [f"[gpu-never-schedulable] the Pod asks for 3 {IMPLICIT} but the most any Ready node of class "
                      "workload=inference,gpu-type=t4 (nodeSelector gpu-type=t4, workload=inference) offers is 2 "
                      "(t4-dra-1: devices of DeviceClass gpu.nvidia.com, through DRA)"], id="implicit-name-too-many"),
        pytest.param(pod(3, resource=IMPLICIT), snap(nodes=DRA_ONLY), [], id="implicit-name-dra-not-known"),
        pytest.param(pod(1, resource=IMPLICIT), dra_snap(*DRA_ONLY, slices=(), classes=(UNMAPPED,)),
                     ["[gpu-class-no-node]"], id="implicit-name-no-devices"),
        pytest.param(pod(3), dra_snap(*DRA_ONLY, slices=DRA_SLICES),
                     ["[gpu-never-schedulable] the Pod asks for 3 nvidia.com/gpu but the most any Ready node of class "
                      "workload=inference,gpu-type=t4 (nodeSelector gpu-type=t4, workload=inference) offers is 2 "
                      "(t4-dra-1: devices of DeviceClass gpu.nvidia.com, through DRA): it would stay Pending (cannot "
                      "allocate all claims) forever; ask for at most 2 per Pod, or split the work across Pods"],
                     id="more-than-a-node-has"),
        pytest.param(pod(2), snap("t4-1", nodes=DRA_ONLY, dra=view_from_api(DRA_SLICES, (MAPPING,))), [],
                     id="device-plugin-node-too-small-dra-node-fits"),
        pytest.param(pod(2), dra_snap(*DRA_ONLY, slices=DRA_SLICES, classes=(UNMAPPED,)),
                     ["[gpu-class-no-node] class workload=inference,gpu-type=t4 (nodeSelector gpu-type=t4, "
                      "workload=inference) matches no Ready node that advertises nvidia.com/gpu, so the Pod would "
                      "stay Pending: no node in the cluster advertises nvidia.com/gpu in allocatable"],
                     id="class-maps-nothing"),
        pytest.param(pod(1), dra_snap(*DRA_ONLY, slices=()),
                     ["[gpu-class-no-node] class workload=inference,gpu-type=t4 (nodeSelector gpu-type=t4, "
                      "workload=inference) matches no Ready node that advertises nvidia.com/gpu or has devices of "
                      "DeviceClass gpu.nvidia.com (which serves nvidia.com/gpu through DRA), so the Pod would stay "
                      "Pending: no ResourceSlice of a node has a device of DeviceClass gpu.nvidia.com; check that the "
                      "DRA driver runs on the GPU nodes (kubectl get resourceslices)"],
                     id="no-slices"),
        pytest.param(pod(1, labels=TRAINING), dra_snap(*DRA_ONLY, slices=DRA_SLICES),
                     ["so the Pod would stay Pending: 2 node(s) have devices of DeviceClass gpu.nvidia.com but none "
                      "matches (t4-dra-1: gpu-type=a100 (node has t4), workload=training (node has inference) | "
                      "t4-dra-2: gpu-type=a100 (node has t4), workload=training (node has inference)); pick the class "
                      "you meant with the class labels"], id="devices-on-nodes-of-another-class"),
        pytest.param(pod(1), dra_snap(*(dataclasses.replace(n, ready=False) for n in DRA_ONLY), slices=DRA_SLICES),
                     ["the matching node(s) t4-dra-1, t4-dra-2 with devices of DeviceClass gpu.nvidia.com are not "
                      "Ready; wait for them"], id="dra-nodes-not-ready"),
        pytest.param(pod(1), dra_snap(*(dataclasses.replace(n, taints=(Taint("dedicated", "x", "NoSchedule"),))
                                        for n in DRA_ONLY), slices=DRA_SLICES),
                     ["the matching nodes carry taints the Pod does not tolerate (t4-dra-1: dedicated=x:NoSchedule | "
                      "t4-dra-2: dedicated=x:NoSchedule); add a toleration to the class"], id="dra-nodes-tainted"),
        pytest.param(pod(1), dra_snap(*(dataclasses.replace(n, allocatable={"nvidia.com/gpu": 1}) for n in DRA_ONLY),
                                      slices=(gpu_slice("t4-dra-1", T4, 4),)), [], id="device-plugin-node-fits"),
        pytest.param(pod(2), dra_snap(*(dataclasses.replace(n, allocatable={"nvidia.com/gpu": 1}) for n in DRA_ONLY),
                                      slices=(gpu_slice("t4-dra-1", T4, 4),)),
                     ["offers 1 (t4-dra-2; 2 nodes match)"], id="a-device-plugin-node-never-hands-it-to-dra"),
        pytest.param(pod(1), dra_snap(*DRA_ONLY, slices=(ALL_NODES,)), [], id="devices-of-no-one-node-no-decision"),
        pytest.param(pod(1), snap(nodes=DRA_ONLY, dra=view_from_api(DRA_SLICES, ())),
                     ["[gpu-class-no-node]"], id="device-classes-not-listed"),
    ],
)
def test_gpus_served_by_dra_through_the_class_extended_resource(obj: dict[str, Any], snapshot: Snapshot,
                                                                 expected: list[str]) -> None:
    """KEP-5004: a node without the resource in allocatable hands it to the DeviceClass that maps it, so its matching
    devices count for the capacity checks; a node with a device plugin for it never does."""
    found = inventory_findings(judge(obj, snapshot))
    assert len(found) == len(expected), found
    for got, want in zip(found, expected, strict=True):
        assert want in got


@pytest.mark.parametrize(
    ("classes", "serving"),
    [
        pytest.param([("a", "2026-01-01T00:00:00Z"), ("b", "2026-02-01T00:00:00Z")], "b", id="newest-wins"),
        pytest.param([("b", "2026-01-01T00:00:00Z"), ("a", "2026-01-01T00:00:00Z")], "a", id="tie-lower-name"),
        pytest.param([("a", ""), ("b", "2026-01-01T00:00:00Z")], "b", id="no-timestamp-is-oldest"),
        pytest.param([], None, id="none"),
    ],
)
def test_the_class_serving_an_extended_resource(classes: list[tuple[str, str]], serving: str | None) -> None:
    """As kube-scheduler's extended resource cache picks between classes mapping the same name."""
    objs = [{**UNMAPPED, "metadata": {"name": name, "creationTimestamp": created},
             "spec": {"extendedResourceName": "nvidia.com/gpu"}} for name, created in classes]
    found = view_from_api((), objs).serving("nvidia.com/gpu")
    assert (found.name if found else None) == serving


RECORDED = {"nodes.json": 0, "runtimeclasses.json": 1, "namespaces.json": 2, "resourceclaimtemplates-v1.json": 3}
OF_EACH_TYPE = ({"nvidia.com/gpu": 0}, [1, "a"], "x", 3, True, None)


def _value_paths(node: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [p for key, child in children for p in ((*path, key), *_value_paths(child, (*path, key)))]


@pytest.mark.parametrize("recorded", list(RECORDED))
def test_every_value_of_the_inventory_objects_retyped(recorded: str) -> None:
    """Each value of each recorded object, one of each JSON type: the snapshot still builds, and a GPU Pod and a
    DRA Pod are still judged over it (the inventory's objects come from the API server, but parse as anything)."""
    lists = [items(name) for name in RECORDED]
    at = RECORDED[recorded]
    gpu, claims = pod(1, labels=TRAINING), dra_pod("single-gpu")
    for i, obj in enumerate(lists[at]):
        for path in _value_paths(obj):
            for value in OF_EACH_TYPE:
                changed = copy.deepcopy(obj)
                parent: Any = changed
                for step in path[:-1]:
                    parent = parent[step]
                parent[path[-1]] = value
                objects = [*lists[at][:i], changed, *lists[at][i + 1:]]
                snapshot = inventory.snapshot_from_api(*(objects if n == at else lists[n] for n in range(4)))
                for judged in (gpu, claims):
                    assert isinstance(judge(copy.deepcopy(judged), snapshot), Verdict)
