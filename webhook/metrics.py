"""Prometheus instruments of the admission server, correct under several gunicorn worker processes.

Under gunicorn the workers write their samples to a shared directory (prometheus_client's multiprocess
mode) and the master serves the aggregate as plain HTTP on a separate port (9090, `/metrics`), the usual
place Prometheus scrapes, apart from the TLS port the API server calls. Tests build `Metrics` on their own
registry and read it back directly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, start_http_server
from prometheus_client import values as prometheus_values

PREFIX = "gpu_webhook"
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    """The instruments, registered on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.reviews = Counter(
            f"{PREFIX}_reviews",
            "AdmissionReviews answered, by endpoint, object kind and decision (allow, patch, deny).",
            ["endpoint", "kind", "decision"],
            registry=registry,
        )
        self.rule_findings = Counter(
            f"{PREFIX}_rule_findings",
            "Rules that fired in answered reviews, by endpoint, rule id and effect (deny or warn).",
            ["endpoint", "rule", "effect"],
            registry=registry,
        )
        self.bad_requests = Counter(
            f"{PREFIX}_bad_requests",
            "Calls answered with a 4xx (malformed AdmissionReview, body too large, wrong method or path).",
            ["endpoint", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            f"{PREFIX}_review_duration_seconds",
            "Time to answer one AdmissionReview inside the server (parse, evaluate, respond).",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rule_reloads = Counter(
            f"{PREFIX}_rules_reloads",
            "Rule changes on disk loaded and enforced (each worker process reloads and counts).",
            registry=registry,
        )
        self.rule_reload_failures = Counter(
            f"{PREFIX}_rules_reload_failures",
            "Rule changes on disk refused as invalid; the last good rules kept serving (counted per worker).",
            registry=registry,
        )
        self.inventory_synced = Gauge(
            f"{PREFIX}_inventory_synced",
            "1 when the cluster inventory (nodes, namespaces, runtime classes) is synced; 0 when its checks are "
            "skipped. Absent when cluster awareness is off.",
            registry=registry,
            multiprocess_mode="livemin",
        )
        self.rules_active = Gauge(
            f"{PREFIX}_rules_active",
            "1 for the digest of the rules being enforced.",
            ["digest"],
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.tls_not_after = Gauge(
            f"{PREFIX}_tls_cert_not_after_timestamp_seconds",
            "Expiry (Unix time) of the serving certificate in use.",
            registry=registry,
            multiprocess_mode="livemostrecent",
        )
        self.tls_reload_failures = Counter(
            f"{PREFIX}_tls_reload_failures",
            "Certificate/key pairs that could not be loaded (the last good pair kept serving).",
            registry=registry,
        )

    def rules_changed(self, old_digest: str | None, new_digest: str) -> None:
        if old_digest is not None and old_digest != new_digest:
            self.rules_active.labels(old_digest).set(0)
        self.rules_active.labels(new_digest).set(1)

    def review(self, endpoint: str, kind: str, decision: str, findings: Iterable[tuple[str, str]],
               seconds: float) -> None:
        self._child(self.reviews, endpoint, kind, decision).inc()
        for rule, effect in findings:
            self._child(self.rule_findings, endpoint, rule, effect).inc()
        self._child(self.latency, endpoint).observe(seconds)

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: the lookup is on every review's path."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


def enable_multiprocess(directory: Path) -> None:
    """Make every instrument created from now on (in this process and its forks) write to `directory`.

    prometheus_client picks its value class when it is first imported; it is picked again here so that
    the order of imports does not matter.
    """
    os.environ[MULTIPROC_ENV] = str(directory)
    prometheus_values.ValueClass = prometheus_values.get_value_class()  # type: ignore[no-untyped-call]


def serve_aggregate(host: str, port: int, directory: Path) -> tuple[WSGIServer, Thread]:
    """Serve the samples of every worker as one plain-HTTP /metrics endpoint (run in the gunicorn master)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return start_http_server(port, addr=host, registry=registry)


def worker_exited(pid: int, directory: Path) -> None:
    """Drop a dead worker's live gauges (rules digest, certificate expiry)."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]
