"""The admission contract through Flask's test client: every point of KUBERNETES-CONTRACT.md §1-2 the
server owns, against the fixtures of real kube-apiserver requests and the real engine and rules."""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from support.admission import Pki, body, kubelet_write, review, rules_files, with_uid

from webhook.admission import logs
from webhook.admission.app import create_app, server_of
from webhook.admission.loader import load_policy
from webhook.admission.policy_store import PolicyStore
from webhook.admission.settings import Settings
from webhook.admission.tls import ServingTls
from webhook.policy.engine import Context, evaluate

FIXTURES = sorted(p.stem for p in (Path(__file__).parents[1] / "data" / "admission-reviews").glob("*.json"))
DENIED = ["pod-create-gpu-mismatch", "pod-create-gpu-requests-only", "pod-create-gpu-fraction",
          "cronjob-create-gpu-mismatch"]
PATCHED = ["pod-create-from-replicaset-gpu", "pod-create-limits-only-defaulted", "pod-create-sidecar-gpu",
           "pod-create-gpu-dry-run", "pod-create-v1beta1"]
UNTOUCHED = ["pod-create-no-gpu", "pod-delete", "pod-update-label", "pod-status-update"]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def app(registry: CollectorRegistry) -> Iterator[Flask]:
    app = create_app(Settings(rules_poll_seconds=0, max_body_bytes=64 * 1024), registry=registry)
    yield app
    server_of(app).store.stop()



def call(client: FlaskClient, path: str, document: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    data = document if isinstance(document, bytes) else body(document)
    response = client.post(path, data=data, content_type="application/json", **kwargs)
    assert response.mimetype == "application/json", response.data[:200]
    return response.status_code, response.get_json()


def patched(document: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The object after applying the response's patch (as kube-apiserver would)."""
    obj: dict[str, Any] = document["request"]["object"]
    if "patch" not in response:
        return obj
    operations = json.loads(base64.b64decode(response["patch"], validate=True))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, operations)
    return result


# --- every fixture, both endpoints: the shape kube-apiserver requires ---------------------------


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_every_response_is_a_valid_admission_review(client: FlaskClient, fixture: str, endpoint: str) -> None:
    document = review(fixture)
    status, answer = call(client, f"/{endpoint}?timeout=10s", document)
    assert status == 200
    assert answer["apiVersion"] == document["apiVersion"]
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == document["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert response["status"]["code"] == 403
        assert response["status"]["message"]
        assert "patch" not in response and "patchType" not in response
    if endpoint == "validate":
        assert "patch" not in response and "patchType" not in response
    if "patch" in response or "patchType" in response:
        assert response["patchType"] == "JSONPatch"
        assert json.loads(base64.b64decode(response["patch"], validate=True))
    for warning in response.get("warnings", []):
        assert len(warning) <= 120 and warning.isprintable()
    assert all("/" not in key for key in response.get("auditAnnotations", {}))


@pytest.mark.parametrize("fixture", DENIED)
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_denial_lists_every_violation(client: FlaskClient, fixture: str, endpoint: str) -> None:
    document = review(fixture)
    status, answer = call(client, f"/{endpoint}", document)
    response = answer["response"]
    assert status == 200
    assert response["allowed"] is False
    assert set(response) >= {"uid", "allowed", "status"} and not set(response) & {"patch", "patchType"}
    request = document["request"]
    verdict = evaluate(load_policy(None), request["object"],
                       Context(request["namespace"], request["operation"], endpoint))  # type: ignore[arg-type]
    assert verdict.violations
    for violation in verdict.violations:
        assert violation.render() in response["status"]["message"]


@pytest.mark.parametrize("fixture", PATCHED)
def test_mutation_then_validation_of_the_final_object(client: FlaskClient, fixture: str) -> None:
    document = review(fixture)
    _, answer = call(client, "/mutate", document)
    response = answer["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    final = patched(document, response)
    assert final != document["request"]["object"]
    # the validating webhook sees the mutated object and lets it through; unmutated, it holds the line
    _, validated = call(client, "/validate", review(fixture, object=final))
    assert validated["response"]["allowed"] is True, validated["response"].get("status")
    _, unmutated = call(client, "/validate", document)
    assert unmutated["response"]["allowed"] is False
    # idempotent: mutating the final object again changes nothing
    _, again = call(client, "/mutate", review(fixture, object=final))
    assert "patch" not in again["response"] and again["response"]["allowed"] is True


@pytest.mark.parametrize("fixture", UNTOUCHED)
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_allowed_without_changes_has_no_patch_keys(client: FlaskClient, fixture: str, endpoint: str) -> None:
    _, answer = call(client, f"/{endpoint}", review(fixture))
    response = answer["response"]
    assert response["allowed"] is True
    assert not set(response) & {"patch", "patchType", "status"}


def test_v1beta1_is_answered_in_v1beta1(client: FlaskClient) -> None:
    _, answer = call(client, "/mutate", review("pod-create-v1beta1"))
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"


def test_dry_run_gets_exactly_the_same_answer(client: FlaskClient, registry: CollectorRegistry) -> None:
    dry = review("pod-create-gpu-dry-run")
    wet = copy.deepcopy(dry)
    wet["request"]["dryRun"] = False
    wet["request"]["options"] = {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
    for endpoint in ("mutate", "validate"):
        assert call(client, f"/{endpoint}", dry) == call(client, f"/{endpoint}", wet)


# --- operations and subresources --------------------------------------------------------------


GPU_POD = review("pod-create-from-replicaset-gpu")["request"]["object"]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"subResource": "status", "operation": "UPDATE", "oldObject": GPU_POD}, id="status"),
        pytest.param({"subResource": "ephemeralcontainers", "operation": "UPDATE", "oldObject": GPU_POD},
                     id="ephemeralcontainers"),
        pytest.param({"subResource": "binding", "operation": "CREATE",
                      "object": {"apiVersion": "v1", "kind": "Binding", "target": {"name": "node-1"}}},
                     id="binding"),
        pytest.param({"subResource": "resize", "operation": "UPDATE", "oldObject": GPU_POD}, id="resize"),
        pytest.param({"operation": "UPDATE", "oldObject": GPU_POD}, id="update"),
        pytest.param({"operation": "DELETE", "object": None, "oldObject": GPU_POD}, id="delete"),
        pytest.param({"operation": "CONNECT", "subResource": "exec",
                      "object": {"apiVersion": "v1", "kind": "PodExecOptions", "command": ["sh"]}}, id="connect"),
        pytest.param({"kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                      "object": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"nvidia.com/gpu": "1"}}},
                     id="unknown-kind"),
    ],
)
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_allowed_untouched(client: FlaskClient, changes: dict[str, Any], endpoint: str) -> None:
    # the GPU pod as object: it would be patched on CREATE, but never on these
    document = review("pod-create-from-replicaset-gpu", **changes)
    _, answer = call(client, f"/{endpoint}", document)
    response = answer["response"]
    assert response["allowed"] is True
    assert not set(response) & {"patch", "patchType", "status"}


# --- malformed calls: 4xx with a JSON body, and the server keeps serving ----------------------


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        pytest.param(b"", 400, id="empty"),
        pytest.param(b"<html>", 400, id="not-json"),
        pytest.param(b"\xff\xfe", 400, id="not-utf8"),
        pytest.param(b"[" * 50_000, 400, id="deep-nesting"),
        pytest.param(body({"apiVersion": "v1", "kind": "Pod"}), 400, id="not-a-review"),
        pytest.param(body({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), 400, id="no-request"),
        pytest.param(body({**review("pod-create-no-gpu"), "apiVersion": "admission.k8s.io/v9"}), 400,
                     id="unknown-apiversion"),
        pytest.param(body(review("pod-create-no-gpu", uid="")), 400, id="no-uid"),
        pytest.param(body(review("pod-create-no-gpu", object="Pod")), 400, id="object-not-object"),
        pytest.param(b"x" * (64 * 1024 + 1), 413, id="over-the-cap"),
    ],
)
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_malformed_calls_get_a_json_4xx(client: FlaskClient, registry: CollectorRegistry, payload: bytes,
                                        code: int, endpoint: str) -> None:
    status, answer = call(client, f"/{endpoint}", payload)
    assert status == code
    assert answer["kind"] == "Status" and answer["status"] == "Failure" and answer["code"] == code
    assert answer["message"]
    assert registry.get_sample_value("gpu_webhook_bad_requests_total",
                                     {"endpoint": endpoint, "code": str(code)}) == 1
    status, _ = call(client, f"/{endpoint}", review("pod-create-no-gpu"))
    assert status == 200


def test_chunked_body_over_the_cap_is_413(client: FlaskClient) -> None:
    # no Content-Length: the cap applies while reading (gunicorn marks such input terminated)
    response = client.post("/mutate", input_stream=io.BytesIO(b"x" * (100 * 1024)),
                           headers={"Transfer-Encoding": "chunked"}, content_type="application/json",
                           environ_overrides={"wsgi.input_terminated": True})
    assert response.status_code == 413 and response.mimetype == "application/json"


@pytest.mark.parametrize(("extra", "code"), [pytest.param(0, 200, id="exactly-the-cap"),
                                             pytest.param(1, 413, id="one-byte-over")])
def test_cap_boundary(client: FlaskClient, extra: int, code: int) -> None:
    raw = body(review("pod-create-no-gpu"))
    padded = raw + b" " * (64 * 1024 - len(raw) + extra)
    status, _ = call(client, "/mutate", padded)
    assert status == code


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        pytest.param("GET", "/mutate", 405, id="get-mutate"),
        pytest.param("PUT", "/validate", 405, id="put-validate"),
        pytest.param("POST", "/healthz", 405, id="post-healthz"),
        pytest.param("GET", "/nope", 404, id="unknown-path"),
        pytest.param("POST", "/mutate/extra", 404, id="sub-path"),
    ],
)
def test_wrong_routes_are_json_never_html(client: FlaskClient, method: str, path: str, code: int) -> None:
    response = client.open(path, method=method)
    assert response.status_code == code
    assert response.mimetype == "application/json"
    assert response.get_json()["code"] == code


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    obj=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
            st.sampled_from(["kind", "metadata", "spec", "containers", "resources", "limits", "requests",
                             "nvidia.com/gpu", "name", "labels", "template", "initContainers", "x"]),
            inner, max_size=5),
        max_leaves=25,
    ),
    kind=st.sampled_from(["Pod", "Deployment", "Job", "CronJob", "Other"]),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]),
)
def test_no_object_makes_the_server_fail(client: FlaskClient, obj: Any, kind: str, operation: str) -> None:
    if isinstance(obj, dict):
        obj = {"kind": kind, **obj}
    document = review("pod-create-no-gpu", object=obj, operation=operation)
    response = client.post("/mutate", data=body(document), content_type="application/json")
    assert response.mimetype == "application/json"
    assert response.status_code in (200, 400), response.get_json()


# --- health, readiness, metrics, logs ----------------------------------------------------------


def test_healthz(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200 and response.get_json() == {"status": "ok"}


def test_readyz_without_tls(client: FlaskClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.get_json()["checks"]["rules"]["digest"] == load_policy(None).digest


def test_readyz_follows_tls_material(tmp_path: Path, registry: CollectorRegistry) -> None:
    tls = ServingTls(tmp_path)
    app = create_app(Settings(rules_poll_seconds=0), tls=tls, registry=registry)
    assert app.test_client().get("/readyz").status_code == 503
    pki = Pki()
    leaf = pki.leaf()
    kubelet_write(tmp_path, pki.secret(leaf))
    response = app.test_client().get("/readyz")
    assert response.status_code == 200 and response.get_json()["checks"]["tls"]["ok"] is True
    assert registry.get_sample_value("gpu_webhook_tls_cert_not_after_timestamp_seconds") == \
        leaf.cert.not_valid_after_utc.timestamp()


def test_metrics_by_endpoint_kind_decision_and_rule(client: FlaskClient, registry: CollectorRegistry) -> None:
    call(client, "/mutate", review("pod-create-from-replicaset-gpu"))
    call(client, "/mutate", review("pod-create-gpu-requests-only"))
    call(client, "/validate", review("pod-create-no-gpu"))
    call(client, "/validate", review("cronjob-create-gpu-mismatch"))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("gpu_webhook_reviews_total", endpoint="mutate", kind="Pod", decision="patch") == 1
    assert value("gpu_webhook_reviews_total", endpoint="mutate", kind="Pod", decision="deny") == 1
    assert value("gpu_webhook_reviews_total", endpoint="validate", kind="Pod", decision="allow") == 1
    assert value("gpu_webhook_reviews_total", endpoint="validate", kind="CronJob", decision="deny") == 1
    assert value("gpu_webhook_rule_findings_total", endpoint="mutate", rule="gpu-limits-required",
                 effect="deny") == 1
    assert value("gpu_webhook_review_duration_seconds_count", endpoint="mutate") == 2
    assert value("gpu_webhook_review_duration_seconds_bucket", endpoint="mutate", le="0.005") is not None
    assert value("gpu_webhook_rules_active", digest=load_policy(None).digest) == 1


def test_kind_label_values_are_bounded(client: FlaskClient, registry: CollectorRegistry) -> None:
    call(client, "/mutate", review("pod-create-no-gpu", kind={"group": "x", "version": "v1", "kind": "Zz123"}))
    assert registry.get_sample_value("gpu_webhook_reviews_total",
                                     {"endpoint": "mutate", "kind": "other", "decision": "allow"}) == 1


def test_one_log_line_per_review_without_the_object(client: FlaskClient, caplog: pytest.LogCaptureFixture,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    document = review("pod-create-from-replicaset-gpu")
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="webhook.admission.review"):
        call(client, "/mutate", document)
    logs.flush()  # review lines are written in batches
    [line] = capfd.readouterr().err.splitlines()
    fields = json.loads(line)
    assert fields["logger"] == "webhook.admission.review" and fields["level"] == "info" and fields["ts"].endswith("Z")
    assert fields["uid"] == document["request"]["uid"]
    assert fields["namespace"] == "team-a"
    assert fields["name"] == "vllm-7d9c8b6f5-"  # generateName: the name does not exist yet
    assert fields["kind"] == "Pod" and fields["operation"] == "CREATE" and fields["decision"] == "patch"
    assert isinstance(fields["rules"], list) and fields["latency_ms"] >= 0
    assert "spec" not in line and "containers" not in line and "nvidia" not in line


def test_no_review_line_above_info(client: FlaskClient, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    logging.getLogger("webhook.admission.review").setLevel(logging.WARNING)
    try:
        call(client, "/mutate", review("pod-create-no-gpu"))
    finally:
        logging.getLogger("webhook.admission.review").setLevel(logging.NOTSET)
    logs.flush()
    assert capfd.readouterr().err == ""


def test_json_log_formatter_makes_one_line() -> None:
    from webhook.admission.logs import JsonFormatter

    record = logging.makeLogRecord({"name": "webhook.admission.review", "levelname": "INFO", "msg": "review",
                                    "fields": {"name": "a\nb", "uid": "u"}, "event": "review"})
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["name"] == "a\nb" and parsed["uid"] == "u" and parsed["logger"] == "webhook.admission.review"


# --- rules hot reload --------------------------------------------------------------------------


def test_rules_reload_refuses_invalid_and_keeps_the_last_good(
        tmp_path: Path, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture) -> None:
    rules = tmp_path / "rules"
    kubelet_write(rules, rules_files("t4-default"))
    store = PolicyStore(rules)
    app = create_app(Settings(rules_dir=rules, rules_poll_seconds=0), store=store, registry=registry)
    client = app.test_client()
    document = review("pod-create-from-replicaset-gpu")

    def node_selector() -> dict[str, str]:
        _, answer = call(client, "/mutate", with_uid(document))
        return dict(patched(document, answer["response"])["spec"]["nodeSelector"])

    assert node_selector()["gpu-type"] == "t4"
    good = store.policy.digest

    kubelet_write(rules, rules_files("invalid"))
    with caplog.at_level(logging.ERROR, logger="webhook.policy.rules"):
        assert store.refresh() is False
    assert store.policy.digest == good and node_selector()["gpu-type"] == "t4"
    [record] = [r for r in caplog.records if r.__dict__.get("event") == "rules-reload-failed"]
    assert "gpu-policy.yaml" in record.__dict__["error"] and "maxGPUsPerPod" in record.__dict__["error"]
    assert registry.get_sample_value("gpu_webhook_rules_reload_failures_total") == 1
    assert client.get("/readyz").get_json()["checks"]["rules"]["last_error"]
    assert store.refresh() is False  # the same bad state is not counted twice
    assert registry.get_sample_value("gpu_webhook_rules_reload_failures_total") == 1

    kubelet_write(rules, rules_files("a100-default"))
    assert store.refresh() is True
    assert node_selector()["gpu-type"] == "a100"
    assert registry.get_sample_value("gpu_webhook_rules_reloads_total") == 1
    assert registry.get_sample_value("gpu_webhook_rules_active", {"digest": good}) == 0
    assert registry.get_sample_value("gpu_webhook_rules_active", {"digest": store.policy.digest}) == 1


def test_rules_poller_picks_up_changes(tmp_path: Path, registry: CollectorRegistry) -> None:
    rules = tmp_path / "rules"
    kubelet_write(rules, rules_files("t4-default"))
    store = PolicyStore(rules)
    create_app(Settings(rules_dir=rules, rules_poll_seconds=0.05), store=store, registry=registry)
    try:
        before = store.policy.digest
        kubelet_write(rules, rules_files("a100-default"))
        for _ in range(100):
            if store.policy.digest != before:
                break
            store._stop.wait(0.05)
        assert store.policy.digest != before
    finally:
        store.stop()


def test_startup_with_invalid_rules_fails_fast(tmp_path: Path) -> None:
    from webhook.policy.rules import RuleError

    kubelet_write(tmp_path, rules_files("invalid"))
    with pytest.raises(RuleError, match="maxGPUsPerPod"):
        create_app(Settings(rules_dir=tmp_path, rules_poll_seconds=0), registry=CollectorRegistry())


# --- settings: the one place environment variables are read ------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, Settings(), id="defaults"),
        pytest.param({"GPU_WEBHOOK_RULES": "/etc/r", "GPU_WEBHOOK_TLS_DIR": "/etc/t",
                      "GPU_WEBHOOK_CLIENT_CA": "/etc/ca.crt"},
                     Settings(rules_dir=Path("/etc/r"), tls_dir=Path("/etc/t"), client_ca=Path("/etc/ca.crt")),
                     id="paths"),
        pytest.param({"GPU_WEBHOOK_PORT": "9443", "GPU_WEBHOOK_METRICS_PORT": "9100", "GPU_WEBHOOK_WORKERS": "3",
                      "GPU_WEBHOOK_THREADS": "8", "GPU_WEBHOOK_MAX_BODY_BYTES": "65536",
                      "GPU_WEBHOOK_LOG_LEVEL": "debug", "GPU_WEBHOOK_RULES_POLL_SECONDS": "0.5",
                      "GPU_WEBHOOK_SHUTDOWN_DELAY_SECONDS": "0"},
                     Settings(port=9443, metrics_port=9100, workers=3, threads=8, max_body_bytes=65536,
                              log_level="DEBUG", rules_poll_seconds=0.5, shutdown_delay_seconds=0), id="numbers"),
        pytest.param({"GPU_WEBHOOK_RULES": "  ", "GPU_WEBHOOK_PORT": ""}, Settings(), id="blank-is-unset"),
    ],
)
def test_settings_from_env(environ: dict[str, str], expected: Settings) -> None:
    assert Settings.from_env(environ) == expected


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        pytest.param({"GPU_WEBHOOK_PORT": "https"}, "GPU_WEBHOOK_PORT='https': expected an integer", id="port"),
        pytest.param({"GPU_WEBHOOK_WORKERS": "0"}, "GPU_WEBHOOK_WORKERS='0': must be at least 1", id="workers"),
        pytest.param({"GPU_WEBHOOK_LOG_LEVEL": "loud"}, "GPU_WEBHOOK_LOG_LEVEL='loud'", id="log-level"),
        pytest.param({"GPU_WEBHOOK_RULES_POLL_SECONDS": "-1"}, "must not be negative", id="poll"),
        pytest.param({"GPU_WEBHOOK_SHUTDOWN_DELAY_SECONDS": "soon"},
                     "GPU_WEBHOOK_SHUTDOWN_DELAY_SECONDS='soon': expected a number of seconds", id="shutdown-delay"),
    ],
)
def test_settings_errors_name_the_variable(environ: dict[str, str], fragment: str) -> None:
    from webhook.admission.settings import SettingsError

    with pytest.raises(SettingsError, match=re.escape(fragment)):
        Settings.from_env(environ)


def test_command_line_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from webhook.cli import server as cli_server

    monkeypatch.setenv("GPU_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("GPU_WEBHOOK_WORKERS", "3")
    parser = argparse.ArgumentParser()
    cli_server.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--workers", "5", "--rules", "/r"])
    assert args.func is cli_server.run_serve
    settings = cli_server.settings_from(args)
    assert (settings.port, settings.workers, settings.rules_dir) == (9443, 5, Path("/r"))
