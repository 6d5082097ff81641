"""Reading dcgm-exporter data from Prometheus (or a server that serves its HTTP API, such as VictoriaMetrics).

Plain HTTP over urllib3, the transport the Kubernetes client already uses: `/api/v1/query_range` for the series
`gpu-webhook usage` judges, `/api/v1/query` for the instant checks. Every failure becomes a `PrometheusError`
that says what is missing and how to fix the URL or the scrape config; nothing here raises anything else.

`read_series` asks, per metric, for one point per step: the step's mean activity (`avg_over_time`) and its
framebuffer peak (`max_over_time`), so a step longer than the scrape interval loses no peak.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3

from webhook.policy import usage

CONNECT_TIMEOUT = 5.0
MAX_POINTS = 10_000  # Prometheus refuses a range query of more than 11,000 points per series
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
Progress = Callable[[str], None]

# metric -> the PromQL rollup over one step
ROLLUPS: Mapping[str, str] = {
    usage.GR_ENGINE_ACTIVE: "avg_over_time",
    usage.GPU_UTIL: "avg_over_time",
    usage.FB_USED: "max_over_time",
    usage.FB_FREE: "min_over_time",
    usage.FB_RESERVED: "max_over_time",
}


class PrometheusError(Exception):
    """Prometheus could not answer; the message names the URL, what failed and what to do."""


def parse_duration(text: str) -> float:
    """`30m`, `12h`, `7d`, `2w` (Prometheus duration units) in seconds; ValueError naming the accepted form."""
    found = _DURATION.match(text.strip())
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration: write a number and a unit, e.g. 30m, 12h, 7d or 2w")
    return float(found.group(1)) * _UNITS[found.group(2)]


def step_for(seconds: float, scrape_interval: float = 60.0) -> float:
    """One point per minute (the scrape interval), or coarser so a series stays under MAX_POINTS."""
    return float(max(scrape_interval, math.ceil(seconds / MAX_POINTS)))


@dataclass
class Prometheus:
    """A Prometheus HTTP API client: base URL (http://host:9090, or a path prefix behind a proxy).

    `timeout` is sent as the query's own timeout; the client waits a little longer (up to 5 s) for the server
    to say so itself before giving up on the connection."""

    url: str
    timeout: float = 60.0
    headers: Mapping[str, str] | None = None
    pool: urllib3.PoolManager | None = None

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        if not re.match(r"^https?://[^/\s]+", self.url):
            raise PrometheusError(f"--prometheus {self.url!r} is not an http:// or https:// URL; pass the base URL "
                                  "of the Prometheus server, e.g. http://prometheus-operated.monitoring.svc:9090")
        if self.pool is None:
            self.pool = urllib3.PoolManager(retries=False)

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """An instant query: the vector's [{metric: labels, value: [t, "v"]}]."""
        return self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query: the matrix's [{metric: labels, values: [[t, "v"], ...]}]."""
        return self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}", "timeout": f"{self.timeout:g}s"})

    def _get(self, path: str, fields: Mapping[str, str]) -> list[dict[str, Any]]:
        assert self.pool is not None
        where = f"{self.url}{path}"
        try:
            response = self.pool.request(
                "GET", where, fields=dict(fields), headers=dict(self.headers or {}),
                timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=self.timeout + min(5.0, self.timeout / 2)))
        except urllib3.exceptions.ReadTimeoutError:
            raise PrometheusError(
                f"{self.url} did not answer {fields['query']!r} within {self.timeout:g} s: shorten --since, narrow "
                "with -n NAMESPACE, or raise --timeout") from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise PrometheusError(
                f"cannot reach Prometheus at {self.url} ({reason}); check --prometheus (or usage.prometheus in the "
                "rules). From outside the cluster: kubectl port-forward -n monitoring svc/prometheus-operated "
                "9090, then --prometheus http://127.0.0.1:9090") from None
        return _decode(self.url, path, fields, response.status, response.headers.get("Content-Type", ""),
                       response.data)


def _decode(url: str, path: str, fields: Mapping[str, str], status: int, content_type: str, body: bytes
            ) -> list[dict[str, Any]]:
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "status" not in answer:
        kind = content_type.split(";")[0] or "no content type"
        raise PrometheusError(
            f"{url}{path} answered HTTP {status} with {kind}, not the Prometheus API: point --prometheus at the "
            "Prometheus server's base URL (the one whose /graph page you open, without /graph), not at Grafana "
            "or an exporter")
    if answer["status"] != "success":
        kind, error = answer.get("errorType", "error"), answer.get("error", "")
        if kind == "timeout" or "timeout" in str(error).lower() or "deadline" in str(error).lower():
            raise PrometheusError(
                f"{url} gave up on {fields.get('query')!r} ({error}): shorten --since, narrow with -n NAMESPACE, "
                "or raise --timeout (and the server's -query.timeout)")
        raise PrometheusError(f"{url}{path} refused {fields.get('query')!r}: {kind}: {error}")
    data = answer.get("data") or {}
    result = data.get("result")
    return result if isinstance(result, list) else []


def read_series(prometheus: Prometheus, start: float, end: float, step: float,
                progress: Progress | None = None) -> list[usage.Series]:
    """Every dcgm-exporter series `usage.analyse` reads, over [start, end], one point per step.

    The whole cluster is read even for one namespace: Pods of other namespaces sharing a time-sliced GPU change
    each holder's share, and `usage.analyse` scopes the report."""
    found: list[usage.Series] = []
    for metric, rollup in ROLLUPS.items():
        if progress is not None:
            progress(metric)
        for item in prometheus.query_range(f"{rollup}({metric}[{step:g}s])", start, end, step):
            labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items() if k != "__name__"}
            points = tuple((float(t), _value(v)) for t, v in item.get("values") or ())
            found.append(usage.Series(metric, labels, points))
    return found


def _value(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def present_metrics(prometheus: Prometheus, at: float) -> Sequence[str]:
    """The DCGM metrics `usage` reads that the server has a current sample of (an instant query at `at`)."""
    names = "|".join(usage.METRICS)
    result = prometheus.query(f'count by (__name__) ({{__name__=~"{names}"}})', at)
    return sorted(str((r.get("metric") or {}).get("__name__", "")) for r in result)
