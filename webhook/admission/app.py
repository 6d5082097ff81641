"""The admission server: `create_app(settings)` and its routes.

JSON in -> `review.parse_review` -> `engine.evaluate` -> `review.build_response` -> JSON out. Two error
channels that never mix: a malformed call is an HTTP 4xx with a metav1.Status JSON body, a rejected object
is HTTP 200 with `allowed: false`. No HTML error page and no 500 for bad input, whatever the route.

Routes (HTTPS under gunicorn): POST /mutate, POST /validate, GET /healthz, GET /readyz. Metrics are not
here: the gunicorn master serves them as plain HTTP on their own port (see `webhook.admission.metrics`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import orjson
from flask import Flask, Response, request
from prometheus_client import CollectorRegistry
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook.admission import logs, shutdown
from webhook.admission.metrics import FLUSH_SECONDS, Metrics, multiprocess_enabled
from webhook.admission.policy_store import PolicyStore
from webhook.admission.review import AdmissionRequest, Decision, ReviewError, build_response, error_status, parse_review
from webhook.admission.settings import Settings
from webhook.admission.tls import Loaded, ServingTls
from webhook.policy.claims import CLAIM_KINDS
from webhook.policy.engine import Context, evaluate
from webhook.policy.findings import Mode, Verdict
from webhook.policy.inventory import FIRST_LIST_UNANSWERED, REFUSED_AT_START, Snapshot
from webhook.policy.patch import operations
from webhook.policy.pods import KNOWN_KINDS

log = logging.getLogger("webhook.admission.review")


class Inventory(Protocol):
    """What the server needs of the cluster inventory (`webhook.cluster.kube.ClusterInventory`)."""

    @property
    def synced(self) -> bool: ...

    def snapshot(self) -> Snapshot: ...

class AdmissionServer:
    """The state behind the routes: the rules, the TLS material (for readiness) and the instruments."""

    def __init__(self, settings: Settings, store: PolicyStore, metrics: Metrics,
                 tls: ServingTls | None, inventory: Inventory | None = None) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.tls = tls
        self.inventory = inventory

    def answer(self, mode: Mode, body: bytes) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON document) for one call to /mutate or /validate."""
        started = time.perf_counter()
        try:
            req = parse_review(body)
        except ReviewError as exc:
            self.metrics.bad_requests.labels(mode, str(exc.code)).inc()
            log.warning("malformed admission call", extra={"event": "bad-request", "endpoint": mode,
                                                           "code": exc.code, "error": str(exc)})
            return exc.code, error_status(exc.code, str(exc))
        policy = self.store.policy
        if req.sub_resource:  # status, binding, ephemeralcontainers...: never ours to judge
            verdict = _UNJUDGED
        else:
            snapshot = self.inventory.snapshot() if self.inventory is not None else None  # never blocks
            ctx = Context(namespace=req.namespace, operation=req.operation, mode=mode, old_object=req.old_obj,
                          inventory=snapshot)
            verdict = evaluate(policy, req.obj, ctx)
        decision = self._decide(mode, req, verdict, policy.digest)
        document = build_response(req, decision)
        seconds = time.perf_counter() - started
        outcome = "deny" if not decision.allowed else ("patch" if decision.patch else "allow")
        self._record(mode, req, verdict, outcome, seconds)
        return 200, document

    @staticmethod
    def _decide(mode: Mode, req: AdmissionRequest, verdict: Verdict, digest: str) -> Decision:
        patch: Sequence[dict[str, Any]] = ()
        encoded = ""
        if mode == "mutate" and verdict.allowed and verdict.edits and req.obj is not None:
            if verdict.patch is not None:  # the engine's memoised patch, already encoded: only read here
                patch, encoded = verdict.patch
            else:
                patch = operations(req.obj, verdict.edits)
        audit = {"policy-digest": digest}
        if verdict.gpu_class:
            audit["gpu-class"] = verdict.gpu_class
        if verdict.rules:
            audit["rules"] = ",".join(dict.fromkeys(verdict.rules))
        return Decision(
            allowed=verdict.allowed,
            message=verdict.message() if verdict.violations else "",
            patch=patch,
            warnings=[w.render() for w in verdict.warnings] if verdict.warnings else (),
            audit_annotations=audit,
            encoded_patch=encoded,
        )

    def _record(self, mode: Mode, req: AdmissionRequest, verdict: Verdict, outcome: str,
                seconds: float) -> None:
        known = req.kind.kind in KNOWN_KINDS or req.kind.kind in CLAIM_KINDS
        kind = req.kind.kind if known else "other"  # a bounded label set
        findings = [(f.rule, f.enforcement) for f in (*verdict.violations, *verdict.warnings)]  # deny, then warn
        self.metrics.review(mode, kind, outcome, findings, seconds)
        self._log(mode, req, verdict, outcome, seconds)

    @staticmethod
    def _log(mode: Mode, req: AdmissionRequest, verdict: Verdict, outcome: str, seconds: float) -> None:
        """The review's INFO line (one JSON object), when INFO is enabled."""
        if log.isEnabledFor(logging.INFO):  # the whole line built in one dict, in JsonFormatter's shape
            logs.write_line({
                "ts": logs.timestamp(time.time()), "level": "info", "logger": log.name, "msg": "review",
                "event": "review", "endpoint": mode, "uid": req.uid, "namespace": req.namespace,
                "name": req.display_name, "kind": req.kind.kind, "operation": req.operation,
                "sub_resource": req.sub_resource or None, "dry_run": req.dry_run, "decision": outcome,
                "rules": list(verdict.rules), "gpu_class": verdict.gpu_class, "user": req.username,
                "latency_ms": round(seconds * 1e6) / 1e3,  # whole µs (round(x, 3) runs float-to-text code)
            })

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when rules are loaded, a certificate/key pair is usable if TLS is configured, the API server has not
        refused the inventory's first lists (cluster awareness), and no SIGTERM has come (during the shutdown delay
        /readyz is 503 with `checks.shutdown`, while reviews are still served)."""
        checks: dict[str, Any] = {"rules": {"digest": self.store.policy.digest,
                                            "last_error": self.store.last_error}}
        ready = True
        if shutdown.draining():
            ready = False  # SIGTERM received: serving on only until clients have moved (shutdown.py)
            checks["shutdown"] = {"draining": True}
        if self.inventory is not None:
            # Not synced, it says why. A list the API server refused at start (the ServiceAccount lacks a
            # permission) makes this replica unready: a rollout stalls while the old replicas serve, and nothing
            # crash-loops. So does a first list not yet answered: else the kubelet's first probe could find a new
            # replica Ready a moment before its refusal, and the rollout would go on. Any other gap (the API server
            # unreachable or failing at start, a permission taken away once listed) is reported only: an unready
            # fleet would leave the validating webhook (failurePolicy Fail) without endpoints, and the inventory
            # checks are skipped with a warning instead.
            snapshot = self.inventory.snapshot()
            checks["inventory"] = {"synced": snapshot.synced, "dra": dict(snapshot.dra.counts)}  # objects held
            if not snapshot.synced:
                checks["inventory"]["reason"] = snapshot.reason
                if snapshot.reason.startswith((REFUSED_AT_START, FIRST_LIST_UNANSWERED)):
                    ready = False
        if self.tls is not None:
            loaded = self.tls.refresh()
            ready = ready and loaded is not None
            checks["tls"] = {"ok": loaded is not None, "dir": str(self.tls.tls_dir),
                             "not_after": loaded.not_after.isoformat() if loaded else None}
        return ready, checks


_UNJUDGED = Verdict()


def _json(status: int, document: Mapping[str, Any]) -> Response:
    return Response(orjson.dumps(document), status=status, mimetype="application/json")


def create_app(
    settings: Settings,
    *,
    store: PolicyStore | None = None,
    tls: ServingTls | None = None,
    registry: CollectorRegistry | None = None,
    inventory: Inventory | None = None,
) -> Flask:
    """The Flask app; loads the rules unless a store is given (RuleError: fail fast), starts their poller.

    With `settings.cluster` and no `inventory` given, the cluster inventory is started here: in each gunicorn
    worker, after the fork (threads do not survive one). Its credentials come from the pod's service account
    or, outside a cluster, from kubectl's kubeconfig.
    """
    metrics = Metrics(registry if registry is not None else CollectorRegistry(),
                      flush_seconds=FLUSH_SECONDS if multiprocess_enabled() else None)
    store = store if store is not None else PolicyStore(settings.rules_dir)
    store.metrics = metrics
    metrics.rules_changed(None, store.policy.digest)
    if tls is None and settings.tls_dir is not None:
        tls = ServingTls(settings.tls_dir, settings.client_ca)
    if tls is not None:
        tls.on_load = lambda loaded: _tls_loaded(metrics, loaded)
        tls.on_failure = lambda error: metrics.tls_reload_failures.inc()
        if tls.current is not None:
            _tls_loaded(metrics, tls.current)
    if inventory is None and settings.cluster:
        from webhook.cluster import kube

        inventory = kube.inventory_from_env()
        inventory.start()
    if inventory is not None:
        _keep_synced_gauge(inventory, metrics)
    server = AdmissionServer(settings, store, metrics, tls, inventory)

    app = Flask("webhook")
    # One byte over the cap is read so that a chunked body (no Content-Length), which Werkzeug cuts at
    # MAX_CONTENT_LENGTH without an error, is told apart from a body of exactly the cap.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1
    app.extensions["gpu_webhook"] = server

    def review(mode: Mode) -> Response:
        data = request.get_data(cache=False)
        if len(data) > settings.max_body_bytes:
            raise RequestEntityTooLarge()
        status, document = server.answer(mode, data)
        return _json(status, document)

    app.add_url_rule("/mutate", "mutate", lambda: review("mutate"), methods=["POST"])
    app.add_url_rule("/validate", "validate", lambda: review("validate"), methods=["POST"])

    @app.get("/healthz")
    def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        ready, checks = server.readiness()
        return _json(200 if ready else 503, {"status": "ok" if ready else "not ready", "checks": checks})

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 400
        endpoint = request.path.strip("/") or "/"
        if endpoint in ("mutate", "validate"):
            metrics.bad_requests.labels(endpoint, str(code)).inc()
        message = exc.description or exc.name
        if code == 413:
            message = f"request body larger than {settings.max_body_bytes} bytes"
        return _json(code, error_status(code, message))

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> Response:
        log.exception("internal error answering %s", request.path, extra={"event": "internal-error"})
        return _json(500, error_status(500, f"internal error: {type(exc).__name__}"))

    store.start(settings.rules_poll_seconds)
    return app


SYNCED_GAUGE_SECONDS = 1.0


def _keep_synced_gauge(inventory: Inventory, metrics: Metrics, every: float = SYNCED_GAUGE_SECONDS) -> None:
    """Keep `gpu_webhook_inventory_synced` true to this worker's inventory whether reviews come or not, from a
    thread of its own (written only as reviews came, an idle worker's 0 outlived the inventory's recovery, and
    the multiprocess aggregate, the lowest live worker's value, said not synced). A write only on a change."""
    def run() -> None:
        last: bool | None = None
        while True:
            synced = inventory.synced
            if synced is not last:
                metrics.inventory_synced.set(1 if synced else 0)
                last = synced
            time.sleep(every)

    threading.Thread(target=run, name="inventory-gauge", daemon=True).start()


def _tls_loaded(metrics: Metrics, loaded: Loaded) -> None:
    metrics.tls_not_after.set(loaded.not_after.timestamp())


def server_of(app: Flask) -> AdmissionServer:
    """The AdmissionServer behind an app made by `create_app`."""
    server = app.extensions["gpu_webhook"]
    assert isinstance(server, AdmissionServer)
    return server
