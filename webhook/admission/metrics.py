"""Prometheus instruments of the admission server, correct under several gunicorn worker processes.

Under gunicorn the workers write their samples to a shared directory (prometheus_client's multiprocess
mode) and the master serves the aggregate as plain HTTP on a separate port (9090, `/metrics`), the usual
place Prometheus scrapes, apart from the TLS port the API server calls. Tests build `Metrics` on their own
registry and read it back directly.

In multiprocess mode every sample written is a locked write to a memory-mapped file after a `getpid()`
system call (prometheus_client checks for a fork each time): three or more per review, 5 % of the
instructions of answering one (docs/performance.md). So there the per-review instruments
(`Metrics.review`) are tallied in the process and written in one batch every `FLUSH_SECONDS` by a background
thread, and at worker exit (`flush`): /metrics shows a review at most that long after it was answered; a
worker killed outright (SIGKILL, OOM) loses at most that long of counts. Everything else is written at once.
"""

from __future__ import annotations

import atexit
import bisect
import os
import threading
import time
import weakref
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
FLUSH_SECONDS = 1.0
_UPPER_BOUNDS = (*LATENCY_BUCKETS, float("inf"))  # as prometheus_client completes them

_batching: weakref.WeakSet[Metrics] = weakref.WeakSet()  # the instances `flush()` writes out


class _Tally:
    """Per-review samples not yet written: counts by (endpoint, kind, decision) and (endpoint, rule, effect),
    and per endpoint the latency histogram's per-bucket counts and sum."""

    def __init__(self) -> None:
        self.reviews: dict[tuple[str, str, str], int] = {}
        self.findings: dict[tuple[str, str, str], int] = {}
        self.latency_counts: dict[str, list[int]] = {}  # per bucket of _UPPER_BOUNDS, not cumulative
        self.latency_sums: dict[str, float] = {}


class Metrics:
    """The instruments, registered on one registry.

    `flush_seconds`: tally `review()` in the process and write it that often (multiprocess mode, see the
    module doc); None writes every review at once.
    """

    def __init__(self, registry: CollectorRegistry, flush_seconds: float | None = None) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._flush_seconds = flush_seconds
        self._lock = threading.Lock()
        self._tally = _Tally()
        self._flusher: Thread | None = None
        if flush_seconds is not None:
            _batching.add(self)
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
        """One answered review: its decision, the rules that fired (rule, effect), and its latency."""
        with self._lock:
            tally = self._tally
            key = (endpoint, kind, decision)
            tally.reviews[key] = tally.reviews.get(key, 0) + 1
            for rule, effect in findings:
                key = (endpoint, rule, effect)
                tally.findings[key] = tally.findings.get(key, 0) + 1
            counts = tally.latency_counts.get(endpoint)
            if counts is None:
                counts = tally.latency_counts[endpoint] = [0] * len(_UPPER_BOUNDS)
            counts[bisect.bisect_left(_UPPER_BOUNDS, seconds)] += 1  # the first bucket with seconds <= le
            tally.latency_sums[endpoint] = tally.latency_sums.get(endpoint, 0.0) + seconds
            if self._flush_seconds is not None:
                if self._flusher is None:  # started on first use: in the worker, after gunicorn's fork
                    self._flusher = Thread(target=self._flush_periodically, name="metrics-flusher", daemon=True)
                    self._flusher.start()
                return
        self.flush()

    def flush(self) -> None:
        """Write the tallied reviews to the instruments."""
        with self._lock:
            tally, self._tally = self._tally, _Tally()
        for (endpoint, kind, decision), count in tally.reviews.items():
            self._child(self.reviews, endpoint, kind, decision).inc(count)
        for (endpoint, rule, effect), count in tally.findings.items():
            self._child(self.rule_findings, endpoint, rule, effect).inc(count)
        for endpoint, counts in tally.latency_counts.items():
            _observe_many(self._child(self.latency, endpoint), counts, tally.latency_sums[endpoint])

    def _flush_periodically(self) -> None:
        assert self._flush_seconds is not None
        while True:
            time.sleep(self._flush_seconds)
            self.flush()

    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, remembered: the lookup is on every review's path."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


def _observe_many(child: Any, counts: list[int], total: float) -> None:
    """What `child.observe(v)` for each tallied `v` writes: the sum, then each bucket's count.

    prometheus_client has no public call for many observations at once; this writes the values its
    `Histogram.observe` writes (`_sum`, and `_buckets[i]`, not cumulative), which tests/admission/test_metrics.py
    compares with `observe` itself, sample by sample, on the version installed.
    """
    child._sum.inc(total)
    for bucket, count in zip(child._buckets, counts, strict=True):
        if count:
            bucket.inc(count)


def flush() -> None:
    """Write what every batching `Metrics` holds (gunicorn's worker_exit hook, and at exit)."""
    for instance in list(_batching):
        instance.flush()


atexit.register(flush)


def multiprocess_enabled() -> bool:
    """Whether instruments write to a multiprocess directory (see `enable_multiprocess`)."""
    return MULTIPROC_ENV in os.environ


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
