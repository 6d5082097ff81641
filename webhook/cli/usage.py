"""`gpu-webhook usage` (`register(subparsers)`): which workloads hold GPUs they barely use, from Prometheus.

Exit codes: 0 the report was made (whatever it says), 2 usage or input error: Prometheus unreachable or not the
Prometheus API, a query timeout, no dcgm-exporter data, series without pod labels, rules, kubeconfig, API server.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from webhook.admission.loader import load_policy
from webhook.cli import usage_html, usage_plot
from webhook.cli.main import EXIT_OK, EXIT_USAGE, resolve_rules, rules_arg
from webhook.cluster import prometheus
from webhook.policy import usage, usage_chart
from webhook.policy.rules import Policy

PROMETHEUS_ENV = "GPU_WEBHOOK_PROMETHEUS"
COLUMNS = ("workload", "gpus", "gpu_hours", "idle_gpu_hours", "p50", "p95", "activity_metric", "fb_peak_mib",
           "card_mib", "shared_with", "verdict", "suggestion", "freeable_gpus", "pods", "reason")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "usage", help="find workloads holding GPUs they barely use (dcgm-exporter data in Prometheus)",
        description="Join dcgm-exporter metrics in Prometheus to the cluster's Pods and their owners; rank "
        "workloads by idle GPU-hours and suggest a smaller size from the rules' usage section. Exit 0: report "
        "made; 2: usage or input error (Prometheus unreachable, query timeout, no dcgm-exporter data).")
    add_prometheus_args(p)
    p.add_argument("--since", default="7d", metavar="DURATION", help="how far back to look: 30m, 12h, 7d, 2w "
                   "(default 7d)")
    p.add_argument("--until", default=None, metavar="TIME", help="end of the window: RFC 3339 or unix seconds "
                   "(default now)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="one namespace (default: the kubeconfig context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("-o", "--output", choices=("human", "json", "csv"), default="human")
    p.add_argument("--plot", metavar="WORKLOAD", help="also draw one workload's activity over time in the terminal "
                   "(NAME, or KIND/NAME)")
    p.add_argument("--plot-file", metavar="PATH", type=Path, help="also write the ranking and each workload's "
                   "activity over the window as a picture, PNG or SVG by the extension (needs the plot extra: "
                   "pip install 'gpu-webhook[plot]')")
    p.add_argument("--html-file", metavar="PATH", type=Path, help="also write the report as one HTML page to open in "
                   "a browser: the ranking, the totals and, with the plot extra, the --plot-file figure inlined")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default: $KUBECONFIG, else "
                   "~/.kube/config, else the in-cluster ServiceAccount)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    rules_arg(p)
    p.set_defaults(func=run_usage)


def add_prometheus_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prometheus", metavar="URL", default=None,
                        help=f"Prometheus base URL (default: ${PROMETHEUS_ENV}, else usage.prometheus in the rules)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="per-query timeout (default 60)")


def prometheus_url(args: argparse.Namespace, policy: Policy) -> str | None:
    """--prometheus, else $GPU_WEBHOOK_PROMETHEUS, else the rules' usage.prometheus."""
    return args.prometheus or os.environ.get(PROMETHEUS_ENV) or policy.usage.prometheus


def _fail(message: str) -> int:
    print(f"gpu-webhook usage: {message}", file=sys.stderr)
    return EXIT_USAGE


class Failure(Exception):
    """Input `usage` cannot work with; the message says what is missing and how to fix it."""


def window(args: argparse.Namespace) -> tuple[float, float, float]:
    """(start, end, step) from --since and --until."""
    try:
        since = prometheus.parse_duration(args.since)
        end = parse_time(args.until) if args.until else time.time()
    except ValueError as err:
        raise Failure(str(err)) from None
    return end - since, end, prometheus.step_for(since)


def measure(args: argparse.Namespace, policy: Policy, url: str | None, objects: Sequence[Mapping[str, Any]],
            namespace: str | None, progress: bool = True) -> usage.Report:
    """Read the window's dcgm-exporter series from `url` and judge them against the listed cluster objects."""
    if not url:
        raise Failure(f"no Prometheus to read: pass --prometheus URL, set ${PROMETHEUS_ENV}, or set "
                      "usage.prometheus in the rules")
    start, end, step = window(args)
    try:
        prom = prometheus.Prometheus(url, timeout=args.timeout)
        series = (_read_with_progress(prom, start, end, step) if progress
                  else prometheus.read_series(prom, start, end, step))
    except prometheus.PrometheusError as err:
        raise Failure(str(err)) from None
    pods = usage.pods_from_objects(objects, lambda name: policy.gpu_resource(name) is not None)
    try:
        return usage.analyse(series, pods, policy.usage, start=start, end=end, step=step, namespace=namespace)
    except usage.UsageError as err:
        raise Failure(f"{url}: {err}{'' if series else _present_now(prom)}") from None


def _present_now(prom: prometheus.Prometheus) -> str:
    """For an empty window: whether the server has the metrics at all right now (an instant query)."""
    try:
        names = prometheus.present_metrics(prom, time.time())
    except prometheus.PrometheusError:
        return ""
    if names:
        return f". It has {', '.join(names)} now: widen --since, or move --until to when the Pods ran"
    return ". It has none of them now either"


def run_usage(args: argparse.Namespace) -> int:
    from webhook.cluster import kube, reads  # imported on use: `gpu-webhook serve` builds this parser too

    policy = load_policy(resolve_rules(args.rules))
    url = prometheus_url(args, policy)
    if not url:
        return _fail(f"no Prometheus to read: pass --prometheus URL, set ${PROMETHEUS_ENV}, or set usage.prometheus "
                     "in the rules")
    if args.plot_file is not None:
        try:  # refused before anything is read
            usage_plot.format_of(args.plot_file)
            usage_plot.require_matplotlib("--plot-file")
        except usage_plot.PlotError as err:
            return _fail(str(err))
    if args.html_file is not None and not args.html_file.parent.is_dir():
        return _fail(f"--html-file {args.html_file}: the directory {args.html_file.parent} does not exist; name a "
                     "file in a directory that exists and is writable")
    try:
        window(args)  # a bad --since or --until is refused before anything is read
        api = kube.api_client(args.kubeconfig, context=args.context)
        namespace = None if args.all_namespaces else (args.namespace or kube.context_namespace(args.kubeconfig,
                                                                                              args.context))
        report = measure(args, policy, url, reads.read_workloads(api, namespace), namespace)
    except kube.KubeError as err:
        return _fail(str(err))
    except Failure as err:
        return _fail(str(err))
    out = sys.stdout
    if args.output == "json":
        json.dump({"prometheus": url, "rules": policy.digest, **report.to_json()}, out, indent=2)
        out.write("\n")
    elif args.output == "csv":
        write_csv(report, out)
    else:
        render(report, out, f"{url}; rules {policy.digest}")
    if args.plot:
        found = find_workload(report, args.plot)
        if found is None:
            return _fail(f"--plot {args.plot}: no such workload in the report; workloads are: "
                         f"{', '.join(str(w.workload) for w in report.workloads) or '(none)'}")
        target = sys.stderr if args.output != "human" else out
        target.write(plot(found, color=target.isatty()) + "\n")
    if args.plot_file is not None:
        drawn = usage_chart.chart(report, policy.usage.idle_below)
        try:
            fmt = usage_plot.write(drawn, args.plot_file, usage_plot.title(drawn, f"{url}; rules {policy.digest}"))
        except usage_plot.PlotError as err:
            return _fail(str(err))
        print(f"gpu-webhook usage: wrote {args.plot_file} ({fmt.upper()})", file=sys.stderr)
    if args.html_file is not None:
        source = f"{url}; rules {policy.digest}"
        try:
            usage_html.write(html_page(report, source, policy.usage.idle_below), args.html_file)
        except usage_html.HtmlError as err:
            return _fail(str(err))
        print(f"gpu-webhook usage: wrote {args.html_file} (HTML)", file=sys.stderr)
    return EXIT_OK


def html_page(report: usage.Report, source: str, idle_below: float) -> str:
    """The --html-file page: the text report's heading, table and notes, and the figure as SVG when matplotlib is
    installed (without it, the page says how to get it)."""
    try:
        usage_plot.require_matplotlib("--html-file")
    except usage_plot.PlotError:
        svg = None
    else:
        drawn = usage_chart.chart(report, idle_below)
        svg = usage_plot.render(drawn, "svg", usage_plot.title(drawn, source))
    return usage_html.page(heading(report, source), HEADER, table(report), notes(report), svg, NONE_IN_SCOPE)


def parse_time(text: str) -> float:
    """Unix seconds, or an RFC 3339 time (2026-12-04T16:00:00Z)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"--until {text!r} is neither unix seconds nor an RFC 3339 time such as "
                         "2026-12-04T16:00:00Z") from None


def _read_with_progress(prom: prometheus.Prometheus, start: float, end: float, step: float) -> list[usage.Series]:
    """The range queries, with a progress bar on standard error when it is a terminal."""
    from tqdm import tqdm

    with tqdm(total=len(prometheus.ROLLUPS), desc="querying Prometheus", unit="query", file=sys.stderr,
              disable=not sys.stderr.isatty(), leave=False) as bar:
        def progress(metric: str) -> None:
            if bar.n or metric != next(iter(prometheus.ROLLUPS)):
                bar.update(1)
            bar.set_postfix_str(metric)

        series = prometheus.read_series(prom, start, end, step, progress)
        bar.update(bar.total - bar.n)
    return series


def find_workload(report: usage.Report, name: str) -> usage.WorkloadUsage | None:
    for row in report.workloads:
        w = row.workload
        if name in (w.name, f"{w.kind}/{w.name}", f"{w.kind.lower()}/{w.name}", str(w)):
            return row
    return None


# --------------------------------------------------------------------------------------------- output


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _mem(row: usage.WorkloadUsage) -> str:
    peak = "?" if row.fb_peak_mib is None else f"{row.fb_peak_mib:,.0f}"
    card = "?" if row.card_mib is None else f"{row.card_mib:,.0f}"
    return f"{peak}/{card} MiB"


def render(report: usage.Report, out: TextIO, source: str) -> None:
    out.write(f"{heading(report, source)}\n\n")
    rows = [HEADER, *table(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] + "\n")
    if not report.workloads:
        out.write(f"{NONE_IN_SCOPE}\n")
    lines = notes(report)
    out.write(f"\n{lines[0]}\n")
    for line in lines[1:]:
        out.write(f"{line}\n")


HEADER = ("WORKLOAD", "GPUS", "GPU-H", "IDLE-H", "P50", "P95", "MEMORY PEAK/CARD", "VERDICT", "SUGGESTION")
NONE_IN_SCOPE = "(no GPU-holding workload in scope)"


def heading(report: usage.Report, source: str) -> str:
    """The report's first line: the window (UTC), the step and where the data came from."""
    start = dt.datetime.fromtimestamp(report.start, dt.UTC).strftime("%Y-%m-%d %H:%M")
    end = dt.datetime.fromtimestamp(report.end, dt.UTC).strftime("%Y-%m-%d %H:%M")
    return f"GPU usage {start} to {end} UTC (step {report.step:g} s) from {source}"


def table(report: usage.Report) -> list[tuple[str, ...]]:
    """The ranking's rows as the text report prints them (the columns of HEADER), most idle GPU-hours first."""
    rows: list[tuple[str, ...]] = []
    for r in report.workloads:
        shared = f" (1/{r.shared_with})" if r.shared_with > 1 else ""
        rows.append((str(r.workload), f"{r.gpus:.3g}{shared}", f"{r.gpu_hours:.1f}", f"{r.idle_gpu_hours:.1f}",
                     _pct(r.p50), _pct(r.p95), _mem(r), r.verdict, r.suggestion))
    return rows


def notes(report: usage.Report) -> list[str]:
    """The lines under the table: the totals first, then what was not attributed and why each workload is flagged."""
    whole = int(report.freeable_gpus + 1e-9)
    lines = [f"Total: {report.gpu_hours:.1f} GPU-hours held, {report.idle_gpu_hours:.1f} idle; "
             f"{report.freeable_gpus:.2f} GPUs could be freed ({whole} whole GPU{'s' if whole != 1 else ''})."]
    for miss in report.unjoined:
        lines.append(f"Not attributed: {miss.series} series, {miss.gpu_hours:.1f} GPU-hours: {miss.reason} "
                     f"(e.g. {', '.join(miss.examples)})")
    if report.unallocated_devices:
        lines.append(f"{report.unallocated_devices} device(s) held by no Pod in the window.")
    lines.extend(f"  {r.workload}: {r.reason}" for r in report.workloads
                 if r.verdict in ("idle", "oversized", "underused"))
    return lines


def write_csv(report: usage.Report, out: TextIO) -> None:
    writer = csv.writer(out)
    writer.writerow(COLUMNS)
    for r in report.workloads:
        writer.writerow([str(r.workload), f"{r.gpus:.4g}", f"{r.gpu_hours:.4f}", f"{r.idle_gpu_hours:.4f}",
                         _num(r.p50), _num(r.p95), r.activity_metric, _num(r.fb_peak_mib), _num(r.card_mib),
                         r.shared_with, r.verdict, r.suggestion, f"{r.freeable_gpus:.4f}", " ".join(r.pods),
                         r.reason])


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def plot(row: usage.WorkloadUsage, width: int = 100, height: int = 20, color: bool = False) -> str:
    """A terminal line chart of the workload's activity (percent of a GPU) over time, with plotext."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    plt.date_form("Y-m-d H:M")
    times = [dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M") for t, _ in row.timeline]
    plt.plot(times, [v * 100 for _, v in row.timeline], marker="braille")
    plt.ylim(0, 100)
    plt.title(f"{row.workload}: {row.activity_metric} (% of a GPU)")
    chart = str(plt.build())
    return chart if color else re.sub(r"\x1b\[[0-9;]*m", "", chart)



# --------------------------------------------------------------------------------------------- audit and doctor


def add_audit_args(parser: argparse.ArgumentParser) -> None:
    """`audit --usage`: the same namespaces' GPU workloads ranked by measured use, after the policy verdicts."""
    parser.add_argument("--usage", action="store_true", help="also rank the GPU workloads in scope by measured "
                        "use (dcgm-exporter data in Prometheus; as `gpu-webhook usage`)")
    parser.add_argument("--since", default="7d", metavar="DURATION", help="with --usage: how far back (default 7d)")
    parser.add_argument("--until", default=None, metavar="TIME", help="with --usage: end of the window (default now)")
    add_prometheus_args(parser)


def audit_usage(args: argparse.Namespace, policy: Policy, namespace: str | None,
                objects: Sequence[Mapping[str, Any]]) -> usage.Report | None:
    """With --usage, the usage report over audit's own scope and objects; raises Failure when it cannot be made."""
    if not args.usage:
        return None
    return measure(args, policy, prometheus_url(args, policy), objects, namespace)


def add_doctor_args(parser: argparse.ArgumentParser) -> None:
    """`doctor` reports the Pod's usage when a Prometheus is configured (--prometheus, the env, or the rules)."""
    parser.add_argument("--since", default="7d", metavar="DURATION",
                        help="with a Prometheus configured: how far back to read the Pod's usage (default 7d)")
    parser.add_argument("--until", default=None, metavar="TIME", help="end of that window (default now)")
    add_prometheus_args(parser)


def doctor_usage(args: argparse.Namespace, policy: Policy, pod: Mapping[str, Any],
                 objects: Sequence[Mapping[str, Any]]) -> list[str]:
    """Lines on the Pod's measured use for `doctor`, or none when no Prometheus is configured. Never raises:
    a Prometheus that cannot answer is a line saying so, since the diagnosis stands without it."""
    url = prometheus_url(args, policy)
    if not url:
        return []
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    try:
        report = measure(args, policy, url, [pod, *objects], namespace, progress=False)
    except Failure as err:
        return [f"Usage: not available: {err}"]
    row = next((w for w in report.workloads if f"{namespace}/{name}" in w.pods), None)
    if row is None:
        return [f"Usage over {args.since} from {url}: no dcgm-exporter series name this Pod (it held no GPU in "
                "that time, or the exporter's pod labels do not reach Prometheus)"]
    return [f"Usage over {args.since} from {url} ({row.workload}): {row.gpus:.3g} GPU, {row.gpu_hours:.1f} "
            f"GPU-hours, {row.idle_gpu_hours:.1f} idle; activity p50 {_pct(row.p50)}, p95 {_pct(row.p95)}; "
            f"memory {_mem(row)}",
            f"  {row.verdict}: {row.suggestion} ({row.reason})"]
