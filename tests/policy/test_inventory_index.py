"""The node index (webhook.policy.node_index) answers exactly what a scan of every node answers.

The linear functions below are the inventory's decisions as they were before the index: they look at every
node of the snapshot. They are kept here, in the tests only, as the reference. Hypothesis draws random
snapshots (GFD-like labels, taints, readiness, whole, shared and MIG resources) and placements (class
nodeSelectors, the Pod's own selector and affinity, tolerations), and the indexed findings must equal the
linear ones: same rule ids, same messages, same nodes named. The index is also driven by random Node events,
and must then equal an index built from scratch, with views already handed out left unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.admission.loader import load_policy
from webhook.policy import inventory
from webhook.policy.engine import Context, evaluate
from webhook.policy.inventory import (
    MIG_PREFIX,
    PRODUCT_LABEL,
    SHARED_GPU,
    SHARED_SUFFIX,
    WHOLE_GPU,
    Finding,
    Node,
    Placement,
    Snapshot,
    Taint,
    selector_mismatches,
    selects,
    untolerated,
)
from webhook.policy.node_index import NodeIndex, Summary

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICY = load_policy()
SHOWN = 3


# --------------------------------------------------------------------------------------------- the reference


def linear_eligible(snapshot: Snapshot, where: Placement, resource: str) -> list[Node]:
    return [n for n in snapshot.nodes
            if n.ready and n.offers(resource) > 0 and selects(n, where) and not untolerated(n, where.tolerations)]


def linear_capacity_findings(snapshot: Snapshot, where: Placement, resource: str, count: int,
                             class_name: str, *, dra_only: bool = False) -> list[Finding]:
    """The device plugins' half (the snapshots here hold no DRA objects: a name only DRA serves gets no decision)."""
    if dra_only and not snapshot.dra.devices_known:
        return []
    eligible = linear_eligible(snapshot, where, resource)
    selector = where.describe_selector()
    if not eligible:
        why = linear_no_node_reason(snapshot, where, resource)
        return [("gpu-class-no-node",
                 f"class {class_name} (nodeSelector {selector}) matches no Ready node that advertises {resource}, "
                 f"so the Pod would stay Pending: {why}")]
    largest = max(eligible, key=lambda n: (n.offers(resource), n.name))
    most = largest.offers(resource)
    if count <= most:
        return []
    return [("gpu-never-schedulable",
             f"the Pod asks for {count} {resource} but the largest Ready node of class {class_name} "
             f"(nodeSelector {selector}) offers {most} ({largest.name}; {len(eligible)} node"
             f"{'s' if len(eligible) != 1 else ''} match): it would stay Pending with Insufficient {resource} "
             f"forever; ask for at most {most} per Pod, or split the work across Pods")]


def linear_no_node_reason(snapshot: Snapshot, where: Placement, resource: str) -> str:
    selected = [n for n in snapshot.nodes if selects(n, where)]
    offering = [n for n in snapshot.nodes if n.offers(resource) > 0]
    chosen = [n for n in offering if selects(n, where)]
    if not chosen:
        shared = linear_shared_instead(selected or snapshot.nodes if not offering else selected, resource)
        if shared:
            return shared
    if not offering:
        return (f"no node in the cluster advertises {resource} in allocatable; check that its device plugin runs "
                "on the GPU nodes")
    suffixed = linear_product_suffix_reason(offering, where.node_selector)
    if suffixed:
        return suffixed
    if not chosen:
        shown = " | ".join(f"{n.name}: {', '.join(selector_mismatches(n, where.node_selector)) or 'node affinity'}"
                           for n in offering[:SHOWN])
        plural = "s advertise" if len(offering) != 1 else " advertises"
        return (f"{len(offering)} node{plural} {resource} but none matches ({shown}); pick the class you meant with "
                "the class labels")
    blocked = [(n, taints) for n in chosen if (taints := untolerated(n, where.tolerations))]
    if len(blocked) == len(chosen):
        shown = " | ".join(f"{n.name}: {', '.join(map(str, taints))}" for n, taints in blocked[:SHOWN])
        return f"the matching nodes carry taints the Pod does not tolerate ({shown}); add a toleration to the class"
    not_ready = [n.name for n in chosen if not n.ready]
    many = len(not_ready) != 1
    return (f"the matching node{'s' if many else ''} {', '.join(not_ready[:SHOWN])} {'are' if many else 'is'} "
            "not Ready; wait for it, or pick another class with the class labels")


def linear_shared_instead(pool: Sequence[Node], resource: str) -> str | None:
    if resource != WHOLE_GPU:
        return None
    renamed = [n for n in pool if n.offers(SHARED_GPU) > 0]
    if renamed:
        names = ", ".join(n.name for n in renamed[:SHOWN])
        return (f"{names} advertise{'s' if len(renamed) == 1 else ''} {SHARED_GPU} instead: time-slicing or MPS "
                f"with renameByDefault renames the resource; request {SHARED_GPU}")
    mig = sorted({r for n in pool for r, v in n.allocatable.items() if r.startswith(MIG_PREFIX) and v > 0})
    if mig:
        return (f"no node advertises whole GPUs there: MIG mixed strategy splits them into {', '.join(mig)}; "
                f"request one of those")
    return None


def linear_product_suffix_reason(offering: Sequence[Node], selector: Mapping[str, str]) -> str | None:
    wanted = selector.get(PRODUCT_LABEL)
    if wanted is None:
        return None
    for node in offering:
        have = node.labels.get(PRODUCT_LABEL, "")
        if have == wanted + SHARED_SUFFIX:
            return (f"{node.name} has {PRODUCT_LABEL}={have}: time-slicing appends {SHARED_SUFFIX} to the product "
                    f"label; select {have} in the class")
        if have.startswith(wanted + "-MIG-"):
            return (f"{node.name} has {PRODUCT_LABEL}={have}: MIG single mode appends the profile to the product "
                    f"label; select {have} in the class")
    return None


def linear_gpu_nodes(snapshot: Snapshot, where: Placement, resources: Sequence[str],
                     narrowed_by: Mapping[str, str] | None = None, *, ready: bool = False) -> Summary:
    """The engine's former scan for `_spare_nodes`: the matched list, then `any(...)` over it."""
    matched = [n for n in snapshot.nodes if any(n.offers(r) > 0 for r in resources) and selects(n, where)
               and (n.ready or not ready)]
    if narrowed_by:
        matched = [n for n in matched if all(n.labels.get(k) == want for k, want in narrowed_by.items())]
    sliced = sum(1 for n in matched if (n.labels.get("nvidia.com/gpu.replicas", "1").isdigit()
                                           and int(n.labels.get("nvidia.com/gpu.replicas", "1")) > 1)
                 or n.labels.get("nvidia.com/gpu.sharing-strategy") in ("time-slicing", "mps"))
    return Summary(len(matched), tuple(n.name for n in matched[:SHOWN]), None, sliced)


# --------------------------------------------------------------------------------------------- strategies

PRODUCTS = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB-SHARED", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "Tesla-T4",
            "Tesla-T4-SHARED", "NVIDIA-H100-80GB-HBM3"]
LABELS = {"gpu-type": ["a100", "t4", "h100"], "workload": ["training", "inference"], PRODUCT_LABEL: PRODUCTS,
          "topology.kubernetes.io/zone": ["a", "b"], "nvidia.com/gpu.replicas": ["1", "4", "x"],
          "nvidia.com/gpu.sharing-strategy": ["none", "time-slicing", "mps"]}
TAINTS = [Taint("nvidia.com/gpu", "present", "NoSchedule"), Taint("dedicated", "ml", "NoExecute"),
          Taint("node.kubernetes.io/not-ready", "", "NoExecute"), Taint("soft", "", "PreferNoSchedule")]
RESOURCES = [WHOLE_GPU, SHARED_GPU, f"{MIG_PREFIX}1g.10gb", f"{MIG_PREFIX}3g.40gb"]
NAMES = [f"node-{i:02d}" for i in range(14)]
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
               {"key": "dedicated", "value": "ml"}, {"operator": "Exists"}]


@st.composite
def nodes(draw: st.DrawFn, name: str | None = None) -> Node:
    labels = {k: draw(st.sampled_from(v)) for k, v in LABELS.items() if draw(st.booleans())}
    allocatable = {r: draw(st.integers(0, 8)) for r in RESOURCES if draw(st.integers(0, 2)) > 0}
    return Node(name or draw(st.sampled_from(NAMES)), labels, tuple(draw(st.lists(st.sampled_from(TAINTS),
                                                                                     max_size=2, unique=True))),
                allocatable, draw(st.booleans() | st.just(True)), draw(st.booleans()))


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    drawn = draw(st.lists(nodes(), max_size=12, unique_by=lambda n: n.name))
    return inventory.snapshot_of(drawn, [], [], [])


@st.composite
def expressions(draw: st.DrawFn) -> dict[str, Any]:
    key = draw(st.sampled_from([*LABELS, "nvidia.com/gpu.replicas"]))
    op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]))
    if op in ("Gt", "Lt"):
        return {"key": "nvidia.com/gpu.replicas", "operator": op, "values": [str(draw(st.integers(0, 5)))]}
    values = draw(st.lists(st.sampled_from(LABELS.get(key, ["1"])), min_size=1, max_size=2))
    return {"key": key, "operator": op, **({"values": values} if op in ("In", "NotIn") else {})}


@st.composite
def affinities(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    terms = []
    for _ in range(draw(st.integers(1, 2))):
        term: dict[str, Any] = {"matchExpressions": draw(st.lists(expressions(), min_size=1, max_size=2))}
        if draw(st.integers(0, 3)) == 0:
            term["matchFields"] = [{"key": "metadata.name", "operator": "In",
                                    "values": draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3))}]
        terms.append(term)
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}


@st.composite
def placements(draw: st.DrawFn) -> Placement:
    selector = {k: draw(st.sampled_from(v)) for k, v in LABELS.items() if draw(st.integers(0, 3)) == 0}
    tolerations = tuple(draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2, unique_by=str)))
    return Placement(selector, tolerations, draw(affinities()), None, False)


# --------------------------------------------------------------------------------------------- properties


@SETTINGS
@given(snapshot=snapshots(), where=placements(), resource=st.sampled_from(RESOURCES), count=st.integers(1, 9),
       twice=st.booleans())
def test_capacity_findings_equal_the_linear_scan(snapshot: Snapshot, where: Placement, resource: str, count: int,
                                                 twice: bool) -> None:
    expected = linear_capacity_findings(snapshot, where, resource, count, "c")
    assert inventory.capacity_findings(snapshot, where, resource, count, "c") == expected
    if twice:  # the second answer comes from the view's memo
        assert inventory.capacity_findings(snapshot, where, resource, count, "c") == expected
    assert inventory.eligible_nodes(snapshot, where, resource) == linear_eligible(snapshot, where, resource)


@SETTINGS
@given(snapshot=snapshots(), where=placements(), resources=st.lists(st.sampled_from(RESOURCES), max_size=3),
       narrowed=st.none() | st.dictionaries(st.sampled_from(list(LABELS)), st.sampled_from(["a100", "t4", "a"]),
                                            max_size=2), ready=st.booleans())
def test_gpu_nodes_equal_the_linear_scan(snapshot: Snapshot, where: Placement, resources: list[str],
                                         narrowed: dict[str, str] | None, ready: bool) -> None:
    found = inventory.gpu_nodes(snapshot, where, resources, narrowed, ready=ready)
    expected = linear_gpu_nodes(snapshot, where, resources, narrowed, ready=ready)
    assert (found.count, found.first, found.time_sliced) == (expected.count, expected.first, expected.time_sliced)


GPU_PODS = st.fixed_dictionaries({
    "gpus": st.integers(1, 9),
    "resource": st.sampled_from([WHOLE_GPU, WHOLE_GPU, f"{MIG_PREFIX}1g.10gb"]),
    "labels": st.dictionaries(st.sampled_from(["gpu-webhook.io/workload", "gpu-webhook.io/gpu-type"]),
                              st.sampled_from(["training", "inference", "a100", "t4"]), max_size=2),
    "selector": st.dictionaries(st.sampled_from(["gpu-type", "workload", PRODUCT_LABEL]),
                                st.sampled_from(["a100", "t4", "training", "Tesla-T4"]), max_size=2),
    "affinity": affinities(),
})


def _pod(drawn: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda:12", "resources": {
        "limits": {drawn["resource"]: str(drawn["gpus"])}}}]}
    if drawn["selector"]:
        spec["nodeSelector"] = drawn["selector"]
    if drawn["affinity"]:
        spec["affinity"] = {"nodeAffinity": drawn["affinity"]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "labels": drawn["labels"]}, "spec": spec}


@SETTINGS
@given(snapshot=snapshots(), drawn=GPU_PODS, mode=st.sampled_from(["mutate", "validate"]))
def test_evaluate_equals_the_linear_engine(snapshot: Snapshot, drawn: Mapping[str, Any], mode: str) -> None:
    """The whole review, packaged rules: findings and edits with the index equal those with the scans."""
    obj = _pod(drawn)
    ctx = Context("ml", mode=mode, inventory=snapshot)  # type: ignore[arg-type]
    indexed = evaluate(POLICY, obj, ctx)
    with mock.patch.object(inventory, "capacity_findings", linear_capacity_findings), \
            mock.patch.object(inventory, "gpu_nodes", linear_gpu_nodes):
        linear = evaluate(POLICY, obj, ctx)
    assert [f.render() for f in (*indexed.violations, *indexed.warnings)] == \
        [f.render() for f in (*linear.violations, *linear.warnings)]
    assert indexed.edits == linear.edits


# --------------------------------------------------------------------------------------------- events

EVENTS = st.lists(st.one_of(st.tuples(st.just("put"), nodes()), st.tuples(st.just("remove"), st.sampled_from(NAMES)),
                            st.tuples(st.just("ask"), placements(), st.sampled_from(RESOURCES), st.booleans())),
                  max_size=40)


@SETTINGS
@given(start=snapshots(), events=EVENTS)
def test_events_keep_the_index_equal_to_a_fresh_build(start: Snapshot, events: list[tuple[Any, ...]]) -> None:
    """Random Node events after queries were asked: every tracked answer equals the answer on a fresh build of
    the same nodes, and a view handed out earlier still answers for its own moment."""
    index = NodeIndex.build(start.nodes)
    held: list[tuple[Snapshot, Placement, str, list[Finding]]] = []
    for event in events:
        if event[0] == "put":
            index.put(event[1])
        elif event[0] == "remove":
            index.remove(event[1])
        else:
            _, where, resource, ready = event
            snapshot = Snapshot(index.view().node_list)
            findings = inventory.capacity_findings(snapshot, where, resource, 3, "c")
            assert findings == linear_capacity_findings(snapshot, where, resource, 3, "c")
            found = inventory.gpu_nodes(snapshot, where, [resource, SHARED_GPU], ready=ready)
            expected = linear_gpu_nodes(snapshot, where, [resource, SHARED_GPU], ready=ready)
            assert (found.count, found.first, found.time_sliced) == (expected.count, expected.first,
                                                                     expected.time_sliced)
            held.append((snapshot, where, resource, findings))
            index.view()  # the writer starts tracking what the review asked
        current = Snapshot(index.view().node_list)
        fresh = inventory.snapshot_of(list(current.nodes), [], [], [])
        for query, summary in current.index.summaries.items():
            assert summary == fresh.index.summary(query), query
    for snapshot, where, resource, findings in held:
        snapshot.index.memo.clear()
        assert inventory.capacity_findings(snapshot, where, resource, 3, "c") == findings, "an old view changed"


def test_tracked_queries_survive_a_rebuild() -> None:
    """A relist builds a new index beside the old one, tracking the same queries from the start."""
    a100 = Node("a100-1", {"gpu-type": "a100"}, (), {WHOLE_GPU: 8})
    index = NodeIndex.build([a100])
    where = Placement({"gpu-type": "a100"}, (), None, None, False)
    snapshot = Snapshot(index.view().node_list)
    assert inventory.capacity_findings(snapshot, where, WHOLE_GPU, 4, "c") == []
    view = index.view()
    assert len(view.summaries) == 1, "the writer tracks the query the review asked"
    rebuilt = NodeIndex.build([dataclasses.replace(a100, allocatable={WHOLE_GPU: 2})], index.queries())
    [(query, summary)] = rebuilt.view().summaries.items()
    assert summary == Summary(1, ("a100-1",), (2, "a100-1"))
    assert view.summaries[query] == Summary(1, ("a100-1",), (8, "a100-1")), "the old view is unchanged"


def test_bulk_load_keeps_the_collector_off_until_the_build_is_frozen() -> None:
    """A relist's build runs with the cycle collector paused, and ends frozen out of its reach before the
    collector is back (another thread's next allocation would otherwise start a collection over all of it)."""
    import gc

    from webhook.policy.node_index import bulk_load

    assert gc.isenabled()
    seen: list[tuple[bool, int]] = []
    try:
        with bulk_load():
            seen.append((gc.isenabled(), gc.get_freeze_count()))
            built = [Node(f"n{i}", {"k": "v"}) for i in range(100)]
        assert gc.isenabled()
        assert seen == [(False, seen[0][1])]
        assert gc.get_freeze_count() >= seen[0][1] + len(built), "what was built is frozen"
    finally:
        gc.unfreeze()
