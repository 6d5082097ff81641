"""The AdmissionReview wire format (v1 and v1beta1): parse a request once, build the response.

Pure. `parse_review` turns the HTTP body into a frozen `AdmissionRequest` or raises `ReviewError` (a 4xx for
the caller); `build_response` turns a decision into the exact document kube-apiserver accepts: same
apiVersion and uid, no patch keys unless there is a patch, status 403 with every violation on denial,
warnings it will not silently drop, auditAnnotations keys it will not silently drop.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, cast

import orjson

from webhook.policy.findings import Operation
from webhook.policy.patch import encode as encode_patch

ApiVersion = Literal["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]
API_VERSIONS: tuple[ApiVersion, ...] = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
OPERATIONS: tuple[Operation, ...] = ("CREATE", "UPDATE", "DELETE", "CONNECT")
_API_VERSION_OF: dict[str, ApiVersion] = {v: v for v in API_VERSIONS}  # the text as its Literal type
_OPERATION_OF: dict[str, Operation] = {o: o for o in OPERATIONS}
_EMPTY: Mapping[str, Any] = MappingProxyType({})

WARNING_MAX_CHARS = 120  # "Limit warnings to 120 characters if possible" (admission/v1 API doc)
WARNINGS_MAX = 5
AUDIT_KEY_MAX = 63
_AUDIT_KEY_BAD = re.compile(r"[^-A-Za-z0-9_.]+")


class ReviewError(ValueError):
    """A call that is not a usable AdmissionReview: answered with an HTTP 4xx and a Status body."""

    def __init__(self, message: str, code: int = 400) -> None:
        super().__init__(message)
        self.code = code


class GroupVersionKind(NamedTuple):
    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(NamedTuple):
    """The parts of `request` the server uses, validated once.

    This and the other per-review values are NamedTuples rather than frozen dataclasses: equally immutable,
    and several times cheaper to build, which counts on a path taken for every admission.
    """

    api_version: ApiVersion
    uid: str
    operation: Operation
    kind: GroupVersionKind = GroupVersionKind()
    resource: str = ""
    sub_resource: str = ""
    namespace: str | None = None
    name: str = ""
    generate_name: str = ""
    obj: Mapping[str, Any] | None = None
    old_obj: Mapping[str, Any] | None = None
    dry_run: bool = False
    username: str = ""

    @property
    def display_name(self) -> str:
        """The name, or the `generateName` prefix a controller-created object has at mutation time."""
        return self.name or self.generate_name


class Decision(NamedTuple):
    """What the server answers, before it is put on the wire."""

    allowed: bool
    message: str = ""
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()
    audit_annotations: Mapping[str, str] = MappingProxyType({})
    encoded_patch: str = ""  # `patch` already encoded (a memoised patch, `findings.Patch`); "": encoded here


def _mapping(value: object, where: str, *, required: bool = False) -> Mapping[str, Any] | None:
    if type(value) is dict:
        return value
    if value is None:
        if required:
            raise ReviewError(f"{where} is required")
        return None
    if not isinstance(value, dict):
        raise ReviewError(f"{where} must be an object, got {type(value).__name__}")
    return cast(Mapping[str, Any], value)


def _string(value: object, where: str) -> str:
    if type(value) is str:
        return value
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"{where} must be a string, got {type(value).__name__}")
    return value


def decode_json(body: bytes) -> object:
    """The body as JSON, or ReviewError."""
    if not body:
        raise ReviewError("empty request body: expected an AdmissionReview")
    try:
        return orjson.loads(body)  # strict UTF-8 and RFC 8259 (no NaN), nesting capped at 1024
    except (orjson.JSONDecodeError, RecursionError) as exc:
        raise ReviewError(f"request body is not valid JSON: {str(exc)[:200]}") from None


def parse_review(body: bytes) -> AdmissionRequest:
    """Parse an AdmissionReview request body once; raises ReviewError naming the first problem."""
    return request_of(decode_json(body))


def request_of(document: object) -> AdmissionRequest:
    """The `AdmissionRequest` of a decoded AdmissionReview (`parse_review` without the JSON decoding).

    Each field is taken inline when it has its usual type (or is absent), and through `_mapping` or `_string`,
    which name a wrong type, otherwise: a call per field was a third of this function's instructions.
    """
    review = document if type(document) is dict else _mapping(document, "the request body", required=True)
    assert review is not None
    raw_version = review.get("apiVersion")
    api_version = _API_VERSION_OF.get(raw_version) if type(raw_version) is str else None  # a list: unhashable
    if api_version is None:
        expected = ", ".join(API_VERSIONS)
        raise ReviewError(f"unsupported apiVersion {raw_version!r}: expected one of {expected}")
    if review.get("kind") != "AdmissionReview":
        raise ReviewError(f"unsupported kind {review.get('kind')!r}: expected 'AdmissionReview'")
    request = m if type(m := review.get("request")) is dict else _mapping(m, "request", required=True)
    assert request is not None
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is required (a non-empty string)")
    raw_operation = request.get("operation")
    operation = _OPERATION_OF.get(raw_operation) if type(raw_operation) is str else None
    if operation is None:
        raise ReviewError(f"request.operation {raw_operation!r} is not one of {', '.join(OPERATIONS)}")
    kind = (m if type(m := request.get("kind")) is dict else _mapping(m, "request.kind")) or _EMPTY
    resource = (m if type(m := request.get("resource")) is dict else _mapping(m, "request.resource")) or _EMPTY
    obj = m if type(m := request.get("object")) is dict else _mapping(m, "request.object")
    if obj is None and operation == "CREATE":
        raise ReviewError("request.object is required for CREATE")
    metadata = _EMPTY
    if obj:
        metadata = (m if type(m := obj.get("metadata")) is dict
                    else _mapping(m, "request.object.metadata")) or _EMPTY
    dry_run = request.get("dryRun", False)
    if dry_run is not None and not isinstance(dry_run, bool):
        raise ReviewError("request.dryRun must be a boolean")
    user = (m if type(m := request.get("userInfo")) is dict else _mapping(m, "request.userInfo")) or _EMPTY
    group = v if type(v := kind.get("group")) is str else _string(v, "request.kind.group")
    version = v if type(v := kind.get("version")) is str else _string(v, "request.kind.version")
    kind_name = v if type(v := kind.get("kind")) is str else _string(v, "request.kind.kind")
    resource_name = v if type(v := resource.get("resource")) is str else _string(v, "request.resource.resource")
    sub_resource = (v if type(v := request.get("subResource")) is str
                    else "" if v is None else _string(v, "request.subResource"))
    namespace = (v if type(v := request.get("namespace")) is str
                 else "" if v is None else _string(v, "request.namespace"))
    if not namespace:
        namespace = (v if type(v := metadata.get("namespace")) is str
                     else "" if v is None else _string(v, "request.object.metadata.namespace"))
    name = v if type(v := request.get("name")) is str else "" if v is None else _string(v, "request.name")
    if not name:
        name = (v if type(v := metadata.get("name")) is str
                else "" if v is None else _string(v, "request.object.metadata.name"))
    generate_name = (v if type(v := metadata.get("generateName")) is str
                     else "" if v is None else _string(v, "request.object.metadata.generateName"))
    old_obj = (m if type(m := request.get("oldObject")) is dict
               else None if m is None else _mapping(m, "request.oldObject"))
    username = (v if type(v := user.get("username")) is str
                else "" if v is None else _string(v, "request.userInfo.username"))
    return AdmissionRequest(api_version, uid, operation, GroupVersionKind(group, version, kind_name), resource_name,
                            sub_resource, namespace or None, name, generate_name, obj, old_obj, bool(dry_run), username)


def sanitize_warning(text: str) -> str:
    """One line of at most 120 characters with no control characters (the API server drops those silently).

    A longer warning keeps its end, the fix after its last "; ", and shortens what comes before: whoever reads
    kubectl's `Warning:` line must still see how to fix it (`check` and the logs keep the whole text).
    """
    cleaned = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in text)
    cleaned = " ".join(cleaned.split())
    if len(cleaned) <= WARNING_MAX_CHARS:
        return cleaned
    head, separator, fix = cleaned.rpartition("; ")
    if separator and len(fix) <= WARNING_MAX_CHARS // 2:
        room = WARNING_MAX_CHARS - len(fix) - len("...; ")
        cut = head[:room]
        if " " in cut[room // 2:]:
            cut = cut.rsplit(" ", 1)[0]  # at a word boundary
        return f"{cut.rstrip(' ,:;')}...; {fix}"
    return cleaned[: WARNING_MAX_CHARS - 3].rstrip() + "..."


def sanitize_warnings(texts: Iterable[str], limit: int = WARNINGS_MAX) -> tuple[str, ...]:
    """Sanitized, de-duplicated, empty ones dropped, at most `limit` (the last one then counts the rest)."""
    unique = list(dict.fromkeys(w for w in map(sanitize_warning, texts) if w))
    if len(unique) <= limit:
        return tuple(unique)
    kept = unique[: limit - 1]
    return (*kept, f"... and {len(unique) - len(kept)} more warnings")


@functools.lru_cache(maxsize=256)
def audit_key(key: str) -> str | None:
    """A key the API server accepts under `<webhook>/`: no '/', [-_.A-Za-z0-9], alphanumeric ends, <= 63."""
    cleaned = _AUDIT_KEY_BAD.sub("-", key)[:AUDIT_KEY_MAX].strip("-_.")
    return cleaned or None


def build_response(request: AdmissionRequest, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview answer, in the request's apiVersion, echoing its uid."""
    response: dict[str, Any] = {"uid": request.uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "status": "Failure",
            "code": 403,
            "reason": "Forbidden",
            "message": decision.message or "denied by GPU policy",
        }
    elif decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = decision.encoded_patch or encode_patch(decision.patch)
    warnings = sanitize_warnings(decision.warnings) if decision.warnings else ()
    if warnings:
        response["warnings"] = list(warnings)
    annotations = {}
    for key, value in decision.audit_annotations.items():
        clean = audit_key(key)
        if clean is not None:
            annotations[clean] = value
    if annotations:
        response["auditAnnotations"] = annotations
    return {"apiVersion": request.api_version, "kind": "AdmissionReview", "response": response}


def error_status(code: int, message: str) -> dict[str, Any]:
    """A metav1.Status body for a 4xx: the API server shows its message when a call fails."""
    reasons = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 413: "RequestEntityTooLarge"}
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reasons.get(code, "BadRequest" if code < 500 else "InternalError"),
        "message": message,
    }
