"""`gpu-webhook audit`: what is already running, judged by the current (or a proposed) rule directory.

Pure: the objects come in as JSON (from `webhook.cluster.reads.read_workloads` and `read_claims`), the inventory as a
Snapshot. ResourceClaimTemplates and ResourceClaims are judged as at their create (a claim the controller or the
scheduler made for a Pod is skipped: its template or Pod speaks for it).
Each object goes through `checking.decide`, the admission server's own path, as a CREATE. Workloads are
judged by their template; their Pods are then skipped (a ReplicaSet a Deployment owns, a Job a CronJob
owns, a Pod any of those owns), so one broken template is reported once. Pods that have finished are
skipped. The answer to "who would this rule change break?" is a table grouped by namespace and rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from webhook.cluster.doctor import for_review
from webhook.policy import checking
from webhook.policy.claims import GENERATED_ANNOTATIONS
from webhook.policy.findings import Verdict
from webhook.policy.inventory import Snapshot
from webhook.policy.pods import mapping
from webhook.policy.rules import Policy

Json = Mapping[str, Any]
CONTROLLERS = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"})


@dataclass(frozen=True)
class Judged:
    namespace: str
    kind: str
    name: str
    verdict: Verdict

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {"namespace": self.namespace, "kind": self.kind, "name": self.name, "allowed": v.allowed,
                "class": v.gpu_class, "gpus": v.gpus,
                "violations": [{"rule": f.rule, "message": f.message} for f in v.violations],
                "warnings": [{"rule": f.rule, "message": f.message} for f in v.warnings]}


@dataclass(frozen=True)
class Result:
    policy_digest: str
    judged: tuple[Judged, ...]
    skipped: int
    inventory_synced: bool

    @property
    def denied(self) -> list[Judged]:
        return [j for j in self.judged if not j.verdict.allowed]

    def groups(self) -> list[tuple[str, str, str, list[Judged]]]:
        """(namespace, rule, effect, objects), denials first within a namespace."""
        table: dict[tuple[str, str, str], list[Judged]] = {}
        for j in self.judged:
            for f in (*j.verdict.violations, *j.verdict.warnings):
                found = table.setdefault((j.namespace, f.rule, f.enforcement), [])
                if j not in found:
                    found.append(j)
        order = sorted(table, key=lambda k: (k[0], k[2] != "deny", k[1]))
        return [(ns, rule, effect, table[(ns, rule, effect)]) for ns, rule, effect in order]

    def to_json(self) -> dict[str, Any]:
        return {
            "rules": self.policy_digest,
            "inventory": {"synced": self.inventory_synced},
            "summary": self.summary(),
            "groups": [{"namespace": ns, "rule": rule, "effect": effect, "objects": [j.ref for j in objs]}
                       for ns, rule, effect, objs in self.groups()],
            "objects": [j.to_json() for j in self.judged if j.verdict.rules or j.verdict.gpu_class],
        }

    def summary(self) -> dict[str, int]:
        gpu = sum(1 for j in self.judged if j.verdict.gpus or j.verdict.gpu_class)
        return {"objects": len(self.judged), "gpu": gpu,
                "denied": len(self.denied), "warned": sum(1 for j in self.judged if j.verdict.warnings),
                "skipped": self.skipped}


def controlled(obj: Json) -> bool:
    """Whether a workload we also judge creates this object (so its template speaks for it)."""
    refs = mapping(obj.get("metadata")).get("ownerReferences") or []
    return any(isinstance(r, dict) and r.get("controller") and r.get("kind") in CONTROLLERS for r in refs)


def generated(obj: Json) -> bool:
    """A ResourceClaim made for a Pod (from its template, or for an extended resource): judged through those."""
    annotations = mapping(mapping(obj.get("metadata")).get("annotations"))
    return obj.get("kind") == "ResourceClaim" and any(a in annotations for a in GENERATED_ANNOTATIONS)


def finished(obj: Json) -> bool:
    status = obj.get("status")
    return obj.get("kind") == "Pod" and isinstance(status, dict) and status.get("phase") in ("Succeeded", "Failed")


def audit(policy: Policy, objects: Sequence[Json], snapshot: Snapshot | None) -> Result:
    """Judge every object that is not owned by another judged one, as a CREATE in its namespace."""
    judged: list[Judged] = []
    skipped = 0
    for obj in objects:
        if controlled(obj) or finished(obj) or generated(obj):
            skipped += 1
            continue
        meta = mapping(obj.get("metadata"))
        namespace = str(meta.get("namespace") or "default")
        outcome = checking.decide(policy, for_review(obj), namespace, inventory=snapshot)
        judged.append(Judged(namespace, str(obj.get("kind")), str(meta.get("name") or "?"), outcome.verdict))
    judged.sort(key=lambda j: (j.namespace, j.kind, j.name))
    return Result(policy.digest, tuple(judged), skipped, snapshot.synced if snapshot is not None else False)


def render(result: Result, out: TextIO) -> None:
    """The human table: one row per namespace and rule, then each denial's message."""
    groups = result.groups()
    if groups:
        width = max(len("NAMESPACE"), *(len(g[0]) for g in groups))
        rule_width = max(len("RULE"), *(len(g[1]) for g in groups))
        out.write(f"{'NAMESPACE':<{width}}  {'RULE':<{rule_width}}  EFFECT  COUNT  OBJECTS\n")
        for namespace, rule, effect, objs in groups:
            names = ", ".join(j.ref for j in objs[:5]) + (f", ... (+{len(objs) - 5})" if len(objs) > 5 else "")
            out.write(f"{namespace:<{width}}  {rule:<{rule_width}}  {effect:<6}  {len(objs):>5}  {names}\n")
    denied = result.denied
    if denied:
        out.write("\nWould be denied:\n")
        for j in denied:
            for f in j.verdict.violations:
                out.write(f"  {j.namespace} {j.ref}: {f.render()}\n")
    s = result.summary()
    inventory = "synced" if result.inventory_synced else "not synced: inventory checks skipped"
    out.write(f"\n{s['objects']} object(s) judged ({s['gpu']} with GPUs, {s['skipped']} skipped as owned or "
              f"finished): {s['denied']} would be denied, {s['warned']} with warnings (rules {result.policy_digest}, "
              f"inventory {inventory})\n")
