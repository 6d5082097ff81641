"""GPUs asked for as an extended resource and served by DRA (KEP-5004, beta and on by default in 1.36): what the
devices of the DeviceClass that maps the resource offer a Pod, node by node, as kube-scheduler counts them.

A DeviceClass with `spec.extendedResourceName: nvidia.com/gpu` (NVIDIA's DRA driver's chart sets it on
`gpu.nvidia.com`) lets a plain Pod (`limits: nvidia.com/gpu: 1`) run on a node where no device plugin advertises
the name: kube-scheduler's NodeResourcesFit leaves the resource to the DynamicResources plugin on every node whose
allocatable holds none of it (`shouldDelegateResourceToDRA`, pkg/scheduler/framework/plugins/noderesources/fit.go),
and that plugin allocates the Pod's count from the class's devices on the node, with the class's selectors only.
So the inventory decisions (`webhook.policy.inventory`) count, besides the device plugins' allocatable, the
matching devices of such nodes; without this a cluster whose GPUs are all handed out by DRA would have every plain
GPU Pod refused as never schedulable.

Pure: reads a `DraView`; which nodes the Pod may land on is the caller's predicate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.policy.device_selectors import DeviceQuery, query_of
from webhook.policy.dra_inventory import SHOWN, DraView
from webhook.policy.node_match import selector_mismatches, untolerated
from webhook.policy.snapshot import Node


@dataclass(frozen=True)
class DraOffer:
    """What the devices of `device_class` offer a Pod asking for `count` of an extended resource it serves.

    `fits`: some node the Pod may land on has `count` matching devices (True as well when no decision can be made:
    a selector fails on a device, or matching devices are not local to one node); `largest`: the most matching
    devices on one such node and the node (None when none has any)."""

    device_class: str
    fits: bool
    largest: tuple[int, str] | None = None


def _served(view: DraView, resource: str) -> tuple[str, DeviceQuery | None] | None:
    """The DeviceClass that serves `resource` and the query of its selectors (None when one does not compile); None
    when no class serves it, or the ResourceSlices and DeviceClasses are not known (a cluster without DRA, or an
    identity that may not list them)."""
    served = view.serving(resource) if view.devices_known else None
    return (served.name, query_of(served.selectors)) if served is not None else None


def dra_offer(view: DraView, resource: str, count: int, may_land: Callable[[str], bool]) -> DraOffer | None:
    """What DRA offers for `count` of `resource` on the nodes `may_land` admits (Ready, selected, tolerated, and not
    advertising `resource` in allocatable); None when DRA does not serve it (`_served`)."""
    served = _served(view, resource)
    if served is None:
        return None
    device_class, query = served
    groups = view.nodes_by_count(query) if query is not None else None
    if groups is None:
        return DraOffer(device_class, True)  # undecided: the webhook never denies on it
    for have, nodes in groups:  # most devices first
        if "" in nodes:  # devices not local to one node (nodeSelector, allNodes): which nodes get them is not read
            return DraOffer(device_class, True)
        if have >= count:
            if any(map(may_land, nodes)):
                return DraOffer(device_class, True)
            continue
        landing = min(filter(may_land, nodes), default=None)  # only a Pod that fits nowhere pays for the name
        if landing is not None:
            return DraOffer(device_class, False, (have, landing))
    return DraOffer(device_class, False)


def served_devices(view: DraView, resource: str) -> tuple[str, dict[str, int]] | None:
    """The DeviceClass that serves `resource` through DRA and, per node, how many of its devices match its selectors
    there; None when DRA does not serve it (`_served`), when a selector fails on a device, or when no node has one.
    For `doctor` and the explanations, which name the nodes; a review asks `dra_offer`."""
    served = _served(view, resource)
    groups = view.nodes_by_count(served[1]) if served is not None and served[1] is not None else None
    per_node = {node: have for have, nodes in groups or () for node in nodes if node}
    return (served[0], per_node) if served is not None and per_node else None


def no_device_reason(view: DraView, resource: str, device_class: str, nodes: Mapping[str, Node],
                     selects: Callable[[Node], bool], node_selector: Mapping[str, str],
                     tolerations: Sequence[Mapping[str, Any]]) -> str:
    """Why no node the Pod may land on has a device of `device_class` (which serves `resource`) where no device
    plugin advertises `resource` at all, in the words of the most likely cause, as
    `webhook.policy.inventory.no_node_reason` says it for the device plugins' nodes."""
    served = served_devices(view, resource)
    having = sorted(name for name in (served[1] if served else ()) if name in nodes)
    if not having:
        return (f"no ResourceSlice of a node has a device of DeviceClass {device_class}; check that the DRA driver "
                "runs on the GPU nodes (kubectl get resourceslices)")
    chosen = [nodes[name] for name in having if selects(nodes[name])]
    if not chosen:
        shown = " | ".join(f"{name}: {', '.join(selector_mismatches(nodes[name], node_selector)) or 'node affinity'}"
                           for name in having[:SHOWN])
        return (f"{len(having)} node(s) have devices of DeviceClass {device_class} but none matches ({shown}); pick "
                "the class you meant with the class labels")
    blocked = [(n, taints) for n in chosen if (taints := untolerated(n, tolerations))]
    if len(blocked) == len(chosen):
        shown = " | ".join(f"{n.name}: {', '.join(map(str, taints))}" for n, taints in blocked[:SHOWN])
        return f"the matching nodes carry taints the Pod does not tolerate ({shown}); add a toleration to the class"
    not_ready = [n.name for n in chosen if not n.ready]
    return (f"the matching node(s) {', '.join(not_ready[:SHOWN])} with devices of DeviceClass {device_class} are "
            "not Ready; wait for them, or pick another class with the class labels")
