"""What the policy engine (`webhook.policy.engine`) passes between its parts: the `Context` an object is admitted
in, the `Collector` of findings and edits, and the class a GPU Pod is given (`ChosenClass`, one `Pick` per axis)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from webhook.policy import inventory
from webhook.policy.claims import Claim
from webhook.policy.findings import Edit, Finding, Mode, Operation, Patch
from webhook.policy.inventory import Snapshot
from webhook.policy.rules import Axis, Contribution, Policy


class Context(NamedTuple):
    """Where an object is being admitted: the authoritative namespace, the operation, and which endpoint asks.

    `old_object` is the stored object on UPDATE: a workload whose pod template did not change is not
    re-judged, so scaling or relabelling an existing Deployment is never blocked by a newer rule.
    `namespace_labels` are the namespace's labels when the cluster is known (for `namespaceSelectors`).
    `inventory` is the live cluster (nodes, runtime classes, namespaces, claim templates) when the server
    watches it: GPU pod specs are then also checked against it. None (no cluster access): those checks are off.
    `claims` holds claim templates and ResourceClaims known without a cluster (the files `check` was given): with no
    `inventory`, a Pod's claims are read from it, and nothing else is.
    """

    namespace: str | None
    operation: Operation = "CREATE"
    mode: Mode = "mutate"
    old_object: Mapping[str, Any] | None = None
    namespace_labels: Mapping[str, str] | None = None
    inventory: Snapshot | None = None
    claims: Snapshot | None = None

    def pod_claims(self, policy: Policy, namespace: str, spec: Mapping[str, Any]) -> list[tuple[str, Claim]]:
        """A Pod's claims of GPU devices (`inventory.gpu_claim_templates`), from the cluster, then the given files."""
        if self.inventory is None and self.claims is None:
            return []  # the admission server without cluster awareness
        found: dict[str, Claim] = {}
        for source in (self.inventory, self.claims):
            if source is not None:
                for name, claim in inventory.gpu_claim_templates(policy, source, namespace, spec):
                    found.setdefault(name, claim)
        return list(found.items())


@dataclass
class Collector:
    """Findings, edits and the classes chosen, gathered while one object is evaluated."""

    policy: Policy
    findings: list[Finding] = field(default_factory=list)
    edits: list[Edit] = field(default_factory=list)
    classes: list[ChosenClass] = field(default_factory=list)
    # `edits` as a JSON Patch, when one memoised `class_edits.ClassChanges` made all of them unfiltered (shared
    # between reviews: read only); None: the caller builds the patch with `patch.operations`.
    patch: Patch | None = None

    def add(self, rule: str, message: str) -> None:
        level = self.policy.enforcement_of(rule)
        if level != "off":
            self.findings.append(Finding(rule, message, level))


class Pick(NamedTuple):
    """One axis's value, how it was chosen, and whether its nodeSelector is injected: not when the Pod's own
    selection already places it, nor when the live nodes show it would leave the Pod no node."""

    axis: Axis
    value: str
    how: str
    inject: bool = True
    defaulted: bool = False  # chosen by a default, not by the Pod's label, selection or resources


class ChosenClass(NamedTuple):
    """The class a GPU Pod runs in: one `Pick` per axis that contributes, its name, and the axes left out."""

    picks: tuple[Pick, ...]
    name: str  # `workload=inference,gpu-type=t4`, or "default" when the policy has no axes
    skipped: tuple[str, ...] = ()  # `gpu-type: left out: why`
    plan_key: str = ""  # the memo key of its plan: the name, and the axes whose placement is not injected

    @classmethod
    def of(cls, picks: Sequence[Pick], skipped: Sequence[str] = ()) -> ChosenClass:
        name = _class_name(tuple([(p.axis.name, p.value) for p in picks]))
        held = [p.axis.name for p in picks if not p.inject]
        return cls(tuple(picks), name, tuple(skipped), f"{name}/without:{','.join(held)}" if held else name)

    def contributions(self) -> list[tuple[str, Contribution, bool]]:
        """(source, contribution, whether its node placement is injected) per pick."""
        return [(f"{p.axis.name} {p.value}", p.axis.values[p.value], p.inject) for p in self.picks]

    def explain(self) -> list[str]:
        """How each axis was chosen or why it was left out, for `check` and `test`."""
        told = [f"{p.axis.name}={p.value} from the {p.how}" + ("" if p.inject else " (nodeSelector not added)")
                for p in self.picks]
        return told + list(self.skipped)


@lru_cache(maxsize=1024)
def _class_name(pairs: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{axis}={value}" for axis, value in pairs) or "default"
