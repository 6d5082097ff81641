"""The per-review instruments: tallied and written in batches (multiprocess mode) with the same samples as
prometheus_client's own `observe`/`inc`, in both of its value modes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client import values as prometheus_values

from webhook.admission import metrics
from webhook.admission.metrics import LATENCY_BUCKETS, Metrics

# (endpoint, kind, decision, findings, seconds): bucket edges, below the first, above the last, zero
REVIEWS = [
    ("mutate", "Pod", "patch", [], 0.0005),
    ("mutate", "Pod", "patch", [], 0.00049),
    ("mutate", "Pod", "deny", [("gpu-limits-required", "deny"), ("gpu-whole-number", "deny")], 0.0051),
    ("mutate", "Deployment", "allow", [("gpu-class-max", "warn")], 0.005),
    ("validate", "Pod", "allow", [], 2.0),
    ("validate", "Pod", "deny", [("gpu-limits-required", "deny")], 0.0),
    ("mutate", "Pod", "patch", [], 1.0),
]
LATENCY = "gpu_webhook_review_duration_seconds"


def write_to(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Instruments created from now on write to `directory` (as in a gunicorn worker), until the test ends."""
    monkeypatch.setenv(metrics.MULTIPROC_ENV, str(directory))
    monkeypatch.setattr(prometheus_values, "ValueClass", prometheus_values.get_value_class())


@pytest.fixture
def multiprocess_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """prometheus_client writing to `tmp_path`, restored afterwards."""
    write_to(tmp_path, monkeypatch)
    yield tmp_path


PER_REVIEW = ("gpu_webhook_reviews_total", "gpu_webhook_rule_findings_total", f"{LATENCY}_")


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The per-review instruments' samples, by (name, labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect()
            for s in family.samples if s.name.startswith(PER_REVIEW) and not s.name.endswith("_created")}


def reference(registry: CollectorRegistry, times: int = 1) -> None:
    """The same reviews through prometheus_client's own calls, one at a time."""
    latency = Histogram(LATENCY, "reference", ["endpoint"], buckets=LATENCY_BUCKETS, registry=registry)
    reviews = Counter("gpu_webhook_reviews", "reference", ["endpoint", "kind", "decision"], registry=registry)
    findings = Counter("gpu_webhook_rule_findings", "reference", ["endpoint", "rule", "effect"], registry=registry)
    for _ in range(times):
        for endpoint, kind, decision, fired, seconds in REVIEWS:
            reviews.labels(endpoint, kind, decision).inc()
            for rule, effect in fired:
                findings.labels(endpoint, rule, effect).inc()
            latency.labels(endpoint).observe(seconds)


def run(instruments: Metrics, times: int = 1) -> None:
    for _ in range(times):
        for review in REVIEWS:
            instruments.review(*review)


def aggregate(directory: Path) -> CollectorRegistry:
    """What the gunicorn master serves: the sum of the samples written to `directory`."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return registry


def test_unbatched_writes_each_review_as_prometheus_client_would() -> None:
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    run(Metrics(mine))
    reference(theirs)
    assert samples(mine) == samples(theirs)
    assert samples(mine)[(f"{LATENCY}_count", (("endpoint", "mutate"),))] == 5


def test_batched_reviews_are_written_on_flush_only() -> None:
    registry = CollectorRegistry()
    instruments = Metrics(registry, flush_seconds=3600)
    run(instruments)
    assert registry.get_sample_value("gpu_webhook_reviews_total",
                                     {"endpoint": "mutate", "kind": "Pod", "decision": "patch"}) is None
    metrics.flush()  # what gunicorn's worker_exit hook and the exit handler call
    theirs = CollectorRegistry()
    reference(theirs)
    assert samples(registry) == samples(theirs)
    metrics.flush()  # nothing twice
    assert samples(registry) == samples(theirs)


def test_batched_in_multiprocess_mode_matches_observe(multiprocess_mode: Path, tmp_path_factory: pytest.TempPathFactory,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    instruments = Metrics(CollectorRegistry(), flush_seconds=3600)
    run(instruments, times=2)
    instruments.flush()
    mine = samples(aggregate(multiprocess_mode))

    other = tmp_path_factory.mktemp("reference")  # prometheus_client's own writes, in a directory of their own
    write_to(other, monkeypatch)
    reference(CollectorRegistry(), times=2)
    assert mine == samples(aggregate(other))
    assert mine[("gpu_webhook_reviews_total", (("decision", "patch"), ("endpoint", "mutate"), ("kind", "Pod")))] == 6
