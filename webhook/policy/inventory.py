"""The decisions that need the cluster as the webhook sees it (the snapshots and their parsing are in
`webhook.policy.snapshot`).

Pure: decisions take a `Snapshot` and return
findings as (rule id, message). `webhook.cluster.kube` fills snapshots from the API server; the engine, `audit` and
`doctor` read them. Three decisions:

- never schedulable: the Pod asks for more of a GPU resource than the largest Ready node that matches its
  final nodeSelector (and node affinity) and tolerates its taints offers;
- class matches no GPU node: no such node advertises the resource at all, with the cause when it is
  recognisable (time-slicing's `-SHARED` product suffix, MIG single mode's profile suffix, the resource
  renamed to `nvidia.com/gpu.shared`, MIG mixed resources, taints, readiness);
- runtime class missing or conflicting: the default `runtimeClassName` is only injected when that
  RuntimeClass exists and its `scheduling.nodeSelector` agrees with the class.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.policy.claims import Claim
from webhook.policy.dra_extended import dra_offer, no_device_reason
from webhook.policy.findings import Edit
from webhook.policy.node_index import SHOWN, NodeView, Query, Summary, canonical
from webhook.policy.node_match import (
    HARD_EFFECTS,
    REQUIRED,
    TRANSIENT_TAINT_PREFIX,
    affinity_matches,
    label_matches,
    selector_mismatches,
    tolerates,
    untolerated,
    value_selects,
)
from webhook.policy.pods import Path, mapping
from webhook.policy.rules import Expression, Policy
from webhook.policy.snapshot import (
    FIRST_LIST_UNANSWERED,
    REFUSED_AT_START,
    ClaimTemplate,
    Namespace,
    Node,
    RuntimeClass,
    Snapshot,
    Taint,
    _list,
    _strings,
    claim_template_from_api,
    namespace_from_api,
    node_from_api,
    object_key,
    runtime_class_from_api,
    snapshot_from_api,
    snapshot_of,
)

# The cluster state (webhook.policy.snapshot), re-exported for the callers of the decisions; the module's own
# names are public too.
__all__ = [
    "FIRST_LIST_UNANSWERED",
    "HARD_EFFECTS",
    "REFUSED_AT_START",
    "REQUIRED",
    "TRANSIENT_TAINT_PREFIX",
    "ClaimTemplate",
    "Namespace",
    "Node",
    "RuntimeClass",
    "Snapshot",
    "Taint",
    "affinity_matches",
    "claim_template_from_api",
    "label_matches",
    "namespace_from_api",
    "node_from_api",
    "object_key",
    "runtime_class_from_api",
    "selector_mismatches",
    "snapshot_from_api",
    "snapshot_of",
    "tolerates",
    "untolerated",
    "value_selects",
]

PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
WHOLE_GPU = "nvidia.com/gpu"
SHARED_GPU = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = "-SHARED"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"  # GFD: none | time-slicing | mps
REPLICAS_LABEL = "nvidia.com/gpu.replicas"  # GFD: how many Pods share each GPU (1: whole GPUs)
SHARING_STRATEGIES = frozenset({"time-slicing", "mps"})
MIG_INFIX = "-MIG-"
_SHOWN = SHOWN  # nodes named in one message

Finding = tuple[str, str]  # (rule id, message)


# --------------------------------------------------------------------------------------------- scheduling


@dataclass(frozen=True)
class Placement:
    """What the scheduler will see of a pod spec once the class edits are applied."""

    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    node_affinity: Mapping[str, Any] | None
    runtime_class: str | None
    runtime_class_injected: bool

    def describe_selector(self) -> str:
        """`gpu-type=t4, workload=inference`, and the label keys its required node affinity constrains."""
        text = ", ".join(f"{k}={v}" for k, v in sorted(self.node_selector.items())) or "(none)"
        terms = _list(mapping(mapping(self.node_affinity).get(REQUIRED)).get("nodeSelectorTerms"))
        keys = dict.fromkeys(str(mapping(e).get("key"))
                             for t in terms for e in _list(mapping(t).get("matchExpressions")))
        return text + (f"; required node affinity on {', '.join(keys)}" if keys else "")


def placement(spec: Mapping[str, Any], spec_path: Path, edits: Sequence[Edit] = ()) -> Placement:
    """The pod spec's nodeSelector, tolerations, node affinity and runtime class after `edits`."""
    selector = _strings(spec.get("nodeSelector"))
    tolerations = [dict(t) for t in _list(spec.get("tolerations")) if isinstance(t, dict)]
    written = mapping(spec.get("affinity"))
    runtime = spec.get("runtimeClassName") if isinstance(spec.get("runtimeClassName"), str) else None
    injected = False
    affinity_path = (*spec_path, "affinity")
    edited: dict[str, Any] | None = None  # a copy of the Pod's affinity, made only when an edit changes it
    for edit in edits:
        if edit.path == (*spec_path, "nodeSelector") and edit.kind == "set" and edit.key:
            selector.setdefault(edit.key, str(edit.value))
        elif edit.path == (*spec_path, "tolerations") and edit.kind == "append" and isinstance(edit.value, dict):
            tolerations.append(dict(edit.value))
        elif edit.path[:len(affinity_path)] == affinity_path:
            edited = copy.deepcopy(dict(written)) if edited is None else edited
            _apply(edited, edit.path[len(affinity_path):], edit)
        elif edit.path == spec_path and edit.key == "runtimeClassName" and edit.kind == "set":
            runtime, injected = str(edit.value), True
    affinity = mapping((written if edited is None else edited).get("nodeAffinity")) or None
    return Placement(selector, tuple(tolerations), affinity, runtime or None, injected)


def _apply(root: dict[str, Any], path: Sequence[str | int], edit: Edit) -> None:
    """One edit below the Pod's `affinity`, as the JSON Patch will apply it (missing maps and lists created)."""
    node: Any = root
    for depth, step in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        elif isinstance(node, dict):
            node = node.setdefault(str(step), [] if last and edit.kind == "append" else {})
        else:
            return
    if edit.kind == "append" and isinstance(node, list):
        node.append(copy.deepcopy(edit.value))
    elif edit.kind == "set" and isinstance(node, dict) and edit.key is not None:
        node[edit.key] = copy.deepcopy(edit.value)


def with_expressions(node_affinity: Mapping[str, Any] | None, expressions: Sequence[Expression]) -> dict[str, Any]:
    """A nodeAffinity whose required terms all hold `expressions` too (one term of them when it has none).

    Kubernetes ANDs a Pod's nodeSelector with its required node affinity and ORs the nodeSelectorTerms, so an
    expression that must hold whatever else the Pod selects goes into every term. An empty term matches no
    node and stays empty."""
    merged = copy.deepcopy(dict(node_affinity or {}))
    required = merged.setdefault(REQUIRED, {})
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    wanted = [e.to_api() for e in expressions]
    if not isinstance(terms, list) or not terms:
        merged[REQUIRED] = {**(required if isinstance(required, dict) else {}),
                            "nodeSelectorTerms": [{"matchExpressions": wanted}]}
        return merged
    for term in terms:
        if isinstance(term, dict) and (term.get("matchExpressions") or term.get("matchFields")):
            have = term.setdefault("matchExpressions", [])
            have.extend(e for e in wanted if not any(same_expression(h, e) for h in have))
    return merged


def same_expression(have: Any, want: Mapping[str, Any]) -> bool:
    """Whether a Pod's expression already says `want` (values in any order)."""
    return (isinstance(have, dict) and have.get("key") == want["key"] and have.get("operator") == want["operator"]
            and sorted(map(str, _list(have.get("values")))) == sorted(want.get("values") or []))


def with_runtime_class(where: Placement, runtime_class: RuntimeClass | None) -> Placement:
    """The placement after the RuntimeClass admission plugin merged its scheduling (when it exists)."""
    if runtime_class is None:
        return where
    selector = {**runtime_class.node_selector, **where.node_selector}
    return Placement(selector, (*where.tolerations, *runtime_class.tolerations), where.node_affinity,
                     where.runtime_class, where.runtime_class_injected)


def selects(node: Node, where: Placement) -> bool:
    """The node's labels satisfy the nodeSelector and the required node affinity."""
    return (all(node.labels.get(k) == v for k, v in where.node_selector.items())
            and affinity_matches(node, where.node_affinity))


def eligible_nodes(snapshot: Snapshot, where: Placement, resource: str) -> list[Node]:
    """Ready nodes that the placement selects, whose hard taints it tolerates, and that offer `resource`
    (in name order; read from the nodes that offer `resource`, not from every node)."""
    admits = eligible_query(where, resource).admits
    view = snapshot.index
    return [view.nodes[name] for name in sorted(view.offers(resource)) if admits(view.nodes[name]) >= 0]


def eligible_query(where: Placement, resource: str) -> Query:
    """The index query for `eligible_nodes`: the offer of `resource` of an eligible node, else -1."""
    tolerations = where.tolerations

    def admits(node: Node) -> int:
        offer = node.allocatable.get(resource, 0)
        if offer <= 0 or not node.ready or not selects(node, where) or untolerated(node, tolerations):
            return -1
        return offer

    return Query("eligible", (resource,), tuple(sorted(where.node_selector.items())), canonical(where.node_affinity),
                 canonical(tolerations), admits, labels_read(where), time_sliced)


def matched_query(where: Placement, resources: Sequence[str], *, ready: bool = False) -> Query:
    """The index query for the nodes that offer any of `resources` and that the placement selects, whatever
    their taints (`ready`: and Ready; else whatever their readiness too)."""
    wanted = tuple(sorted(set(resources)))

    def admits(node: Node) -> int:
        if ready and not node.ready:
            return -1
        return 0 if any(node.allocatable.get(r, 0) > 0 for r in wanted) and selects(node, where) else -1

    return Query("ready" if ready else "matched", wanted, tuple(sorted(where.node_selector.items())),
                 canonical(where.node_affinity), "", admits, labels_read(where), time_sliced)


def time_sliced(node: Node) -> bool:
    """GPU Feature Discovery says the node shares each GPU between Pods (`sharing`): time-slicing or MPS, or
    `nvidia.com/gpu.replicas` above 1. The index counts these nodes per query."""
    return sharing(node) is not None


def labels_read(where: Placement) -> frozenset[str]:
    """The node labels a placement's nodeSelector and required node affinity look at."""
    keys = {*where.node_selector, REPLICAS_LABEL, SHARING_LABEL}  # and what `time_sliced` reads
    required = mapping(mapping(where.node_affinity).get("requiredDuringSchedulingIgnoredDuringExecution"))
    for term in _list(required.get("nodeSelectorTerms")):
        keys.update(str(mapping(e).get("key") or "") for e in _list(mapping(term).get("matchExpressions")))
    return frozenset(keys)


def gpu_nodes(snapshot: Snapshot, where: Placement, resources: Sequence[str],
              narrowed_by: Mapping[str, str] | None = None, *, ready: bool = False) -> Summary:
    """How many nodes offer any of `resources` and are selected by the placement (with `narrowed_by` added to
    its nodeSelector: none when the two disagree on a key), the first of them by name, and how many of them are
    time-sliced (`ready`: Ready nodes only)."""
    if narrowed_by:
        if any(where.node_selector.get(k, v) != v for k, v in narrowed_by.items()):
            return Summary()
        where = Placement({**where.node_selector, **narrowed_by}, where.tolerations, where.node_affinity,
                          where.runtime_class, where.runtime_class_injected)
    return snapshot.index.summary(matched_query(where, resources, ready=ready))


def hosting_nodes(snapshot: Snapshot, where: Placement, resources: Sequence[str]) -> Iterator[Node]:
    """Ready nodes that advertise one of `resources` and that the placement selects (taints aside: the class
    adds its tolerations), in name order, read from the nodes that offer them. The nodes a default must leave the
    Pod; `gpu_nodes(..., ready=True)` counts them without reading nodes."""
    view = snapshot.index
    names = sorted(set().union(*(view.offers(r) for r in resources)))
    return (n for n in map(view.nodes.__getitem__, names) if n.ready and selects(n, where))


def product_of(node: Node) -> str:
    """GPU feature discovery's product label of the node ("" when it has none)."""
    return node.labels.get(PRODUCT_LABEL, "")


def product_slug(product: str) -> str:
    """A class value name for a GFD product: `NVIDIA-H200-SHARED` -> `h200`, `Tesla-T4` -> `t4`."""
    name = product.split(MIG_INFIX)[0].removesuffix(SHARED_SUFFIX)
    for prefix in ("NVIDIA-", "Tesla-"):
        name = name.removeprefix(prefix)
    return name.lower().replace("_", "-") or "gpu"


def describe_products(nodes: Sequence[Node]) -> str:
    """The GPUs of `nodes` by GFD's product label: `NVIDIA-H200 (kit-gpu-node)`, or a note when unlabelled."""
    by_product: dict[str, list[str]] = {}
    for node in nodes:
        by_product.setdefault(product_of(node), []).append(node.name)
    parts = [f"{product or f'no {PRODUCT_LABEL} label'} ({', '.join(names[:_SHOWN])}"
             f"{f' and {len(names) - _SHOWN} more' if len(names) > _SHOWN else ''})"
             for product, names in sorted(by_product.items())]
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Assessment:
    """The inventory's findings for one pod spec, whether the runtimeClassName edit may stay, and the placement
    the scheduler will see (the RuntimeClass's scheduling merged in when it stays)."""

    final: Placement
    findings: tuple[Finding, ...] = ()
    keep_runtime_class: bool = True


def assess(snapshot: Snapshot, where: Placement, requests: Mapping[str, int], class_name: str,
           dra_served: frozenset[str] = frozenset()) -> Assessment:
    """All inventory checks of one GPU pod spec (`requests`: resource -> the Pod's effective count; `dra_served`:
    those of them the rules say DRA may serve, judged only where the DRA objects are known)."""
    findings: list[Finding] = []
    keep = True
    problem = runtime_class_problem(snapshot, where, class_name)
    if problem is not None:
        findings.append(("gpu-runtime-class-missing", problem))
        keep = False
    runtime = snapshot.runtime_classes.get(where.runtime_class or "") if keep else None
    final = with_runtime_class(where, runtime)
    for resource, count in sorted(requests.items()):
        if count > 0:
            findings.extend(capacity_findings(snapshot, final, resource, count, class_name,
                                              dra_only=resource in dra_served))
    return Assessment(final, tuple(findings), keep)


def runtime_class_problem(snapshot: Snapshot, where: Placement, class_name: str) -> str | None:
    """Why the injected runtimeClassName would make the API server reject the Pod, or None."""
    if not where.runtime_class_injected or where.runtime_class is None:
        return None
    name = where.runtime_class
    found = snapshot.runtime_classes.get(name)
    if found is None:
        return (f'runtimeClassName {name} was not set: RuntimeClass "{name}" does not exist, and the API server '
                f'would reject the Pod with: pod rejected: RuntimeClass "{name}" not found; create it (the GPU '
                f"Operator installs it) or remove runtimeClassName from the rules")
    for key, value in sorted(found.node_selector.items()):
        mine = where.node_selector.get(key)
        if mine is not None and mine != value:
            return (f"runtimeClassName {name} was not set: its scheduling.nodeSelector contradicts class "
                    f"{class_name}, and the API server would reject the Pod with: conflict: "
                    f"runtimeClass.scheduling.nodeSelector[{key}] = {value}; pod.spec.nodeSelector[{key}] = {mine}; "
                    f"align RuntimeClass {name} with the class nodeSelector")
    return None


def capacity_findings(snapshot: Snapshot, where: Placement, resource: str, count: int,
                      class_name: str, *, dra_only: bool = False) -> list[Finding]:
    """gpu-never-schedulable or gpu-class-no-node for one resource, or nothing when some node fits (or, for a
    resource the rules say DRA serves (`dra_only`), when the DRA objects are not known).

    Reads the index's answer for the placement (O(1) once the query is tracked); only a Pod that no device plugin's
    node fits asks the DRA devices of a DeviceClass that serves `resource` (KEP-5004: `webhook.policy.dra_extended`),
    and only a Pod that no node fits pays for the explanation (`no_node_reason`)."""
    eligible = snapshot.index.summary(eligible_query(where, resource))
    if eligible.largest is not None and count <= eligible.largest[0]:
        return []
    dra = dra_offer(snapshot.dra, resource, count, _dra_landing(snapshot, where, resource))
    if (dra is not None and dra.fits) or (dra is None and dra_only):
        return []
    selector = where.describe_selector()
    plugged = eligible.largest  # (offer, node): the device plugins' largest eligible node
    offered = dra.largest if dra is not None else None  # (devices, node): DRA's, where no plugin advertises it
    if plugged is not None and (offered is None or plugged[0] >= offered[0]):
        most, largest = plugged
        return [("gpu-never-schedulable",
                 f"the Pod asks for {count} {resource} but the largest Ready node of class {class_name} "
                 f"(nodeSelector {selector}) offers {most} ({largest}; {eligible.count} node"
                 f"{'s' if eligible.count != 1 else ''} match): it would stay Pending with Insufficient {resource} "
                 f"forever; ask for at most {most} per Pod, or split the work across Pods")]
    if dra is not None and offered is not None:
        most, node = offered
        return [("gpu-never-schedulable",
                 f"the Pod asks for {count} {resource} but the most any Ready node of class {class_name} "
                 f"(nodeSelector {selector}) offers is {most} ({node}: devices of DeviceClass {dra.device_class}, "
                 f"through DRA): it would stay Pending (cannot allocate all claims) forever; ask for at most "
                 f"{most} per Pod, or split the work across Pods")]
    served = (f" or has devices of DeviceClass {dra.device_class} (which serves {resource} through DRA)"
              if dra is not None else "")
    why = (no_node_reason(snapshot, where, resource) if dra is None or snapshot.index.offers(resource) else
           no_device_reason(snapshot.dra, resource, dra.device_class, snapshot.index.nodes,
                            lambda node: selects(node, where), where.node_selector, where.tolerations))
    return [("gpu-class-no-node",
             f"class {class_name} (nodeSelector {selector}) matches no Ready node that advertises {resource}{served}, "
             f"so the Pod would stay Pending: {why}")]


def _dra_landing(snapshot: Snapshot, where: Placement, resource: str) -> Callable[[str], bool]:
    """Whether a node is one where kube-scheduler hands `resource` to DRA and the Pod may land: Ready, selected,
    its hard taints tolerated, and no device plugin advertising `resource` there (`shouldDelegateResourceToDRA`)."""
    nodes, tolerations = snapshot.index.nodes, where.tolerations

    def may_land(name: str) -> bool:
        node = nodes.get(name)
        return (node is not None and node.allocatable.get(resource, 0) <= 0 and node.ready and selects(node, where)
                and not untolerated(node, tolerations))
    return may_land


def no_node_reason(snapshot: Snapshot, where: Placement, resource: str) -> str:
    """Why no node fits, in the words of the most likely cause.

    Looks only at the nodes that offer `resource`, `nvidia.com/gpu.shared` or a MIG resource (once per
    snapshot and placement), except in one case: when no node offers `resource` and the shared or MIG nodes
    are not selected, whether any node at all is selected decides where to look (a scan that stops at the
    first selected node)."""
    view = snapshot.index
    key = ("why", resource, tuple(sorted(where.node_selector.items())), canonical(where.node_affinity),
           canonical(where.tolerations))
    found = view.memo.get(key)
    if found is None:
        found = view.memo[key] = _no_node_reason(view, where, resource)
    return found


def _no_node_reason(view: NodeView, where: Placement, resource: str) -> str:
    nodes = view.nodes
    offering = view.offers(resource)
    chosen = sorted((nodes[name] for name in offering if selects(nodes[name], where)), key=lambda n: n.name)
    if not chosen:
        shared = _shared_instead(view, where, resource, restricted=bool(offering))
        if shared:
            return shared
    if not offering:
        return (f"no node in the cluster advertises {resource} in allocatable; check that its device plugin runs "
                "on the GPU nodes")
    suffixed = _product_suffix_reason([nodes[name] for name in offering], where.node_selector)
    if suffixed:
        return suffixed
    if not chosen:
        first = [nodes[name] for name in view.first_names(offering)]
        shown = " | ".join(f"{n.name}: {', '.join(selector_mismatches(n, where.node_selector)) or 'node affinity'}"
                           for n in first)
        plural = "s advertise" if len(offering) != 1 else " advertises"
        return (f"{len(offering)} node{plural} {resource} but none matches ({shown}); pick the class you meant with "
                "the class labels")
    blocked = [(n, taints) for n in chosen if (taints := untolerated(n, where.tolerations))]
    if len(blocked) == len(chosen):
        shown = " | ".join(f"{n.name}: {', '.join(map(str, taints))}" for n, taints in blocked[:_SHOWN])
        return f"the matching nodes carry taints the Pod does not tolerate ({shown}); add a toleration to the class"
    not_ready = [n.name for n in chosen if not n.ready]
    many = len(not_ready) != 1
    return (f"the matching node{'s' if many else ''} {', '.join(not_ready[:_SHOWN])} {'are' if many else 'is'} "
            "not Ready; wait for it, or pick another class with the class labels")


def _shared_instead(view: NodeView, where: Placement, resource: str, *, restricted: bool) -> str | None:
    """Whole GPUs asked for where the device plugin advertises them renamed (sharing) or split (MIG mixed).

    Among the selected nodes; when none is selected and no node offers `resource` (`restricted` False), among
    all nodes."""
    if resource != WHOLE_GPU:
        return None
    nodes = view.nodes
    pool: Callable[[str], bool] = lambda name: selects(nodes[name], where)  # noqa: E731
    if not restricted and not any(selects(n, where) for n in nodes.values()):
        pool = lambda name: True  # noqa: E731
    renamed = [name for name in view.offers(SHARED_GPU) if pool(name)]
    if renamed:
        return _renamed(sorted(renamed))
    mig = sorted(r for r, offers in view.offering.items()
                 if r.startswith(MIG_PREFIX) and any(pool(name) for name in offers))
    if mig:
        return (f"no node advertises whole GPUs there: MIG mixed strategy splits them into {', '.join(mig)}; "
                f"request one of those")
    return None


def _renamed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return (f"{shown} advertise{'s' if len(names) == 1 else ''} {SHARED_GPU} instead: time-slicing or MPS with "
            f"renameByDefault renames the resource; request {SHARED_GPU}")


def _product_suffix_reason(offering: Iterable[Node], selector: Mapping[str, str]) -> str | None:
    """The selector names a GPU product that the nodes carry only with a sharing or MIG suffix (the first such
    node by name)."""
    wanted = selector.get(PRODUCT_LABEL)
    if wanted is None:
        return None
    suffixed = [n for n in offering if n.labels.get(PRODUCT_LABEL, "") == wanted + SHARED_SUFFIX
                or n.labels.get(PRODUCT_LABEL, "").startswith(wanted + MIG_INFIX)]
    if not suffixed:
        return None
    node = min(suffixed, key=lambda n: n.name)
    have = node.labels.get(PRODUCT_LABEL, "")
    if have == wanted + SHARED_SUFFIX:
        return (f"{node.name} has {PRODUCT_LABEL}={have}: time-slicing appends {SHARED_SUFFIX} to the product "
                f"label; select {have} in the class")
    return (f"{node.name} has {PRODUCT_LABEL}={have}: MIG single mode appends the profile to the product "
            f"label; select {have} in the class")


def sharing(node: Node) -> str | None:
    """How GPU feature discovery says the node shares each GPU (`time-slicing, nvidia.com/gpu.replicas=4`), or None
    for whole GPUs. The labels describe `nvidia.com/gpu` and, renamed, `nvidia.com/gpu.shared` alike."""
    strategy = node.labels.get(SHARING_LABEL, "")
    raw = node.labels.get(REPLICAS_LABEL, "")
    replicas = int(raw) if raw.isdigit() else 1
    if strategy not in SHARING_STRATEGIES and replicas <= 1:
        return None
    return ", ".join(part for part in (strategy if strategy in SHARING_STRATEGIES else "",
                                       f"{REPLICAS_LABEL}={raw}" if replicas > 1 else "") if part)


def time_sliced_findings(snapshot: Snapshot, where: Placement, resource: str, count: int,
                         containers: Sequence[tuple[str, int]]) -> list[Finding]:
    """gpu-time-sliced-max: a container asks for more than 1 of a GPU resource while every node the Pod can land
    on shares its GPUs (time-slicing or MPS). Those nodes are the eligible ones (Ready, selected, tolerated,
    advertising the resource) that can hold the Pod's `count`: the scheduler binds it to no other, and when one
    of them has whole GPUs the Pod can run there. `containers`: (where, count) of each container."""
    over = [(at, n) for at, n in containers if n > 1]
    if resource not in (WHOLE_GPU, SHARED_GPU) or not over:
        return []
    if not snapshot.index.summary(eligible_query(where, resource)).time_sliced:
        return []  # no eligible node shares its GPUs: the usual case, answered by the index
    landing = [n for n in eligible_nodes(snapshot, where, resource) if n.offers(resource) >= count]
    shared = [(n, how) for n in landing if (how := sharing(n)) is not None]
    if not landing or len(shared) != len(landing):
        return []
    nodes = " | ".join(f"{n.name}: {how}" for n, how in shared[:_SHOWN])
    return [("gpu-time-sliced-max",
             f"{at}: asks for {n} {resource}, but every node the Pod can land on shares its GPUs ({nodes}): each "
             f"{resource} there is a replica of a GPU, so {n} replicas give the container no more than 1 does, and "
             f"a device plugin with failRequestsGreaterThanOne makes the kubelet fail the Pod "
             f"(UnexpectedAdmissionError: maximum request size for shared resources is 1); ask for 1, or pick a "
             f"class of whole GPUs")
            for at, n in over]


# --------------------------------------------------------------------------------------------- DRA


def gpu_claims(policy: Policy, snapshot: Snapshot, namespace: str, spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The Pod's resource claims whose template, or ResourceClaim by name, uses a GPU DeviceClass."""
    return tuple(f"{name} ({claim.kind} {claim.name}: {', '.join(dict.fromkeys(a.device_class for a in asks))})"
                 for name, claim in gpu_claim_templates(policy, snapshot, namespace, spec)
                 if (asks := claim.gpu_asks(policy)))


def gpu_claim_templates(policy: Policy, snapshot: Snapshot, namespace: str,
                        spec: Mapping[str, Any]) -> list[tuple[str, Claim]]:
    """(the Pod's claim name, what it names) for each of the Pod's claims whose ResourceClaimTemplate, or
    ResourceClaim by name (`resourceClaimName`, from the DRA inventory), asks for GPU devices."""
    if not policy.gpu_device_classes or not snapshot.synced:
        return []
    found: list[tuple[str, Claim]] = []
    for claim in map(mapping, _list(spec.get("resourceClaims"))):
        source = mapping(claim.get("source"))  # before v1.28: the names under `source`
        template_name = claim.get("resourceClaimTemplateName") or source.get("resourceClaimTemplateName")
        claim_name = claim.get("resourceClaimName") or source.get("resourceClaimName")
        template = snapshot.claim_templates.get((namespace, str(template_name))) if template_name else None
        named = snapshot.dra.claim(namespace, claim_name) if isinstance(claim_name, str) else None
        parsed = template.claim if template is not None else named.as_claim() if named is not None else None
        if parsed is not None and parsed.gpu_asks(policy):
            found.append((str(claim.get("name")), parsed))
    return found
