"""What the texts the kubelet, the container runtime and the scheduler write about a GPU Pod mean, for
`gpu-webhook doctor` (`webhook.cluster.doctor`): `EXPLANATIONS`, a table of real texts (pattern -> meaning and fix),
and the `Clues` a meaning may consult (what the nodes the Pod can land on advertise). Add a row when a new real text
turns up.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from webhook.policy.inventory import Node

Status = Literal["ok", "info", "warn", "fail"]


@dataclass(frozen=True)
class Clues:
    """What an explanation may consult beyond the text: how much of each GPU resource the nodes the Pod can land
    on advertise (Ready, selected, tolerated, not cordoned: the nodes the scheduler weighs for it), in all and on
    the largest of them, and how much the Pod asks for. Nodes the Pod cannot land on do not count: a fleet of
    working A100 nodes says nothing about the T4 node whose plugin stopped."""

    advertised: Mapping[str, int]
    largest: Mapping[str, int] = dataclasses.field(default_factory=dict)
    asks: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, candidates: Sequence[Node], asks: Mapping[str, int]) -> Clues:
        """From the nodes the Pod can land on (`_why_not` finds nothing against them)."""
        total: dict[str, int] = {}
        largest: dict[str, int] = {}
        for node in candidates:
            for resource, count in node.allocatable.items():
                total[resource] = total.get(resource, 0) + count
                largest[resource] = max(largest.get(resource, 0), count)
        return cls(total, largest, dict(asks))


@dataclass(frozen=True)
class Explanation:
    """A text the kubelet, the scheduler or the container runtime writes (a regular expression with named
    groups), and what it means: `meaning` gets the groups and the clues, and says what to do."""

    name: str
    pattern: re.Pattern[str]
    status: Status
    meaning: Callable[[Mapping[str, str], Clues], str]


def _shared_replicas(groups: Mapping[str, str], clues: Clues) -> str:
    return (f"the kubelet refused it: its node shares each GPU (time-slicing), the device plugin hands a container "
            f"at most 1 replica, and a container asked for {groups['found']}; ask for 1 {groups['resource']}, or use "
            "a class of whole GPUs (the webhook's gpu-time-sliced-max refuses this at admission)")


def _cdi(groups: Mapping[str, str], clues: Clues) -> str:
    return (f"the container runtime could not inject the CDI device {groups['devices']}: the node's CDI spec "
            "(/etc/cdi or /var/run/cdi) has no such device; run `nvidia-ctk cdi generate --output=/var/run/cdi/"
            "nvidia.yaml` on the node (after a driver change too), or check the GPU Operator's CDI setup "
            "(cdi.enabled)")


def _no_handler(groups: Mapping[str, str], clues: Clues) -> str:
    handler = groups["handler"]
    return (f"containerd on the node has no runtime handler \"{handler}\" (the RuntimeClass's handler), so no Pod "
            f"sandbox of this RuntimeClass can start there; configure it (`nvidia-ctk runtime configure "
            f"--runtime=containerd`, or the GPU Operator's toolkit, adds it) and restart containerd, or keep such Pods "
            f"off that node with the RuntimeClass's scheduling.nodeSelector")


def _insufficient(groups: Mapping[str, str], clues: Clues) -> str:
    resource = groups["resource"]
    if not clues.advertised.get(resource):
        return (f"the scheduler found no node with {resource}: none of the nodes the Pod can land on advertises it, "
                "so the device plugin is not running (or not registered) there; start it on those nodes (see "
                "Device plugin and Matching nodes)")
    asked, largest = clues.asks.get(resource, 0), clues.largest.get(resource, 0)
    if asked > largest:
        return (f"the scheduler found no node with enough {resource}: the Pod asks for {asked}, more than any node "
                f"it can land on has ({largest}); ask for at most {largest}, or choose nodes with more GPUs (see "
                "Matching nodes)")
    return (f"the scheduler found no node with {resource} free: the GPUs of the nodes the Pod can land on are in "
            "use (it waits until one is released, or until the cluster grows); see Matching nodes for what is free")


def _claims(groups: Mapping[str, str], clues: Clues) -> str:
    return ("the scheduler found no node whose DRA devices satisfy the Pod's claims (kube-scheduler's \"cannot "
            "allocate all claims\"); see DRA devices for which request and selector, and change the claim's "
            "selector or class")


def _selector(groups: Mapping[str, str], clues: Clues) -> str:
    return ("the scheduler found no node with the labels the Pod's nodeSelector or node affinity asks for (a class "
            "value no node carries?); see Matching nodes, and label the nodes or pick a class they have")


def _webhook_denied(groups: Mapping[str, str], clues: Clues) -> str:
    return "the owner could not create Pods: an admission webhook denied them (see the message)"


def _kubelet_admission(groups: Mapping[str, str], clues: Clues) -> str:
    return ("the kubelet refused the Pod at admission (device plugin allocation failed); read the message, fix "
            "the request, and re-create the Pod")


SEVERITY: tuple[Status, ...] = ("fail", "warn", "info", "ok")
# Real texts, most specific first. Sources: the kubelet's UnexpectedAdmissionError with NVIDIA's device plugin
# (tests/data/real-h200), nvidia-container-runtime in CDI mode, containerd's CRI plugin
# (`failed to get sandbox runtime: %w` around `no runtime for %q is configured`) and the scheduler's
# FailedScheduling messages.
EXPLANATIONS: tuple[Explanation, ...] = (
    Explanation("shared-replicas", re.compile(
        r'invalid allocation request for "(?P<resource>[^"]+)": invalid request: maximum request size for shared '
        r"resources is 1; found (?P<found>\d+)"), "fail", _shared_replicas),
    Explanation("cdi-unresolvable", re.compile(
        r"failed to inject CDI devices: unresolvable CDI devices (?P<devices>[^\s:,;]+)"), "fail", _cdi),
    Explanation("runtime-handler", re.compile(
        r'failed to get sandbox runtime: no runtime for "(?P<handler>[^"]+)" is configured'), "fail", _no_handler),
    Explanation("admission-webhook", re.compile(r"FailedCreate: .*admission webhook"), "warn", _webhook_denied),
    Explanation("dra-claims", re.compile(r"\d+ cannot allocate all claims"), "warn", _claims),
    Explanation("insufficient", re.compile(r"\d+ Insufficient (?P<resource>[\w./-]+?)\.?(?:[\s,]|$)"), "warn",
                _insufficient),
    Explanation("selector", re.compile(r"didn't match Pod's node affinity/selector"), "warn", _selector),
    Explanation("kubelet-admission", re.compile(r"UnexpectedAdmissionError"), "fail", _kubelet_admission),
)


def explain(text: str, clues: Clues) -> tuple[Status, str] | None:
    """The first explanation whose pattern the text matches: (status, what it means and what to do)."""
    for explanation in EXPLANATIONS:
        match = explanation.pattern.search(text)
        if match is not None:
            return explanation.status, explanation.meaning(match.groupdict(), clues)
    return None
