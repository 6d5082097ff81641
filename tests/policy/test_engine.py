"""`engine.evaluate` on AdmissionReview requests shaped as kube-apiserver sends them, the content of its
messages (rule id, where, what, how to fix, the API server's own wording), and the effective GPU count."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from webhook.admission.loader import load_policy
from webhook.policy import pods
from webhook.policy.engine import Context, evaluate
from webhook.policy.patch import operations
from webhook.policy.pods import ContainerRef
from webhook.policy.rules import Policy

DATA = Path(__file__).resolve().parents[1] / "data"
REVIEWS = DATA / "admission-reviews"
NAMESPACE_RULES = Path(__file__).resolve().parents[1] / "rule-cases" / "namespace-policy" / "rules"
DEFAULT_CLASS = "workload=inference,gpu-type=t4"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@cache
def policy() -> Policy:
    return load_policy()


@cache
def namespace_policy() -> Policy:
    return load_policy(NAMESPACE_RULES)


def request(name: str) -> Mapping[str, Any]:
    return json.loads((REVIEWS / f"{name}.json").read_text(encoding="utf-8"))["request"]


def judge(name: str, mode: str = "mutate"):
    req = request(name)
    return evaluate(policy(), req["object"], Context(req["namespace"], req["operation"], mode, req.get("oldObject")))


def gpu_pod(limits: Any = None, *, requests: Any = None, labels: Any = None, **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = {"nvidia.com/gpu": limits}
    if requests is not None:
        resources["requests"] = {"nvidia.com/gpu": requests}
    metadata: dict[str, Any] = {"name": "p"}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "train", "image": "x", "resources": resources}], **spec}}


def patched(obj: Mapping[str, Any], pol: Policy | None = None, namespace: str = "default") -> dict[str, Any]:
    verdict = evaluate(pol or policy(), obj, Context(namespace))
    assert verdict.allowed, verdict.message()
    return jsonpatch.apply_patch(obj, operations(obj, verdict.edits))


# --------------------------------------------------------------------------------------------- fixtures

FIXTURES = [
    # name, mode, allowed, violation ids, edits expected, class, gpus
    ("pod-create-limits-only-defaulted", "mutate", True, [], True, DEFAULT_CLASS, 1),
    ("pod-create-from-replicaset-gpu", "mutate", True, [], True, DEFAULT_CLASS, 1),
    ("pod-create-gpu-dry-run", "mutate", True, [], True, DEFAULT_CLASS, 1),
    ("pod-create-v1beta1", "mutate", True, [], True, DEFAULT_CLASS, 1),
    ("pod-create-sidecar-gpu", "mutate", True, [], True, DEFAULT_CLASS, 2),
    ("pod-create-no-gpu", "mutate", True, [], False, None, 0),
    ("pod-create-gpu-fraction", "mutate", False, ["gpu-whole-number", "gpu-whole-number"], False, DEFAULT_CLASS, 0),
    ("pod-create-gpu-mismatch", "mutate", False, ["gpu-requests-equal-limits"], False, DEFAULT_CLASS, 2),
    ("pod-create-gpu-requests-only", "mutate", False, ["gpu-limits-required"], False, DEFAULT_CLASS, 0),
    ("deployment-create-gpu-template", "mutate", True, [], False, DEFAULT_CLASS, 8),
    ("cronjob-create-gpu-mismatch", "mutate", False, ["gpu-requests-equal-limits"], False, DEFAULT_CLASS, 1),
    ("pod-update-label", "mutate", True, [], False, None, 0),
    ("pod-status-update", "mutate", True, [], False, None, 0),
    ("pod-delete", "mutate", True, [], False, None, 0),
    # the validating endpoint: the same requests, before mutation
    ("pod-create-limits-only-defaulted", "validate", False, ["gpu-class-missing"], False, DEFAULT_CLASS, 1),
    ("pod-create-sidecar-gpu", "validate", False, ["gpu-class-missing"], False, DEFAULT_CLASS, 2),
    ("pod-create-no-gpu", "validate", True, [], False, None, 0),
    ("deployment-create-gpu-template", "validate", True, [], False, DEFAULT_CLASS, 8),
    ("pod-update-label", "validate", True, [], False, None, 0),
    ("pod-delete", "validate", True, [], False, None, 0),
]


@pytest.mark.parametrize(
    ("name", "mode", "allowed", "violations", "edits", "gpu_class", "gpus"),
    [pytest.param(*row, id=f"{row[0]}-{row[1]}") for row in FIXTURES],
)
def test_admission_review_fixture(name: str, mode: str, allowed: bool, violations: list[str], edits: bool,
                                  gpu_class: str | None, gpus: int) -> None:
    verdict = judge(name, mode)
    assert verdict.allowed is allowed, verdict.message()
    assert [f.rule for f in verdict.violations] == violations
    assert bool(verdict.edits) is edits
    assert verdict.gpu_class == gpu_class
    assert verdict.gpus == gpus
    assert not verdict.warnings


def test_replicaset_pod_gets_the_class_and_keeps_the_defaulted_tolerations() -> None:
    obj = request("pod-create-from-replicaset-gpu")["object"]
    after = patched(obj, namespace="team-a")
    assert after["spec"]["tolerations"] == [*obj["spec"]["tolerations"], GPU_TOLERATION]
    assert after["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    assert after["spec"]["runtimeClassName"] == "nvidia"
    assert after["metadata"]["annotations"]["gpu-webhook.io/class"] == DEFAULT_CLASS
    assert after["metadata"]["annotations"]["gpu-webhook.io/rules"] == policy().digest
    assert after["metadata"]["labels"] == obj["metadata"]["labels"]
    assert "name" not in after["metadata"], "a controller-created Pod has only generateName at /mutate"


def test_dry_run_gets_the_same_decision_and_edits() -> None:
    assert judge("pod-create-gpu-dry-run").edits == judge("pod-create-limits-only-defaulted").edits


def test_user_tolerations_stay_first_unchanged_and_are_not_duplicated() -> None:
    mine = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "operator": "Exists"}]
    after = patched(gpu_pod("1", tolerations=[dict(t) for t in mine]))
    assert after["spec"]["tolerations"] == mine, "an effect-less Exists toleration already covers the GPU taint"
    after = patched(gpu_pod("1", tolerations=[mine[0]]))
    assert after["spec"]["tolerations"] == [mine[0], GPU_TOLERATION]


def test_nodeselector_kept_and_completed() -> None:
    after = patched(gpu_pod("1", nodeSelector={"workload": "inference", "zone": "a"}))
    assert after["spec"]["nodeSelector"] == {"workload": "inference", "zone": "a", "gpu-type": "t4"}
    assert list(after["spec"]["nodeSelector"])[:2] == ["workload", "zone"]


def test_user_runtime_class_is_kept() -> None:
    assert patched(gpu_pod("1", runtimeClassName="kata"))["spec"]["runtimeClassName"] == "kata"


def test_user_class_annotation_is_kept() -> None:
    obj = gpu_pod("1")
    obj["metadata"]["annotations"] = {"gpu-webhook.io/class": "mine"}
    assert patched(obj)["metadata"]["annotations"]["gpu-webhook.io/class"] == "mine"


def test_exempt_namespace_is_untouched_and_noted() -> None:
    verdict = evaluate(policy(), gpu_pod(None, requests="1"), Context("kube-system"))
    assert verdict.allowed and not verdict.edits and not verdict.warnings
    assert any("exempt" in note for note in verdict.notes)


def test_request_namespace_wins_over_the_object_namespace() -> None:
    obj = gpu_pod(None, requests="1")
    obj["metadata"]["namespace"] = "kube-system"
    assert not evaluate(policy(), obj, Context("team-a")).allowed


def test_mirror_pod_is_not_patched() -> None:
    obj = gpu_pod("1")
    obj["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    verdict = evaluate(policy(), obj, Context("default"))
    assert verdict.allowed and not verdict.edits and verdict.gpu_class == DEFAULT_CLASS


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_non_create_pod_operations_are_never_patched_or_blocked(operation: str) -> None:
    verdict = evaluate(policy(), gpu_pod(None, requests="1"), Context("default", operation))
    assert verdict.allowed and not verdict.edits and not verdict.warnings


@pytest.mark.parametrize("obj", [
    pytest.param(None, id="null-object"),
    pytest.param({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}},
                 id="configmap"),
    pytest.param({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}, id="secret"),
    pytest.param({"kind": "Pod"}, id="pod-without-spec"),
    pytest.param({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"containers": [{"name": "c"}]}},
                 id="custom-resource-without-gpus"),
])
def test_objects_without_gpu_pod_specs_are_allowed_untouched(obj: Any) -> None:
    verdict = evaluate(policy(), obj, Context("default"))
    assert verdict.allowed and not verdict.edits and not verdict.warnings


def deployment(limits: Any = None, requests: Any = None) -> dict[str, Any]:
    pod = gpu_pod(limits, requests=requests)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "d"}}, "spec": pod["spec"]}}}


def test_update_of_a_workload_with_an_unchanged_template_is_not_judged() -> None:
    old = deployment(requests="1")
    new = json.loads(json.dumps(old))
    new["spec"]["replicas"] = 3
    verdict = evaluate(policy(), new, Context("default", "UPDATE", old_object=old))
    assert verdict.allowed and any("unchanged" in note for note in verdict.notes)


def test_update_of_a_workload_that_changes_its_template_is_judged() -> None:
    old = deployment("1")
    new = deployment(requests="1")
    verdict = evaluate(policy(), new, Context("default", "UPDATE", old_object=old))
    assert [f.rule for f in verdict.violations] == ["gpu-limits-required"]


# --------------------------------------------------------------------------------------------- messages


def _cronjob(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": obj["spec"]}}}}}


MESSAGES = [
    pytest.param(request("pod-create-gpu-mismatch")["object"], "gpu-requests-equal-limits", [
        '[gpu-requests-equal-limits] spec.containers[0] (train): resources.requests: Invalid value: "1": '
        "must be equal to nvidia.com/gpu limit of 2",
        "set requests equal to limits",
    ], id="mismatch"),
    pytest.param(request("cronjob-create-gpu-mismatch")["object"], "gpu-requests-equal-limits", [
        "spec.jobTemplate.spec.template.spec.containers[0] (eval): resources.requests",
        "must be equal to nvidia.com/gpu limit of 1",
    ], id="cronjob-mismatch-path"),
    pytest.param(request("pod-create-gpu-fraction")["object"], "gpu-whole-number", [
        'spec.containers[0] (embed): resources.limits[nvidia.com/gpu]: Invalid value: "500m": must be an integer',
        "ask for whole GPUs", "nvidia.com/gpu.shared",
    ], id="fraction"),
    pytest.param(gpu_pod("1500m"), "gpu-whole-number", ['Invalid value: "1500m": must be an integer'],
                 id="one-and-a-half"),
    pytest.param(request("pod-create-gpu-requests-only")["object"], "gpu-limits-required", [
        "spec.containers[0] (train): nvidia.com/gpu is in requests but not in limits",
        "GPUs are requested in limits: move nvidia.com/gpu: 1 to resources.limits",
    ], id="requests-only"),
    pytest.param(gpu_pod("-1"), "gpu-quantity-invalid", [
        'spec.containers[0] (train): resources.limits[nvidia.com/gpu]: Invalid value: "-1": '
        "must be greater than or equal to 0", "such as 1",
    ], id="negative"),
    pytest.param(gpu_pod("abc"), "gpu-quantity-invalid", [
        "spec.containers[0] (train): resources.limits[nvidia.com/gpu]: Invalid value:", '"abc"',
        "write a number such as 1",
    ], id="garbage"),
    pytest.param(gpu_pod(None, resources={"limits": {"nvidia.com/gpu": "1"}}), "gpu-pod-level-resources", [
        "spec.resources.limits[nvidia.com/gpu]", "GPUs cannot be set in pod-level resources",
        "move it to each container's resources.limits",
    ], id="pod-level"),
    pytest.param({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s"}, "spec": {"containers": [
        {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu.shared": "2"}}}]}},
        "gpu-per-container-max", [
        "spec.containers[0] (a): asks for 2 nvidia.com/gpu.shared but a container may have at most 1",
        "time-sliced", "ask for 1",
    ], id="shared-per-container"),
    pytest.param(gpu_pod("9"), "gpu-class-max", [
        "needs 9 GPUs", "allows at most 8", DEFAULT_CLASS, "ask for fewer",
    ], id="class-max"),
    pytest.param(gpu_pod("1", labels={"gpu-webhook.io/workload": "batch"}), "gpu-class-unknown", [
        'metadata.labels[gpu-webhook.io/workload]: "batch" is not a workload class',
        "choose one of: inference, training",
    ], id="class-unknown"),
    pytest.param(_cronjob(gpu_pod("1", labels=None)) | {}, None, [], id="cronjob-allowed"),
    pytest.param(gpu_pod("1", labels={"gpu-webhook.io/workload": "inference"}, nodeSelector={"workload": "training"}),
                 "gpu-class-conflict", [
        'metadata.labels[gpu-webhook.io/workload] is "inference"', "own selection spec.nodeSelector[workload]=training",
        "admits workload training", "remove the label or that selector",
    ], id="label-contradicts-nodeselector"),
    pytest.param(gpu_pod("1", env=None) | {}, None, [], id="plain-allowed"),
]


@pytest.mark.parametrize(("obj", "rule", "substrings"), MESSAGES)
def test_denial_message(obj: Mapping[str, Any], rule: str | None, substrings: list[str]) -> None:
    verdict = evaluate(policy(), obj, Context("default"))
    if rule is None:
        assert verdict.allowed, verdict.message()
        return
    assert rule in [f.rule for f in verdict.violations], verdict.message()
    message = verdict.message()
    for part in substrings:
        assert part in message
    assert all(f.render().startswith(f"[{f.rule}] ") for f in verdict.violations)
    assert all(f.enforcement == "deny" for f in verdict.violations)


def test_template_messages_name_the_template_path() -> None:
    obj = deployment(requests="1")
    message = evaluate(policy(), obj, Context("default")).message()
    assert "[gpu-limits-required] spec.template.spec.containers[0] (train)" in message


def test_init_container_messages_name_the_init_container() -> None:
    obj = gpu_pod(None)
    obj["spec"]["initContainers"] = [
        {"name": "setup", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}]
    message = evaluate(policy(), obj, Context("default")).message()
    assert "spec.initContainers[0] (setup)" in message and "must be an integer" in message


def test_class_missing_message_lists_what_is_missing() -> None:
    verdict = evaluate(policy(), gpu_pod("1"), Context("default", mode="validate"))
    message = verdict.message()
    assert message.startswith("[gpu-class-missing] ")
    for part in ("nodeSelector workload=inference", "gpu-type=t4", "toleration nvidia.com/gpu:NoSchedule",
                 "re-create the Pod"):
        assert part in message


def test_class_not_allowed_lists_the_choices() -> None:
    obj = gpu_pod("1", labels={"gpu-webhook.io/gpu-type": "t4"})
    verdict = evaluate(namespace_policy(), obj, Context("research"))
    assert [f.rule for f in verdict.violations] == ["gpu-class-not-allowed"]
    assert "namespace research may not use gpu-type t4" in verdict.message()
    assert "one of: a100, h100" in verdict.message()


def test_enforcement_warn_and_off() -> None:
    verdict = evaluate(namespace_policy(), gpu_pod("5", labels={"gpu-webhook.io/gpu-type": "h100"}),
                       Context("research"))
    assert verdict.allowed and [f.rule for f in verdict.warnings] == ["gpu-class-max"]
    assert verdict.warnings[0].enforcement == "warn" and verdict.edits
    env_only = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [
        {"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    assert not evaluate(namespace_policy(), env_only, Context("default")).warnings
    assert [f.rule for f in evaluate(policy(), env_only, Context("default")).warnings] == [
        "gpu-env-without-request"]


WARNINGS = [
    pytest.param({"containers": [{"name": "c", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]},
                 "gpu-env-without-request", ["spec.containers[0] (c)", "NVIDIA_VISIBLE_DEVICES=all",
                                             "request nvidia.com/gpu in limits"], id="env"),
    pytest.param({"runtimeClassName": "nvidia", "containers": [{"name": "c"}]}, "gpu-runtime-without-request",
                 ["spec.runtimeClassName=nvidia", "without a GPU request"], id="runtime"),
    pytest.param({"tolerations": [GPU_TOLERATION], "containers": [{"name": "c"}]},
                 "gpu-toleration-without-request", ["spec.tolerations", "tolerates nvidia.com/gpu",
                                                    "drop it or request a GPU"], id="toleration"),
    pytest.param({"nodeName": "gpu-1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
                 "gpu-node-name-preset", ["spec.nodeName='gpu-1'", "bypasses the scheduler"], id="node-name"),
]


@pytest.mark.parametrize(("spec", "rule", "substrings"), WARNINGS)
def test_warning_message(spec: dict[str, Any], rule: str, substrings: list[str]) -> None:
    verdict = evaluate(policy(), {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": spec},
                       Context("default"))
    assert verdict.allowed
    assert [f.rule for f in verdict.warnings] == [rule]
    rendered = verdict.warnings[0].render()
    assert rendered.startswith(f"[{rule}] ")
    for part in substrings:
        assert part in rendered


# --------------------------------------------------------------------------------------------- garbage

GARBAGE = [
    pytest.param({"kind": "Pod", "spec": "nope"}, id="spec-string"),
    pytest.param({"kind": "Pod", "spec": {"containers": "nope"}}, id="containers-string"),
    pytest.param({"kind": "Pod", "spec": {"containers": [None, 3, "x"]}}, id="containers-junk-items"),
    pytest.param({"kind": "Pod", "spec": {"containers": [{"resources": "x"}]}}, id="resources-string"),
    pytest.param({"kind": "Pod", "spec": {"containers": [{"resources": {"limits": ["nvidia.com/gpu"]}}]}},
                 id="limits-list"),
    pytest.param({"kind": "Pod", "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": {}}}}]}},
                 id="quantity-mapping"),
    pytest.param({"kind": "Pod", "metadata": {"labels": ["a"]}, "spec": {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": 1}}}]}}, id="labels-list"),
    pytest.param({"kind": "Pod", "metadata": {"labels": {"gpu-webhook.io/workload": {"a": 1}}}, "spec": {
        "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}}, id="label-value-mapping"),
    pytest.param({"kind": "Pod", "spec": {"tolerations": "x", "containers": [{"name": "c"}]}},
                 id="tolerations-string"),
    pytest.param({"kind": "Pod", "spec": {"tolerations": [None, 1], "containers": [{"name": "c"}]}},
                 id="tolerations-junk-items"),
    pytest.param({"kind": "Pod", "spec": {"containers": [{"env": "x"}], "runtimeClassName": ["nvidia"]}},
                 id="env-string-runtime-list"),
    pytest.param({"kind": "Pod", "spec": {"containers": [{"env": [{"name": "NVIDIA_VISIBLE_DEVICES",
                                                                     "value": ["all"]}]}]}}, id="env-value-list"),
    pytest.param({"kind": ["Pod"], "spec": {}}, id="kind-list"),
    pytest.param({"kind": "Pod", "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}],
                                          "nodeName": ["x"], "schedulerName": 3}}, id="node-name-list"),
    pytest.param({"kind": "Pod", "spec": {"tolerations": [{"key": ["nvidia.com/gpu"]}], "containers": [{}]}},
                 id="toleration-key-list"),
    pytest.param({"kind": "Pod", "metadata": "x", "spec": {"containers": [{"resources": {"limits": {
        "nvidia.com/gpu": 1}}}]}}, id="metadata-string"),
    pytest.param({"kind": "Pod", "metadata": {"annotations": 5}, "spec": {"containers": [{"resources": {
        "limits": {"nvidia.com/gpu": 1}}}]}}, id="annotations-int"),
]


@pytest.mark.parametrize("obj", GARBAGE)
def test_garbage_never_raises(obj: Mapping[str, Any]) -> None:
    for mode in ("mutate", "validate"):
        evaluate(policy(), obj, Context("default", mode=mode))


# --------------------------------------------------------------------------------------------- effective count


def refs(*items: tuple[str, int] | tuple[str, int, str]) -> list[tuple[ContainerRef, int]]:
    """("init", 2) / ("side", 1) / ("app", 3) / ("eph", 1) in declaration order."""
    out = []
    lists = {"init": "initContainers", "side": "initContainers", "app": "containers", "eph": "ephemeralContainers"}
    for position, (what, count, *_) in enumerate(items):
        container: dict[str, Any] = {"name": f"{what}{position}"}
        if what == "side":
            container["restartPolicy"] = "Always"
        out.append((ContainerRef(lists[what], position, container, ("spec",)), count))
    return out


EFFECTIVE = [
    pytest.param([], 0, id="nothing"),
    pytest.param([("app", 1)], 1, id="one-app"),
    pytest.param([("app", 1), ("app", 2)], 3, id="apps-add"),
    pytest.param([("init", 4), ("app", 1)], 4, id="init-larger-than-apps"),
    pytest.param([("init", 1), ("app", 4)], 4, id="apps-larger-than-init"),
    pytest.param([("init", 2), ("init", 3), ("app", 1)], 3, id="largest-init"),
    pytest.param([("side", 1), ("app", 1)], 2, id="sidecar-adds-to-apps"),
    pytest.param([("side", 3), ("init", 6)], 9, id="sidecar-before-init-adds"),
    pytest.param([("init", 6), ("side", 3)], 6, id="sidecar-after-init-does-not-add"),
    pytest.param([("init", 2), ("side", 1), ("init", 2), ("app", 1)], 3, id="mixed-order"),
    pytest.param([("side", 1), ("side", 2), ("app", 3)], 6, id="two-sidecars-and-app"),
    pytest.param([("side", 4)], 4, id="sidecar-alone"),
    pytest.param([("init", 0), ("app", 0)], 0, id="zeros"),
    pytest.param([("app", 1), ("eph", 8)], 1, id="ephemeral-ignored"),
]


@pytest.mark.parametrize(("items", "expected"), EFFECTIVE)
def test_effective_count(items: list[tuple[str, int]], expected: int) -> None:
    assert pods.effective_count(refs(*items)) == expected


def test_effective_count_through_evaluate_matches_sidecar_fixture() -> None:
    assert judge("pod-create-sidecar-gpu").gpus == 2


def test_ephemeral_containers_are_never_counted_or_checked() -> None:
    obj = gpu_pod("1")
    obj["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "x", "resources": {"limits": {
        "nvidia.com/gpu": "abc"}, "requests": {"nvidia.com/gpu": "-5"}}}]
    verdict = evaluate(policy(), obj, Context("default"))
    assert verdict.allowed and verdict.gpus == 1
