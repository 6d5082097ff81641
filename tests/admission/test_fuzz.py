"""Hostile input, property-based: whatever arrives, the answer is a JSON 4xx or a correct AdmissionReview.

Many examples through Flask's test client (the whole app: routing, body cap, parsing, engine, patch), a
smaller number against a real gunicorn over TLS (the worker's own parsing, error pages and connection
handling). For every answer:
  * never a 5xx, never HTML; a 4xx has a JSON metav1.Status body;
  * a 200 is an AdmissionReview in the request's apiVersion whose uid matches;
  * a patch is base64 of a JSON Patch that applies (jsonpatch) and yields an object a second /mutate does
    not patch again; for schema-shaped Pods the patched Pod passes kubernetes-validate (strict).
The long variants (`-m slow`) only raise the example counts.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from support.admission import (
    CAPTURED,
    GPU_REVIEW,
    REVIEWS,
    Pki,
    RecordedCluster,
    Server,
    body,
    client_context,
    kubelet_write,
    review,
    start_server,
)
from support.pod_strategies import garbled_pods, pods, validator

from webhook.admission.app import create_app, server_of
from webhook.admission.settings import Settings

FAST = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
WIRE = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
LONG = settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
CAP = 64 * 1024
BASE = GPU_REVIEW
FIXTURES = ["pod-create-from-replicaset-gpu", "pod-create-gpu-mismatch", "deployment-create-gpu-template",
            "cronjob-create-gpu-mismatch", "pod-update-label", "pod-delete", "pod-create-v1beta1",
            "pod-create-sidecar-gpu", "pod-status-update"]

# --- strategies ---------------------------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda children: st.one_of(
    st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=5)), max_leaves=30)
POD_KEYS = st.sampled_from(["apiVersion", "kind", "metadata", "spec", "containers", "initContainers",
                            "resources", "limits", "requests", "nvidia.com/gpu", "labels", "annotations",
                            "nodeSelector", "tolerations", "runtimeClassName", "template", "jobTemplate",
                            "ephemeralContainers", "name", "namespace", "restartPolicy", "resourceClaims"])
POD_LIKE = st.recursive(SCALARS | st.sampled_from(["1", "2", "500m", "Pod", "v1", "Always", "nvidia"]),
                        lambda children: st.one_of(st.lists(children, max_size=4),
                                                   st.dictionaries(POD_KEYS, children, max_size=6)),
                        max_leaves=40)
KINDS = st.sampled_from(["Pod", "Deployment", "Job", "CronJob", "StatefulSet", "DaemonSet", "ReplicaSet",
                         "PodTemplate", "ReplicationController", "ConfigMap", "", "pod"])
OPERATIONS = st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])
CONTENT_TYPES = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=x", "application/yaml", "",
                                 "application/json; charset=latin-1", "text/html"])


def envelope(obj: Any, kind: str = "Pod", operation: str = "CREATE", uid: str = "u-1",
             api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    """An otherwise valid AdmissionReview around `obj`."""
    document = copy.deepcopy(BASE)
    document["apiVersion"] = api_version
    request = document["request"]
    request.update(uid=uid, operation=operation, object=obj)
    request["kind"] = dict(request["kind"], kind=kind)
    if isinstance(obj, dict) and operation == "UPDATE":
        request["oldObject"] = obj
    return document


@st.composite
def reviews_with(draw: st.DrawFn, objects: st.SearchStrategy[Any]) -> dict[str, Any]:
    return envelope(draw(objects), draw(KINDS), draw(OPERATIONS), draw(st.text(min_size=1, max_size=40)),
                    draw(st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])))


# --- the contract every answer keeps --------------------------------------------------------------


def check_answer(status: int, content_type: str, raw: bytes, sent: Any, mutate_again: Any = None, *,
                 apply: bool = True) -> dict[str, Any]:
    """Assert the contract for one answer; returns the parsed JSON (`apply=False`: do not apply the patch)."""
    assert status < 500, (status, raw[:300])
    assert content_type.split(";")[0].strip() == "application/json", (content_type, raw[:200])
    assert not raw.lstrip().lower().startswith((b"<!doctype", b"<html")), raw[:200]
    document: dict[str, Any] = orjson.loads(raw)
    if status != 200:
        assert 400 <= status < 500
        assert document["kind"] == "Status" and document["code"] == status and document["message"]
        return document
    assert isinstance(sent, dict)
    assert document["kind"] == "AdmissionReview" and document["apiVersion"] == sent["apiVersion"]
    response = document["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert "patch" not in response and response["status"]["code"] == 403
    if "patch" in response and not apply:
        assert response["patchType"] == "JSONPatch" and base64.b64decode(response["patch"], validate=True)
    elif "patch" in response:
        assert response["patchType"] == "JSONPatch"
        operations = json.loads(base64.b64decode(response["patch"], validate=True))
        assert isinstance(operations, list) and operations
        patched = jsonpatch.apply_patch(sent["request"]["object"], operations)
        if mutate_again is not None:
            again = mutate_again(dict(sent, request=dict(sent["request"], uid="again", object=patched)))
            assert again["allowed"] is True and "patch" not in again, again
        document["_patched"] = patched
    else:
        assert "patchType" not in response
    return document


# --- through Flask's test client ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def app() -> Iterator[Flask]:
    app = create_app(Settings(rules_poll_seconds=0, max_body_bytes=CAP, log_level="WARNING"),
                     registry=CollectorRegistry())
    yield app
    server_of(app).store.stop()


@pytest.fixture(scope="module")
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def send(client: FlaskClient, path: str, data: bytes, content_type: str = "application/json"
         ) -> tuple[int, str, bytes]:
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post(path, data=data, headers=headers)
    return response.status_code, response.headers.get("Content-Type", ""), response.data


def mutate_via(client: FlaskClient) -> Any:
    def again(document: dict[str, Any]) -> dict[str, Any]:
        status, _content_type, raw = send(client, "/mutate", body(document))
        assert status == 200, raw[:300]
        result: dict[str, Any] = json.loads(raw)["response"]
        return result
    return again


ENDPOINTS = st.sampled_from(["/mutate", "/validate"])


@FAST
@given(payload=JSON, path=ENDPOINTS)
def test_arbitrary_json(client: FlaskClient, payload: Any, path: str) -> None:
    status, content_type, raw = send(client, path, json.dumps(payload).encode())
    check_answer(status, content_type, raw, payload)


@FAST
@given(document=reviews_with(POD_LIKE), path=ENDPOINTS)
def test_pod_like_objects_in_valid_reviews(client: FlaskClient, document: dict[str, Any], path: str) -> None:
    status, content_type, raw = send(client, path, body(document))
    check_answer(status, content_type, raw, document, mutate_via(client))


@FAST
@given(obj=st.one_of(pods(), garbled_pods()), operation=OPERATIONS, path=ENDPOINTS)
def test_schema_shaped_and_garbled_pods(client: FlaskClient, obj: dict[str, Any], operation: str, path: str) -> None:
    document = envelope(obj, "Pod", operation)
    status, content_type, raw = send(client, path, body(document))
    check_answer(status, content_type, raw, document, mutate_via(client))


@FAST
@given(obj=pods())
def test_patched_schema_shaped_pods_are_valid_pods(client: FlaskClient, obj: dict[str, Any]) -> None:
    document = envelope(obj)
    status, content_type, raw = send(client, "/mutate", body(document))
    answer = check_answer(status, content_type, raw, document, mutate_via(client))
    kv = validator()
    if kv is not None and "_patched" in answer:
        try:
            kv.validate(answer["_patched"], kv.latest_version(), True)
        except kv.ValidationError as err:
            pytest.fail(f"kubernetes-validate --strict: {str(err).splitlines()[0]}")


@FAST
@given(fixture=st.sampled_from(FIXTURES), cut=st.floats(0, 1, exclude_max=True), path=ENDPOINTS)
def test_truncated_bodies(client: FlaskClient, fixture: str, cut: float, path: str) -> None:
    data = body(review(fixture))
    status, content_type, raw = send(client, path, data[: int(len(data) * cut)])
    assert status == 400
    check_answer(status, content_type, raw, None)


@FAST
@given(fixture=st.sampled_from(FIXTURES), content_type=CONTENT_TYPES, path=ENDPOINTS)
def test_wrong_content_types(client: FlaskClient, fixture: str, content_type: str, path: str) -> None:
    document = review(fixture)
    status, got_type, raw = send(client, path, body(document), content_type)
    check_answer(status, got_type, raw, document, mutate_via(client))


@FAST
@given(data=st.binary(max_size=2048), path=ENDPOINTS)
def test_arbitrary_bytes(client: FlaskClient, data: bytes, path: str) -> None:
    status, content_type, raw = send(client, path, data)
    check_answer(status, content_type, raw, None)


@FAST
@given(junk=st.binary(min_size=1, max_size=8).filter(lambda b: not _utf8(b)), where=st.integers(0, 10**6))
def test_non_utf8_inside_a_valid_review(client: FlaskClient, junk: bytes, where: int) -> None:
    data = body(review("pod-create-from-replicaset-gpu"))
    strings = [i for i in range(len(data)) if data[i:i + 1] == b'"']
    at = strings[where % len(strings)] + 1  # inside a JSON string (or right after one)
    status, content_type, raw = send(client, "/mutate", data[:at] + junk + data[at:])
    assert status == 400
    check_answer(status, content_type, raw, None)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _deep(depth: int) -> bytes:
    """JSON text nested `depth` levels (lists and objects alternating), built as text: no recursion here."""
    opening = b"".join(b"[" if i % 2 else b'{"a":' for i in range(depth))
    closing = b"".join(b"]" if i % 2 else b"}" for i in reversed(range(depth)))
    return opening + b'"x"' + closing


DEPTHS = [10, 200, 1000, 1023, 1025, 5000, 12_000]


def _deep_cases() -> list[Any]:
    cases = []
    for where in ("body", "labels", "containers", "resources", "tolerations"):
        for depth in DEPTHS:
            cases.append(pytest.param(where, depth, id=f"{where}-{depth}"))
    return cases


@pytest.mark.parametrize(("where", "depth"), _deep_cases())
def test_deep_nesting(client: FlaskClient, where: str, depth: int) -> None:
    """Deep structures where the engine looks: a JSON 4xx when too deep to decode, else a normal answer."""
    document = copy.deepcopy(BASE)
    spec = document["request"]["object"]["spec"]
    placeholder = "__DEEP__"
    if where == "labels":
        document["request"]["object"]["metadata"]["labels"] = {"deep": placeholder}
    elif where == "containers":
        spec["containers"].append({"name": "deep", "image": "x", "env": placeholder})
    elif where == "resources":
        spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = placeholder
    elif where == "tolerations":
        spec["tolerations"] = [placeholder]
    raw_body = _deep(depth) if where == "body" else body(document).replace(b'"__DEEP__"', _deep(depth))
    assert len(raw_body) <= CAP
    for path in ("/mutate", "/validate"):
        status, content_type, raw = send(client, path, raw_body)
        sent = orjson.loads(raw_body) if status == 200 else None
        shallow = depth < 500  # jsonpatch (deepcopy) and json recurse: do not apply deep patches here
        check_answer(status, content_type, raw, sent, mutate_via(client) if shallow else None, apply=shallow)


@pytest.mark.parametrize("size", [CAP - 1, CAP, CAP + 1, 10 * CAP])
def test_huge_bodies(client: FlaskClient, size: int) -> None:
    """A valid review padded to `size` bytes: answered up to the cap, 413 with JSON beyond it."""
    document = copy.deepcopy(BASE)
    document["request"]["object"]["metadata"]["annotations"] = {"pad": ""}
    pad = size - len(body(document))
    document["request"]["object"]["metadata"]["annotations"]["pad"] = "p" * max(pad, 0)
    data = body(document)
    assert len(data) == size
    status, content_type, raw = send(client, "/mutate", data)
    assert status == (200 if size <= CAP else 413)
    check_answer(status, content_type, raw, document)


def test_many_containers_and_keys(client: FlaskClient) -> None:
    """Wide rather than deep: 2,000 containers, 5,000 labels (under the cap of a real server, 8 MiB)."""
    app = create_app(Settings(rules_poll_seconds=0, log_level="WARNING"), registry=CollectorRegistry())
    try:
        wide = app.test_client()
        document = copy.deepcopy(BASE)
        base = document["request"]["object"]["spec"]["containers"][0]
        document["request"]["object"]["spec"]["containers"] = [dict(base, name=f"c{i}") for i in range(2000)]
        document["request"]["object"]["metadata"]["labels"] = {f"k{i}": "v" for i in range(5000)}
        for path in ("/mutate", "/validate"):
            status, content_type, raw = send(wide, path, body(document))
            check_answer(status, content_type, raw, document, mutate_via(wide))
    finally:
        server_of(app).store.stop()


# --- against a real gunicorn over TLS ------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, ssl.SSLContext]]:
    tmp: Path = tmp_path_factory.mktemp("fuzz-wire")
    pki = Pki()
    kubelet_write(tmp / "tls", pki.secret())
    trust = client_context(pki.ca)
    server = start_server(tmp, "--tls-dir", str(tmp / "tls"), "--max-body-bytes", str(CAP), "--log-level",
                          "WARNING", trust=trust)
    try:
        yield server, trust
    finally:
        server.stop()


class Wire:
    """One keep-alive connection, reopened when the server closes it (after a 4xx it may)."""

    def __init__(self, server: Server, trust: ssl.SSLContext) -> None:
        self.server, self.trust = server, trust
        self.conn: http.client.HTTPSConnection | None = None

    def post(self, path: str, data: bytes, content_type: str = "application/json") -> tuple[int, str, bytes]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = self.server.connection(self.trust)
            try:
                headers = {"Content-Type": content_type} if content_type else {}
                self.conn.request("POST", path, body=data, headers=headers)
                response = self.conn.getresponse()
                raw = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return response.status, response.getheader("Content-Type", ""), raw
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def mutate_again(self) -> Any:
        def again(document: dict[str, Any]) -> dict[str, Any]:
            status, _, raw = self.post("/mutate", body(document))
            assert status == 200, raw[:300]
            result: dict[str, Any] = json.loads(raw)["response"]
            return result
        return again


@pytest.fixture(scope="module")
def wire(tls_server: tuple[Server, ssl.SSLContext]) -> Iterator[Wire]:
    w = Wire(*tls_server)
    yield w
    if w.conn is not None:
        w.conn.close()


@WIRE
@given(document=st.one_of(reviews_with(POD_LIKE), reviews_with(pods()), JSON), path=ENDPOINTS)
def test_wire_reviews(wire: Wire, document: Any, path: str) -> None:
    status, content_type, raw = wire.post(path, json.dumps(document).encode())
    check_answer(status, content_type, raw, document, wire.mutate_again())


@WIRE
@given(data=st.binary(max_size=4096), content_type=CONTENT_TYPES, path=ENDPOINTS)
def test_wire_bytes_and_content_types(wire: Wire, data: bytes, content_type: str, path: str) -> None:
    status, got_type, raw = wire.post(path, data, content_type)
    check_answer(status, got_type, raw, None)


@WIRE
@given(fixture=st.sampled_from(FIXTURES), cut=st.floats(0, 1, exclude_max=True))
def test_wire_truncated(wire: Wire, fixture: str, cut: float) -> None:
    data = body(review(fixture))
    status, content_type, raw = wire.post("/mutate", data[: int(len(data) * cut)])
    assert status == 400
    check_answer(status, content_type, raw, None)


@pytest.mark.parametrize("size", [CAP, CAP + 1, 4 * CAP])
def test_wire_oversized(wire: Wire, size: int) -> None:
    document = copy.deepcopy(BASE)
    document["request"]["object"]["metadata"]["annotations"] = {"pad": ""}
    document["request"]["object"]["metadata"]["annotations"]["pad"] = "p" * (size - len(body(document)))
    status, content_type, raw = wire.post("/mutate", body(document))
    assert status == (200 if size <= CAP else 413)
    check_answer(status, content_type, raw, document)


def test_wire_deep_gpu_quantity(wire: Wire) -> None:
    """The same bug over the wire: a GPU limit nested 1000 levels deep gets a 500 from gunicorn's worker."""
    data = body(BASE).replace(b'"nvidia.com/gpu": "1"', b'"nvidia.com/gpu": ' + _deep(1000), 1)
    assert data != body(BASE)
    status, content_type, raw = wire.post("/mutate", data)
    check_answer(status, content_type, raw, orjson.loads(data))


def test_wire_deep_nesting(wire: Wire) -> None:
    status, content_type, raw = wire.post("/mutate", b"[" * 5000 + b"]" * 5000)
    assert status == 400
    check_answer(status, content_type, raw, None)


# --- one value of a real body replaced by a value of another JSON type -------------------------------
#
# The bodies the API server really sends (tests/data/admission-reviews, copies of the shared fixtures, and the
# reviews captured from the e2e control plane in tests/e2e/captured), each also without `request.namespace`
# (the engine then reads the object's own metadata.namespace): any one value, anywhere, becomes an object, a
# list, a string, a number, a bool or null. Whatever the field, the answer keeps the contract: a JSON 4xx
# naming the field the decision needs, or a judged AdmissionReview with the uid echoed and a patch that applies.

REAL_BODIES = sorted([*REVIEWS.glob("*.json"), *CAPTURED.glob("*.json")])
JSON_TYPES = {"object": dict, "list": list, "string": str, "number": (int, float), "bool": bool, "null": type(None)}
OF_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "object": st.one_of(st.just({}), st.dictionaries(POD_KEYS, SCALARS, min_size=1, max_size=3),
                        st.just({"nvidia.com/gpu": 0})),
    "list": st.one_of(st.just([]), st.lists(SCALARS, min_size=1, max_size=3)),
    "string": st.one_of(st.sampled_from(["", "1", "x", "nvidia.com/gpu", "default", "Pod"]), st.text(max_size=8)),
    "number": st.one_of(st.integers(-3, 3), st.integers(-(2**70), 2**70), st.floats(allow_nan=False,
                                                                                     allow_infinity=False)),
    "bool": st.booleans(),
    "null": st.none(),
}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return next(name for name, types in JSON_TYPES.items() if name != "bool" and isinstance(value, types))


def _paths(node: Any, path: tuple[str | int, ...] = (), *, skip: frozenset[str] = frozenset()
           ) -> Iterator[tuple[str | int, ...]]:
    if path:
        yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        if key not in skip:
            yield from _paths(child, (*path, key), skip=skip)


def _real_body(name: Path, keep_namespace: bool) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(name.read_text())
    if not keep_namespace:
        document["request"].pop("namespace", None)
    return document


@st.composite
def retyped_real_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A real review body with one value (any depth, the envelope included) of another JSON type."""
    document = _real_body(draw(st.sampled_from(REAL_BODIES)), draw(st.booleans()))
    path = draw(st.sampled_from(list(_paths(document))))
    parent: Any = document
    for step in path[:-1]:
        parent = parent[step]
    new_type = draw(st.sampled_from(sorted(set(JSON_TYPES) - {_json_type(parent[path[-1]])})))
    parent[path[-1]] = draw(OF_TYPE[new_type])
    return document


def _sent(document: dict[str, Any]) -> Any:
    """What `check_answer` compares with: the body as the server decoded it."""
    return orjson.loads(body(document))


@FAST
@given(document=retyped_real_bodies(), path=ENDPOINTS)
def test_real_bodies_with_one_value_retyped(client: FlaskClient, document: dict[str, Any], path: str) -> None:
    status, content_type, raw = send(client, path, body(document))
    check_answer(status, content_type, raw, _sent(document), mutate_via(client))


@pytest.fixture(scope="module")
def aware_client() -> Iterator[FlaskClient]:
    """The app with cluster awareness over the recorded cluster (tests/data/kube): the inventory checks run too."""
    app = create_app(Settings(rules_poll_seconds=0, max_body_bytes=CAP, log_level="WARNING"),
                     registry=CollectorRegistry(), inventory=RecordedCluster())
    yield app.test_client()
    server_of(app).store.stop()


@FAST
@given(document=retyped_real_bodies(), path=ENDPOINTS)
def test_real_bodies_with_one_value_retyped_cluster_aware(aware_client: FlaskClient, document: dict[str, Any],
                                                          path: str) -> None:
    status, content_type, raw = send(aware_client, path, body(document))
    check_answer(status, content_type, raw, _sent(document), mutate_via(aware_client))


@WIRE
@given(document=retyped_real_bodies(), path=ENDPOINTS)
def test_wire_real_bodies_with_one_value_retyped(wire: Wire, document: dict[str, Any], path: str) -> None:
    status, content_type, raw = wire.post(path, body(document))
    check_answer(status, content_type, raw, _sent(document), wire.mutate_again())


OPAQUE = frozenset({"managedFields"})  # the field managers' bookkeeping, never read (the property above samples it)
ONE_OF_EACH_TYPE = {"object": {"nvidia.com/gpu": 0}, "list": [1, "a"], "string": "x", "number": 3, "bool": True,
                    "null": None}


@pytest.mark.parametrize("keep_namespace", [True, False], ids=["as-sent", "without-request-namespace"])
@pytest.mark.parametrize("name", REAL_BODIES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_value_of_a_real_body_retyped(app: Flask, name: Path, keep_namespace: bool) -> None:
    """Exhaustive where the property above samples: every value (but managedFields'), one of each other JSON
    type, through the server's answer (parse, engine, patch, response), the patch applied; a 5xx is an exception."""
    server = server_of(app)
    original = _real_body(name, keep_namespace)
    for path in _paths(original, skip=OPAQUE):
        for new_type, value in ONE_OF_EACH_TYPE.items():
            document = _real_body(name, keep_namespace)
            parent: Any = document
            for step in path[:-1]:
                parent = parent[step]
            if _json_type(parent[path[-1]]) == new_type:
                continue
            parent[path[-1]] = copy.deepcopy(value)
            status, answer = server.answer("mutate", body(document))
            check_answer(status, "application/json", orjson.dumps(answer), document)


# Keys the engine, the inventory checks and the patch read (`.get("...")` in webhook/policy), and the label,
# annotation and resource names of the packaged rules: absent from most real bodies, so inserted, not replaced.
READ_KEYS = [
    "affinity", "annotations", "apiVersion", "claims", "containers", "deviceClassName", "devices", "effect", "env",
    "exactly", "firstAvailable", "generateName", "initContainers", "jobTemplate", "key", "kind", "labels", "limits",
    "matchExpressions", "matchFields", "metadata", "name", "namespace", "nodeAffinity", "nodeName", "nodeSelector",
    "nodeSelectorTerms", "operator", "ownerReferences", "priorityClassName", "requests",
    "requiredDuringSchedulingIgnoredDuringExecution", "resourceClaimName", "resourceClaimTemplateName",
    "resourceClaims", "resources", "restartPolicy", "runtimeClassName", "schedulerName", "spec", "template",
    "tolerationSeconds", "tolerations", "value", "values", "gpu-webhook.io/class", "gpu-webhook.io/gpu-type",
    "gpu-webhook.io/ignore", "gpu-webhook.io/workload", "kubernetes.io/config.mirror", "nvidia.com/gpu",
    "nvidia.com/gpu.product", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "NVIDIA_VISIBLE_DEVICES",
]
INSERTED = ["pod-create-from-replicaset-gpu", "deployment-create-gpu-template", "cronjob-create-gpu-mismatch",
            "pod-update-label", "pod-create-sidecar-gpu"]


def _objects(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if isinstance(node, dict):
        yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _objects(child, (*path, key))


@pytest.mark.slow
@pytest.mark.parametrize("keep_namespace", [True, False], ids=["as-sent", "without-request-namespace"])
@pytest.mark.parametrize("name", INSERTED)
def test_keys_the_engine_reads_inserted_with_every_type(name: str, keep_namespace: bool) -> None:
    """Into every object of a real body, each key the engine reads, with a value of each JSON type, through the
    cluster-aware server: about 10,000 answers a body (`-m slow`: minutes)."""
    app = create_app(Settings(rules_poll_seconds=0, log_level="WARNING"), registry=CollectorRegistry(),
                     inventory=RecordedCluster())
    server = server_of(app)
    try:
        original = _real_body(REVIEWS / f"{name}.json", keep_namespace)
        for path in _objects(original):
            for key in READ_KEYS:
                for value in (*ONE_OF_EACH_TYPE.values(), [{"name": "x"}], "1"):
                    document = _real_body(REVIEWS / f"{name}.json", keep_namespace)
                    target: Any = document
                    for step in path:
                        target = target[step]
                    target[key] = copy.deepcopy(value)
                    status, answer = server.answer("mutate", body(document))
                    check_answer(status, "application/json", orjson.dumps(answer), document)
    finally:
        server.store.stop()


@pytest.mark.parametrize(("endpoint"), ["/mutate", "/validate"])
def test_object_namespace_of_another_type_is_a_400_naming_it(client: FlaskClient, endpoint: str) -> None:
    """The body that gave a 500 (TypeError: unhashable dict) before metadata.namespace was read as a string."""
    document = review("pod-create-from-replicaset-gpu")
    document["request"].pop("namespace")
    document["request"]["object"]["metadata"]["namespace"] = {"nvidia.com/gpu": 0}
    document["request"]["object"]["spec"]["containers"][0]["terminationMessagePath"] = {"nvidia.com/gpu": 0}
    status, content_type, raw = send(client, endpoint, body(document))
    answer = check_answer(status, content_type, raw, document)
    assert status == 400
    assert answer["message"] == "request.object.metadata.namespace must be a string, got dict"


def test_object_namespace_stands_in_for_a_missing_request_namespace(client: FlaskClient) -> None:
    """Without `request.namespace` the object's own namespace is the one judged (an exempt one stays exempt)."""
    document = review("pod-create-from-replicaset-gpu")
    document["request"].pop("namespace")
    document["request"]["object"]["metadata"]["namespace"] = "kube-system"
    status, content_type, raw = send(client, "/mutate", body(document))
    response = check_answer(status, content_type, raw, document)["response"]
    assert response["allowed"] is True and "patch" not in response


# --- long variants -----------------------------------------------------------------------------------



@pytest.mark.slow
@LONG
@given(document=st.one_of(reviews_with(POD_LIKE), reviews_with(pods()), reviews_with(garbled_pods()), JSON),
       path=ENDPOINTS)
def test_long_app_fuzz(long_run: None, client: FlaskClient, document: Any, path: str) -> None:
    status, content_type, raw = send(client, path, json.dumps(document).encode())
    check_answer(status, content_type, raw, document, mutate_via(client))


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(document=st.one_of(reviews_with(POD_LIKE), reviews_with(pods()), JSON), path=ENDPOINTS)
def test_long_wire_fuzz(long_run: None, wire: Wire, document: Any, path: str) -> None:
    status, content_type, raw = wire.post(path, json.dumps(document).encode())
    check_answer(status, content_type, raw, document, wire.mutate_again())
