"""`usage --plot-file`: the usage Chart (webhook.policy.usage_chart) drawn as PNG or SVG with matplotlib.

matplotlib is the optional extra `plot` (`pip install 'gpu-webhook[plot]'`) and is imported only when a figure
is drawn. The figure is built on a bare `Figure` with the Agg canvas (no pyplot, no GUI backend, no global
state); the output is deterministic: no date or software stamp in PNG or SVG, SVG ids from a fixed salt, text
kept as SVG <text> (searchable, and what the HTML report inlines). Names are drawn literally (parse_math off),
so a `$` in a name is not TeX.
"""

from __future__ import annotations

import datetime as dt
import io
import math
import re
from pathlib import Path
from typing import Any

from webhook.policy.usage_chart import Chart, ChartRow

FORMATS = {".png": "png", ".svg": "svg"}
INSTALL = "pip install 'gpu-webhook[plot]'"
WIDTH_IN, DPI = 12.0, 100
IDLE_COLOUR, ACTIVE_COLOUR, LINE_COLOUR = "#d55e00", "#0072b2", "#0072b2"  # Okabe-Ito, safe for colour blindness


class PlotError(Exception):
    """A figure that cannot be written; the message names the flag, what is wrong and how to fix it."""


def format_of(path: Path, flag: str = "--plot-file") -> str:
    """'png' or 'svg' from the file's extension; PlotError for any other, naming the accepted ones."""
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        given = f"the extension {path.suffix!r}" if path.suffix else "no extension"
        raise PlotError(f"{flag} {path}: {given} names no format we write; end the file name in "
                        f"{' or '.join(FORMATS)} (PNG or SVG)")
    return found


def require_matplotlib(flag: str) -> None:
    """PlotError saying how to install the extra when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise PlotError(f"{flag} draws with matplotlib, which is not installed here ({err}): {INSTALL}") from None


def size_px(chart: Chart) -> tuple[int, int]:
    """The figure's width and height in pixels (PNG): 1200 wide, taller with more workloads."""
    width, height = _size_in(chart)
    return round(width * DPI), round(height * DPI)


def _size_in(chart: Chart) -> tuple[float, float]:
    return WIDTH_IN, _ranking_height(chart) + 1.9 * max(1, len(chart.rows)) + 0.9


def _ranking_height(chart: Chart) -> float:
    return 1.2 + 0.34 * max(1, len(chart.rows))


def render(chart: Chart, fmt: str, title: str) -> bytes:
    """The figure as PNG or SVG bytes. `title`: the first line (window and data source)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    params: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "gpu-webhook-usage", "font.family": "DejaVu Sans",
              "font.size": 9, "axes.titlesize": 9.5, "axes.titleweight": "bold"}
    with matplotlib.rc_context(params):  # type: ignore[arg-type]
        width, height = _size_in(chart)
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        panels = max(1, len(chart.rows))
        grid = fig.add_gridspec(1 + panels, 1, height_ratios=[_ranking_height(chart), *([1.9] * panels)])
        fig.suptitle(title, fontsize=11, fontweight="bold", parse_math=False)
        _ranking(fig.add_subplot(grid[0]), chart)
        shared = None
        for i in range(panels):
            ax = fig.add_subplot(grid[1 + i], sharex=shared)
            shared = shared or ax
            _activity(ax, chart, chart.rows[i] if chart.rows else None, first=i == 0, last=i == panels - 1)
        out = io.BytesIO()
        metadata: dict[str, Any] = {"Date": None} if fmt == "svg" else {"Software": None}
        fig.savefig(out, format=fmt, dpi=DPI, metadata=metadata)
    return _stable_clip_ids(out.getvalue()) if fmt == "svg" else out.getvalue()


_CLIP_ID = re.compile(rb'id="(p[0-9a-f]{10})"')


def _stable_clip_ids(svg: bytes) -> bytes:
    """The SVG with matplotlib's clip-path ids renumbered in document order.

    matplotlib hashes a clip path's key, which holds the `id()` of a Python object, so the same figure drawn twice
    gets other ids despite `svg.hashsalt`; renumbering keeps the file byte-for-byte reproducible.
    """
    for n, old in enumerate(dict.fromkeys(_CLIP_ID.findall(svg))):
        svg = svg.replace(old, f"clip{n}".encode())  # the 11-character hash occurs nowhere else in the file
    return svg


def write(chart: Chart, path: Path, title: str, flag: str = "--plot-file") -> str:
    """Draw into `path` (format from its extension); the format written. PlotError when it cannot."""
    fmt = format_of(path, flag)
    require_matplotlib(flag)
    data = render(chart, fmt, title)
    try:
        path.write_bytes(data)
    except OSError as err:
        raise PlotError(f"{flag} {path}: cannot write it ({err.strerror or err}); name a file in a directory "
                        "that exists and is writable") from None
    return fmt


def _ranking(ax: Any, chart: Chart) -> None:
    shown = f"top {len(chart.rows)} of {chart.total}" if chart.left_out else f"all {chart.total}"
    ax.set_title(f"Workloads ranked by idle GPU-hours ({shown})", loc="left", parse_math=False)
    if not chart.rows:
        ax.text(0.5, 0.5, "no GPU-holding workload in scope", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ys = range(len(chart.rows))
    idle = [r.idle_gpu_hours for r in chart.rows]
    active = [r.active_gpu_hours for r in chart.rows]
    ax.barh(ys, idle, color=IDLE_COLOUR, label="idle GPU-hours")
    ax.barh(ys, active, left=idle, color=ACTIVE_COLOUR, label="active GPU-hours")
    ax.set_yticks(list(ys), [r.label for r in chart.rows], parse_math=False)
    ax.invert_yaxis()  # the most idle on top, as the table
    longest = max(r.gpu_hours for r in chart.rows) or 1.0
    ax.set_xlim(0, longest * 1.3)
    for y, r in zip(ys, chart.rows, strict=True):
        ax.text(r.gpu_hours + longest * 0.01, y, f"{r.verdict}: {r.idle_gpu_hours:.1f} of {r.gpu_hours:.1f} GPU-h idle",
                va="center", fontsize=8, parse_math=False)
    ax.set_xlabel("GPU-hours held in the window")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def _activity(ax: Any, chart: Chart, row: ChartRow | None, first: bool, last: bool) -> None:
    import matplotlib.dates as mdates

    start, end = _when(chart.start), _when(chart.end)
    ax.set_xlim(start, end)
    ax.set_ylim(-3, 103)  # a line at 0 % (idle) stays visible above the axis
    ax.set_yticks([0, 25, 50, 75, 100])
    ax.set_ylabel("activity (%)")
    ax.grid(alpha=0.3)
    if row is None:
        ax.text(0.5, 0.5, "no activity to draw", ha="center", va="center", transform=ax.transAxes)
    else:
        gpus = f"{row.gpus:.3g} GPU" + ("" if math.isclose(row.gpus, 1) else "s")
        ax.set_title(f"{row.label}: {row.verdict}, {gpus}, activity p50 {_pct(row.p50_pct)}, "
                     f"p95 {_pct(row.p95_pct)} ({row.activity_metric})", loc="left", parse_math=False)
        times = [_when(t) for t, _ in row.points]
        values = [v for _, v in row.points]
        ax.plot(times, values, color=LINE_COLOUR, linewidth=1.2, label="activity, % of a GPU")
        ax.fill_between(times, values, color=LINE_COLOUR, alpha=0.15, linewidth=0)
        if not row.points:
            ax.text(0.5, 0.5, "no activity samples", ha="center", va="center", transform=ax.transAxes)
    ax.axhline(chart.idle_below_pct, color=IDLE_COLOUR, linestyle="--", linewidth=1,
               label=f"idle below {chart.idle_below_pct:.3g} %")
    if first:
        ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    locator = mdates.AutoDateLocator(tz=dt.UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=dt.UTC))  # type: ignore[no-untyped-call]
    if last:
        ax.set_xlabel("time (UTC)")
    else:
        ax.tick_params(labelbottom=False)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} %"


def title(chart: Chart, source: str) -> str:
    """The figure's first line: the window (UTC), the step and where the data came from."""
    start, end = _when(chart.start), _when(chart.end)
    until = end.strftime("%H:%M" if end.date() == start.date() else "%Y-%m-%d %H:%M")
    return (f"GPU usage {start:%Y-%m-%d %H:%M} to {until} UTC (step {chart.step:g} s)\n"
            f"from {source}")


def _when(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)
