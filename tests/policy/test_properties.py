"""Properties of the engine and the patch on generated Pod-like objects (hypothesis).

For any object: `evaluate` never raises. For schema-shaped Pods that are allowed: the patch applies with
jsonpatch, the result passes kubernetes-validate (strict), a second pass yields no patch (fixed point), and
what the user wrote (nodeSelector entries, tolerations, runtimeClassName, labels, annotations) is kept.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.pod_strategies import VALID_QUANTITIES, garbled_pods, pods, policy, validator

from webhook.policy.engine import Context, evaluate
from webhook.policy.patch import operations

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMESPACES = ["default", "team-a", "kube-system"]


# --------------------------------------------------------------------------------------------- properties


def _is_mapping_of_str(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


@SETTINGS
@given(obj=garbled_pods(), namespace=st.sampled_from(NAMESPACES),
       operation=st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE"]),
       mode=st.sampled_from(["mutate", "validate"]))
def test_evaluate_never_raises(obj: dict[str, Any], namespace: str, operation: str, mode: str) -> None:
    before = copy.deepcopy(obj)
    verdict = evaluate(policy(), obj, Context(namespace, operation, mode))  # type: ignore[arg-type]
    assert obj == before or json.dumps(obj, default=str) == json.dumps(before, default=str), "input unchanged"
    if mode == "validate" or operation != "CREATE" or not verdict.allowed:
        assert not verdict.edits
    if verdict.edits and _is_mapping_of_str(obj.get("spec", {}).get("nodeSelector", {}) or {}) and isinstance(
            obj.get("spec", {}).get("tolerations", []) or [], list) and isinstance(obj.get("metadata"), dict) and \
            all(isinstance(obj["metadata"].get(k, {}) or {}, dict) for k in ("labels", "annotations")):
        jsonpatch.apply_patch(obj, operations(obj, verdict.edits))


@SETTINGS
@given(obj=st.one_of(pods(VALID_QUANTITIES), pods(VALID_QUANTITIES), pods()), namespace=st.sampled_from(NAMESPACES))
def test_allowed_pods_patch_validate_and_reach_a_fixed_point(obj: dict[str, Any], namespace: str) -> None:
    verdict = evaluate(policy(), obj, Context(namespace))
    if not verdict.allowed:
        assert not verdict.edits
        return
    ops = operations(obj, verdict.edits)
    after = jsonpatch.apply_patch(obj, ops)
    kv = validator()
    if kv is not None and ops:
        try:
            kv.validate(after, kv.latest_version(), True)
        except kv.ValidationError as err:
            pytest.fail(f"kubernetes-validate --strict: {str(err).splitlines()[0]}")
    again = evaluate(policy(), after, Context(namespace))
    assert again.allowed, again.message()
    assert not again.edits, f"second pass edits: {again.edits}"
    assert {f.rule for f in again.warnings} == {f.rule for f in verdict.warnings}


@SETTINGS
@given(obj=pods(VALID_QUANTITIES), namespace=st.sampled_from(NAMESPACES))
def test_what_the_user_wrote_is_never_clobbered(obj: dict[str, Any], namespace: str) -> None:
    verdict = evaluate(policy(), obj, Context(namespace))
    after = jsonpatch.apply_patch(obj, operations(obj, verdict.edits)) if verdict.allowed else obj
    spec, new_spec = obj["spec"], after["spec"]
    for key, value in (spec.get("nodeSelector") or {}).items():
        assert new_spec["nodeSelector"][key] == value
    tolerations = spec.get("tolerations") or []
    assert (new_spec.get("tolerations") or [])[: len(tolerations)] == tolerations
    added = (new_spec.get("tolerations") or [])[len(tolerations):]
    assert all(t not in tolerations for t in added), "a toleration the user has is never added again"
    if spec.get("runtimeClassName"):
        assert new_spec["runtimeClassName"] == spec["runtimeClassName"]
    for part in ("labels", "annotations"):
        for key, value in (obj["metadata"].get(part) or {}).items():
            assert after["metadata"][part][key] == value
    assert new_spec["containers"] == spec["containers"]
    assert new_spec.get("initContainers") == spec.get("initContainers")


@SETTINGS
@given(obj=pods(VALID_QUANTITIES))
def test_exempt_and_non_create_are_never_patched(obj: dict[str, Any]) -> None:
    assert not evaluate(policy(), obj, Context("kube-system")).edits
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        verdict = evaluate(policy(), obj, Context("default", operation))  # type: ignore[arg-type]
        assert verdict.allowed and not verdict.edits
