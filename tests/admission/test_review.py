"""The AdmissionReview wire format: parsing once, and responses kube-apiserver accepts."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.admission import body, review

from webhook.admission.review import (
    WARNING_MAX_CHARS,
    AdmissionRequest,
    Decision,
    ReviewError,
    audit_key,
    build_response,
    error_status,
    parse_review,
    sanitize_warning,
    sanitize_warnings,
)


def _raw(document: Any) -> bytes:
    return json.dumps(document).encode()


def _envelope(**request: Any) -> dict[str, Any]:
    base = {"uid": "u-1", "operation": "CREATE", "object": {"kind": "Pod"}}
    base.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        pytest.param("pod-create-from-replicaset-gpu", {
            "api_version": "admission.k8s.io/v1", "operation": "CREATE", "namespace": "team-a",
            "name": "", "generate_name": "vllm-7d9c8b6f5-", "display_name": "vllm-7d9c8b6f5-",
            "sub_resource": "", "dry_run": False, "resource": "pods",
        }, id="replicaset-pod-generate-name"),
        pytest.param("pod-create-v1beta1", {"api_version": "admission.k8s.io/v1beta1", "operation": "CREATE"},
                     id="v1beta1"),
        pytest.param("pod-create-gpu-dry-run", {"dry_run": True}, id="dry-run"),
        pytest.param("pod-delete", {"operation": "DELETE", "obj": None}, id="delete-object-null"),
        pytest.param("pod-status-update", {"operation": "UPDATE", "sub_resource": "status"}, id="status-update"),
    ],
)
def test_parse_fixture(fixture: str, expected: dict[str, Any]) -> None:
    parsed = parse_review(body(review(fixture)))
    assert parsed.uid == review(fixture)["request"]["uid"]
    assert parsed.kind.kind == "Pod"
    for attribute, value in expected.items():
        assert getattr(parsed, attribute) == value, attribute


def test_namespace_comes_from_the_request_not_the_object() -> None:
    document = review("pod-create-from-replicaset-gpu", namespace="team-b")
    assert parse_review(body(document)).namespace == "team-b"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        pytest.param(b"", "empty request body", id="empty"),
        pytest.param(b"{not json", "not valid JSON", id="not-json"),
        pytest.param(b"\xff\xfe\x00", "not valid JSON", id="not-utf8"),
        pytest.param(b"[" * 100_000, "not valid JSON", id="deeply-nested"),
        pytest.param(_raw([1, 2]), "must be an object", id="json-array"),
        pytest.param(_raw("AdmissionReview"), "must be an object", id="json-string"),
        pytest.param(_raw({"kind": "AdmissionReview", "request": {}}), "unsupported apiVersion", id="no-apiversion"),
        pytest.param(_raw({**_envelope(), "apiVersion": "admission.k8s.io/v2"}), "unsupported apiVersion",
                     id="unknown-apiversion"),
        pytest.param(_raw({**_envelope(), "apiVersion": ["admission.k8s.io/v1"]}), "unsupported apiVersion",
                     id="apiversion-list"),
        pytest.param(_raw({**_envelope(), "kind": "Pod"}), "unsupported kind", id="wrong-kind"),
        pytest.param(_raw({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "request is required",
                     id="no-request"),
        pytest.param(_raw({**_envelope(), "request": "x"}), "request must be an object", id="request-not-object"),
        pytest.param(_raw(_envelope(uid=None)), "request.uid is required", id="no-uid"),
        pytest.param(_raw(_envelope(uid="")), "request.uid is required", id="empty-uid"),
        pytest.param(_raw(_envelope(uid=7)), "request.uid is required", id="uid-not-string"),
        pytest.param(_raw(_envelope(operation="PATCH")), "request.operation", id="unknown-operation"),
        pytest.param(_raw(_envelope(operation=None)), "request.operation", id="no-operation"),
        pytest.param(_raw(_envelope(operation={"CREATE": 1})), "request.operation", id="operation-object"),
        pytest.param(_raw(_envelope(dryRun=1)), "dryRun", id="dryrun-number"),
        pytest.param(_raw(_envelope(object=None)), "request.object is required for CREATE", id="create-no-object"),
        pytest.param(_raw(_envelope(object=[1])), "request.object must be an object", id="object-not-object"),
        pytest.param(_raw(_envelope(namespace=3)), "request.namespace must be a string", id="namespace-not-string"),
        pytest.param(_raw(_envelope(dryRun="yes")), "dryRun", id="dryrun-not-bool"),
        pytest.param(_raw(_envelope(kind="Pod")), "request.kind must be an object", id="kind-not-object"),
        pytest.param(_raw(_envelope(object={"metadata": []})), "metadata must be an object", id="metadata-list"),
    ],
)
def test_malformed_reviews_are_rejected_with_a_reason(raw: bytes, fragment: str) -> None:
    with pytest.raises(ReviewError) as caught:
        parse_review(raw)
    assert fragment in str(caught.value)
    assert caught.value.code == 400


def _request(api_version: str = "admission.k8s.io/v1") -> AdmissionRequest:
    return AdmissionRequest(api_version=api_version, uid="abc-123", operation="CREATE")  # type: ignore[arg-type]


PATCH = [{"op": "add", "path": "/spec/nodeSelector", "value": {"gpu-type": "t4"}}]


@pytest.mark.parametrize(
    ("decision", "expected_keys"),
    [
        pytest.param(Decision(allowed=True), {"uid", "allowed"}, id="allowed-unchanged"),
        pytest.param(Decision(allowed=True, patch=PATCH), {"uid", "allowed", "patchType", "patch"},
                     id="allowed-with-patch"),
        pytest.param(Decision(allowed=False, message="[r] no", patch=PATCH), {"uid", "allowed", "status"},
                     id="denied-never-patches"),
        pytest.param(Decision(allowed=True, warnings=["[w] careful"]), {"uid", "allowed", "warnings"},
                     id="warning"),
        pytest.param(Decision(allowed=True, warnings=["\n", ""]), {"uid", "allowed"}, id="only-empty-warnings"),
        pytest.param(Decision(allowed=True, audit_annotations={"gpu-class": "t4"}),
                     {"uid", "allowed", "auditAnnotations"}, id="audit"),
    ],
)
def test_response_keys(decision: Decision, expected_keys: set[str]) -> None:
    document = build_response(_request(), decision)
    assert document["apiVersion"] == "admission.k8s.io/v1"
    assert document["kind"] == "AdmissionReview"
    assert set(document["response"]) == expected_keys
    assert document["response"]["uid"] == "abc-123"


def test_denial_is_403_with_the_message() -> None:
    response = build_response(_request(), Decision(allowed=False, message="[a] one; [b] two"))["response"]
    assert response["allowed"] is False
    assert response["status"] == {"status": "Failure", "code": 403, "reason": "Forbidden",
                                  "message": "[a] one; [b] two"}


def test_patch_is_base64_json_patch() -> None:
    response = build_response(_request(), Decision(allowed=True, patch=PATCH))["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"], validate=True)) == PATCH


@pytest.mark.parametrize("api_version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
def test_response_echoes_the_request_version(api_version: str) -> None:
    assert build_response(_request(api_version), Decision(allowed=True))["apiVersion"] == api_version


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("[r] plain", "[r] plain", id="plain"),
        pytest.param("[r] two\nlines\tand\x00nul", "[r] two lines and nul", id="control-chars"),
        pytest.param("[r] \x1b[31mred\x1b[0m", "[r] [31mred [0m", id="ansi-escape"),
        pytest.param("  spaced  out  ", "spaced out", id="whitespace"),
        pytest.param("\u200bzero\u2028width", "zero width", id="format-and-separator-chars"),
        pytest.param("x" * 300, "x" * (WARNING_MAX_CHARS - 3) + "...", id="truncated"),
        pytest.param("[r] " + "word " * 40 + "; do this", "[r] " + "word " * 19 + "word...; do this",
                     id="long: the fix after the last '; ' is kept, the text before it cut at a word"),
        pytest.param("[r] what; " + "fix " * 30, ("[r] what; " + "fix " * 30)[: WARNING_MAX_CHARS - 3].rstrip() + "...",
                     id="a fix too long to keep whole: a plain cut"),
    ],
)
def test_sanitize_warning(text: str, expected: str) -> None:
    assert sanitize_warning(text) == expected


def test_sanitize_warnings_dedupes_and_caps() -> None:
    texts = ["a", "a", "", "\n", "b", "c", "d", "e", "f", "g"]
    assert sanitize_warnings(texts) == ("a", "b", "c", "d", "... and 3 more warnings")
    assert sanitize_warnings(["a", "b"]) == ("a", "b")


@given(st.lists(st.text(), max_size=20))
def test_warnings_are_always_acceptable_to_the_api_server(texts: list[str]) -> None:
    for warning in sanitize_warnings(texts):
        assert warning
        assert len(warning) <= WARNING_MAX_CHARS
        assert not any(ord(c) < 32 or ord(c) == 127 for c in warning)
    assert len(sanitize_warnings(texts)) <= 5


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        pytest.param("gpu-class", "gpu-class", id="valid"),
        pytest.param("gpu-webhook.io/class", "gpu-webhook.io-class", id="slash"),
        pytest.param("-weird key!-", "weird-key", id="ends-and-spaces"),
        pytest.param("k" * 80, "k" * 63, id="too-long"),
        pytest.param("///", None, id="nothing-left"),
    ],
)
def test_audit_key(key: str, expected: str | None) -> None:
    assert audit_key(key) == expected


def test_audit_annotation_keys_never_carry_a_slash() -> None:
    decision = Decision(allowed=True, audit_annotations={"a/b": "1", "ok": "2", "/": "dropped"})
    assert build_response(_request(), decision)["response"]["auditAnnotations"] == {"a-b": "1", "ok": "2"}


def test_error_status_is_a_metav1_status() -> None:
    assert error_status(400, "bad") == {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 400,
                                        "reason": "BadRequest", "message": "bad"}
    assert error_status(413, "big")["reason"] == "RequestEntityTooLarge"
