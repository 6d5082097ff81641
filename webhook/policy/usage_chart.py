"""What `gpu-webhook usage --plot-file/--html-file` draws, computed from a usage Report (pure, no I/O, no plotting).

The shell (`webhook.cli.usage_plot`) turns a `Chart` into a figure: the ranking (idle and active GPU-hours per
workload, most idle first, as the report ranks them) and each shown workload's activity over the report's window
in percent of a GPU. Only the first `limit` workloads of the ranking are drawn (a figure with hundreds of panels
is unreadable); `Chart.total` says how many the report has, so the figure can say what it left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from webhook.policy.usage import Report, Verdict

DEFAULT_LIMIT = 12


@dataclass(frozen=True)
class ChartRow:
    """One workload as drawn: its bar in the ranking and its activity line."""

    label: str  # Kind/namespace/name, the report's own spelling
    verdict: Verdict
    gpus: float
    gpu_hours: float
    idle_gpu_hours: float
    activity_metric: str
    p50_pct: float | None
    p95_pct: float | None
    points: tuple[tuple[float, float], ...]  # (unix seconds, activity %); NaN marks a gap in the samples

    @property
    def active_gpu_hours(self) -> float:
        """GPU-hours not counted idle (never below 0: idle runs are whole samples of the same hours)."""
        return max(0.0, self.gpu_hours - self.idle_gpu_hours)


@dataclass(frozen=True)
class Chart:
    start: float
    end: float
    step: float
    idle_below_pct: float  # the rules' idle threshold, drawn as a line on every activity panel
    rows: tuple[ChartRow, ...]  # the ranking's first `limit`, most idle GPU-hours first
    total: int  # workloads in the report

    @property
    def left_out(self) -> int:
        return self.total - len(self.rows)


def chart(report: Report, idle_below: float, limit: int = DEFAULT_LIMIT) -> Chart:
    """The report's ranking and activity series, ready to draw. `idle_below`: the rules' threshold (0..1).

    A gap of more than 1.5 steps between two samples (the workload did not hold a GPU then, or the exporter
    was not scraped) becomes a NaN point, so a line is not drawn across it."""
    if limit < 1:
        raise ValueError(f"limit {limit}: draw at least one workload")
    rows = []
    for w in report.workloads[:limit]:
        points: list[tuple[float, float]] = []
        for t, value in w.timeline:
            if points and t - points[-1][0] > report.step * 1.5:
                points.append(((points[-1][0] + t) / 2, math.nan))
            points.append((t, value * 100))
        rows.append(ChartRow(label=str(w.workload), verdict=w.verdict, gpus=w.gpus, gpu_hours=w.gpu_hours,
                             idle_gpu_hours=w.idle_gpu_hours, activity_metric=w.activity_metric or "no activity metric",
                             p50_pct=_pct(w.p50), p95_pct=_pct(w.p95), points=tuple(points)))
    return Chart(start=report.start, end=report.end, step=report.step, idle_below_pct=idle_below * 100,
                 rows=tuple(rows), total=len(report.workloads))


def _pct(ratio: float | None) -> float | None:
    return None if ratio is None else ratio * 100
