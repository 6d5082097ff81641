"""The memo of what a class adds to a pod spec (`class_edits.class_changes`): for every shape of Pod below, the
edits, the JSON Patch and its encoding the engine hands over with a warm memo (filled by all the other shapes
first) are those made without the memo; the same shape twice shares one entry; nothing the webhook does with a
memoised patch (the server's answer, `check`'s patched object) changes it."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from webhook.admission.app import AdmissionServer, create_app, server_of
from webhook.admission.loader import read_sources
from webhook.admission.settings import Settings
from webhook.policy import checks, class_edits, pods
from webhook.policy.checking import decide
from webhook.policy.chosen import Collector
from webhook.policy.class_choice import choose_class
from webhook.policy.engine import Context, evaluate
from webhook.policy.findings import Verdict
from webhook.policy.patch import encode, operations
from webhook.policy.rules import Policy, parse_sources

# A class axis whose values set every field a class can set, and one that places by match expressions (whose
# edits read the whole node affinity: never memoised).
TIER = """apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata: {name: tier}
spec:
  classes:
    axes:
      tier:
        label: gpu-webhook.io/tier
        values:
          batch:
            priorityClassName: batch-low
            schedulerName: volcano
            labels: {example.com/tier: batch}
            annotations: {example.com/preemptible: "true"}
            affinity:
              nodeAffinity:
                preferredDuringSchedulingIgnoredDuringExecution:
                  - {weight: 1, preference: {matchExpressions: [{key: zone, operator: In, values: [a]}]}}
            tolerations: [{key: batch, operator: Equal, value: "yes", effect: NoSchedule}]
          zoned:
            matchExpressions: [{key: zone, operator: In, values: [b]}]
"""
DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod(metadata: Any = None, **spec: Any) -> dict[str, Any]:
    """A one-container GPU Pod; `metadata` None: a name only; "absent": no metadata at all."""
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "spec": {
        "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}], **spec}}
    if metadata != "absent":
        obj["metadata"] = {"name": "p"} if metadata is None else {"name": "p", **metadata}
    return obj


def tiered(tier: str, metadata: Any = None, **spec: Any) -> dict[str, Any]:
    labels = {"gpu-webhook.io/tier": tier, **(metadata or {}).pop("labels", {})}
    return pod({**(metadata or {}), "labels": labels}, **spec)


def deployment(template_metadata: Any = None) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": pod()["spec"]}
    if template_metadata is not None:
        template["metadata"] = template_metadata
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": 1, "template": template}}


# id, object: shapes of one class that differ where its edits or their patch look, and shapes of other classes.
SHAPES: list[tuple[str, dict[str, Any]]] = [
    ("plain", pod()),
    ("metadata-absent", pod("absent")),
    ("metadata-empty", pod({})),
    ("default-tolerations", pod(tolerations=DEFAULT_TOLERATIONS)),
    ("tolerations-empty", pod(tolerations=[])),
    ("gpu-toleration-present", pod(tolerations=[*DEFAULT_TOLERATIONS, GPU_TOLERATION])),
    ("gpu-toleration-any-effect", pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])),
    ("gpu-toleration-other-effect", pod(tolerations=[{**GPU_TOLERATION, "effect": "NoExecute"}])),
    ("toleration-everything", pod(tolerations=[{"operator": "Exists"}])),
    ("toleration-seconds", pod(tolerations=[{**GPU_TOLERATION, "tolerationSeconds": 5}])),
    ("toleration-not-an-object", pod(tolerations=["nvidia.com/gpu", GPU_TOLERATION])),
    ("tolerations-an-object", pod(tolerations={"key": "nvidia.com/gpu"})),
    ("node-selector-other-key", pod(nodeSelector={"zone": "a"})),
    ("node-selector-empty", pod(nodeSelector={})),
    ("node-selector-one-class-key", pod(nodeSelector={"gpu-type": "t4"})),
    ("node-selector-both-class-keys", pod(nodeSelector={"gpu-type": "t4", "workload": "inference"})),
    ("runtime-class-preset", pod(runtimeClassName="kata")),
    ("runtime-class-empty", pod(runtimeClassName="")),
    ("runtime-class-unhashable", pod(runtimeClassName={"name": "kata"})),
    ("annotations-other-key", pod({"annotations": {"a": "b"}})),
    ("annotations-empty", pod({"annotations": {}})),
    ("annotations-class-present", pod({"annotations": {class_edits.CLASS_ANNOTATION: "x"}})),
    ("annotations-both-present", pod({"annotations": {class_edits.CLASS_ANNOTATION: "x",
                                                      class_edits.RULES_ANNOTATION: "y"}})),
    ("annotations-not-an-object", pod({"annotations": ["a"]})),
    ("training-class", pod({"labels": {"gpu-webhook.io/workload": "training"}})),
    ("a100-class", pod({"labels": {"gpu-webhook.io/gpu-type": "a100"}})),
    ("batch", tiered("batch")),
    ("batch-default-scheduler", tiered("batch", schedulerName="default-scheduler")),
    ("batch-own-scheduler", tiered("batch", schedulerName="mine")),
    ("batch-priority-set", tiered("batch", priority=0, preemptionPolicy="PreemptLowerPriority")),
    ("batch-priority-only", tiered("batch", priority=0)),
    ("batch-priority-class-preset", tiered("batch", priorityClassName="high", priority=1000)),
    ("batch-labels-present", tiered("batch", {"labels": {"example.com/tier": "own"}})),
    ("batch-annotation-present", tiered("batch", {"annotations": {"example.com/preemptible": "no"}})),
    ("batch-affinity-absent-node-affinity", tiered("batch", affinity={"podAntiAffinity": {}})),
    ("batch-node-affinity-present", tiered("batch", affinity={"nodeAffinity": {}})),
    ("batch-affinity-not-an-object", tiered("batch", affinity=[])),
    ("batch-batch-toleration", tiered("batch", tolerations=[{"key": "batch", "operator": "Exists"}])),
    ("zoned", tiered("zoned")),
    ("zoned-own-terms", tiered("zoned", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "Exists"}]}]}}})),
    ("deployment", deployment()),
    ("deployment-template-metadata", deployment({"labels": {"app": "a"}})),
    ("deployment-template-metadata-empty", deployment({})),
]


@cache
def tier_rules() -> tuple[tuple[str, str], ...]:
    """The packaged rules with pod templates mutated, and the tier axis."""
    sources = [(name, text.replace("mutate: false", "mutate: true")) for name, text in read_sources()]
    return (*sources, ("zz-tier.yaml", TIER))


def fresh_policy() -> Policy:
    policy = parse_sources(list(tier_rules()))
    assert policy.mutate_templates
    return policy


@cache
def warm_policy() -> Policy:
    """A policy whose memo every shape has filled, twice over (the second pass on the first's entries)."""
    policy = fresh_policy()
    for _ in range(2):
        for _, obj in SHAPES:
            evaluate(policy, copy.deepcopy(obj), Context("default"))
    return policy


def unmemoised(obj: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Verdict:
    """The verdict on `obj` from a fresh policy that memoises nothing."""
    with monkeypatch.context() as patched:
        patched.setattr(class_edits, "MEMO_SIZE", 0)
        policy = fresh_policy()
        verdict = evaluate(policy, obj, Context("default"))
        assert not policy.class_changes
    return verdict


@pytest.mark.parametrize("obj", [obj for _, obj in SHAPES], ids=[name for name, _ in SHAPES])
def test_a_warm_memo_gives_what_no_memo_gives(obj: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    expected = unmemoised(copy.deepcopy(obj), monkeypatch)
    verdict = evaluate(warm_policy(), obj, Context("default"))
    assert verdict._replace(classes=(), patch=None) == expected._replace(classes=(), patch=None)
    assert [c.name for c in verdict.classes] == [c.name for c in expected.classes]  # type: ignore[attr-defined]
    want = operations(obj, expected.edits)
    if verdict.patch is not None:
        assert list(verdict.patch.ops) == want
        assert json.loads(base64.b64decode(verdict.patch.encoded)) == want
        assert verdict.patch.encoded == encode(want)


@pytest.mark.parametrize("obj", [obj for _, obj in SHAPES], ids=[name for name, _ in SHAPES])
def test_every_spec_of_a_class_gets_the_edits_made_without_the_memo(obj: dict[str, Any]) -> None:
    policy = warm_policy()
    ctx = Context("default")
    for ref in pods.pod_specs(obj):
        collector = Collector(policy)
        chosen = choose_class(policy, ref, "default", ctx, checks.check_containers(policy, ref, collector), collector)
        if chosen is None:
            continue
        changes = class_edits.class_changes(policy, obj, ref, chosen)
        assert list(changes.edits) == class_edits.class_edits(policy, ref, chosen)
        if changes.patch is not None:
            assert list(changes.patch.ops) == operations(obj, changes.edits)


def test_the_memo_holds_these_shapes() -> None:
    """Every shape but those whose edits read the node affinity or whose field cannot be hashed has its entry,
    and a second review of a shape is answered from it: the same patch object."""
    policy = fresh_policy()
    first = evaluate(policy, pod(tolerations=DEFAULT_TOLERATIONS), Context("default"))
    size = len(policy.class_changes)
    second = evaluate(policy, pod(tolerations=copy.deepcopy(DEFAULT_TOLERATIONS)), Context("default"))
    assert size == 1 and len(policy.class_changes) == 1
    assert first.patch is not None and second.patch is first.patch
    evaluate(policy, tiered("zoned"), Context("default"))
    evaluate(policy, pod(runtimeClassName={"name": "kata"}), Context("default"))
    assert len(policy.class_changes) == 1
    evaluate(policy, pod(tolerations=[GPU_TOLERATION]), Context("default"))  # another shape of the same class
    assert len(policy.class_changes) == 2


NOT_MEMOISED = {"zoned", "zoned-own-terms", "runtime-class-unhashable"}


@pytest.mark.parametrize(("name", "obj"), SHAPES, ids=[name for name, _ in SHAPES])
def test_the_memoised_shapes_hand_over_their_patch(name: str, obj: dict[str, Any]) -> None:
    """A memoised class change comes with its patch; one not memoised (edits that read the node affinity, an
    unhashable field) leaves the patch to `operations`, as does a denial."""
    verdict = evaluate(warm_policy(), obj, Context("default"))
    assert (verdict.patch is not None) == (verdict.allowed and name not in NOT_MEMOISED)


def test_a_full_memo_takes_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(class_edits, "MEMO_SIZE", 2)
    policy = fresh_policy()
    for _, obj in SHAPES:
        evaluate(policy, obj, Context("default"))
    assert len(policy.class_changes) == 2
    assert evaluate(policy, pod(tolerations=[]), Context("default")).patch is None  # a new shape, not memoised


def test_a_patch_is_only_the_memos_when_the_class_made_every_edit() -> None:
    """At /validate and with a denial there is no patch to hand over; a template the rules do not mutate has none."""
    policy = fresh_policy()
    assert evaluate(policy, pod(), Context("default", mode="validate")).patch is None
    denied = pod()
    denied["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    assert evaluate(policy, denied, Context("default")).patch is None
    shipped = parse_sources(read_sources())
    assert not shipped.mutate_templates
    verdict = evaluate(shipped, deployment(), Context("default"))
    assert verdict.patch is None and not verdict.edits


def review_body(obj: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": obj["kind"]},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "default",
        "operation": "CREATE", "userInfo": {"username": "someone"}, "object": obj}}).encode()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[AdmissionServer]:
    rules = tmp_path / "rules"
    rules.mkdir()
    for index, (_, text) in enumerate(tier_rules()):
        (rules / f"{index:02}.yaml").write_text(text)
    yield server_of(create_app(Settings(rules_dir=rules, rules_poll_seconds=0), registry=CollectorRegistry()))


def test_the_server_answers_from_the_memo_and_nothing_changes_it(server: AdmissionServer) -> None:
    """Each shape twice through `answer()` (its patch from the memo the second time) and through `check`'s
    `decide`, whose patched object is then emptied: the responses are equal, `check`'s patch is the server's,
    and every memo entry is as it was made."""
    policy = server.store.policy
    answers = {name: server.answer("mutate", review_body(obj)) for name, obj in SHAPES}
    made = copy.deepcopy(policy.class_changes)
    assert made
    for name, obj in SHAPES:
        assert server.answer("mutate", review_body(obj)) == answers[name]
        outcome = decide(policy, copy.deepcopy(obj), "default")
        response = answers[name][1]["response"]
        if outcome.patch and response["allowed"]:
            assert json.loads(base64.b64decode(response["patch"])) == outcome.patch
        clear(outcome.patched)  # what a caller of `check` may do with the patched object
    assert policy.class_changes == made


def clear(value: Any) -> None:
    """Empty every map and list in `value`, innermost first."""
    if isinstance(value, dict):
        for item in value.values():
            clear(item)
        value.clear()
    elif isinstance(value, list):
        for item in value:
            clear(item)
        value.clear()
