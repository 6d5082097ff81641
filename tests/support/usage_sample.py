"""The e2e replay's fleet (tests/e2e/usage_replay.py: the real H200's UUID, memory and NVML phases, plus the
replay's own devices) as a usage Report, without a metrics server: its exposition text is read back with
Prometheus' own parser into the Series a range query returns, and joined to the Pods the e2e test creates."""

from __future__ import annotations

from collections import defaultdict

from e2e.usage_replay import STEP, exposition, fleet
from prometheus_client.parser import text_string_to_metric_families

from webhook.policy import usage
from webhook.policy.usage import PodInfo, Series, UsageRules, Workload

T0 = 1_796_000_000  # 2026-12-01T22:13:20Z
NAMESPACE = "usage-e2e"
OWNERS = {"notebook": "Deployment", "trainer": "Job", "embedder": "StatefulSet"}
POD_NAMES = ("ts-1", "ts-2", "ts-3", "ts-4", "notebook", "trainer", "embedder", "mig-infer")


def series(minutes: int, namespace: str = NAMESPACE, names: dict[str, str] | None = None) -> list[Series]:
    text = exposition(fleet(names or {n: n for n in POD_NAMES}, minutes), namespace, T0)
    points: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            points[(s.name, tuple(sorted(s.labels.items())))].append((float(s.timestamp or 0), s.value))
    return [Series(metric, dict(labels), tuple(sorted(ps))) for (metric, labels), ps in sorted(points.items())]


def pods(namespace: str = NAMESPACE, names: dict[str, str] | None = None) -> dict[tuple[str, str], PodInfo]:
    names = names or {n: n for n in POD_NAMES}
    out = {}
    for logical, real in names.items():
        kind = OWNERS.get(logical)
        workload = Workload(kind, namespace, logical) if kind else Workload("Pod", namespace, real)
        out[(namespace, real)] = PodInfo(namespace, real, workload, 1.0)
    return out


def report(minutes: int = 360, namespace: str = NAMESPACE, names: dict[str, str] | None = None,
           rules: UsageRules | None = None) -> usage.Report:
    """The replay's `minutes` as a Report (the packaged rules' thresholds unless `rules`)."""
    if rules is None:
        from webhook.admission.loader import load_policy

        rules = load_policy(None).usage
    return usage.analyse(series(minutes, namespace, names), pods(namespace, names), rules, start=T0,
                         end=T0 + minutes * STEP, step=STEP, namespace=namespace)
