"""Pod-create latency through a real kube-apiserver, with the webhook and without it. Prints numbers; not a test.

    python bench/pod_create.py [--creates 300] [--rounds 2] [--dry-run]

Starts the e2e control plane (tests/e2e/cluster.py; binaries from tests/e2e/build.sh, built on first use), then in
each round creates `--creates` one-GPU Pods one after another with the webhook registered (the shipped mutating and
validating configurations, so two calls per Pod), removes the webhook configurations, and creates as many again.
Latency is the client's wall time of one `POST /api/v1/namespaces/NS/pods` (Python client, keep-alive). The Pods
name a scheduler that does not exist, so scheduling does not compete for the 2 cores; they are deleted between
batches. `--dry-run` asks for server-side dry runs instead (no etcd write).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

import yaml
from cluster import Cluster, gpu_pod, running_cluster, wait_until


def _pod() -> dict[str, Any]:
    pod = gpu_pod("unused", gpus=1)
    pod["metadata"] = {"generateName": "bench-"}
    pod["spec"]["schedulerName"] = "bench-nobody"
    return pod


def _batch(core: Any, namespace: str, creates: int, dry_run: bool) -> list[float]:
    pod = _pod()
    latencies = []
    for _ in range(creates):
        started = time.perf_counter()
        core.create_namespaced_pod(namespace, pod, dry_run="All" if dry_run else None, _preload_content=False)
        latencies.append(time.perf_counter() - started)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    return latencies


def _webhook_active(core: Any, namespace: str) -> bool:
    created = core.create_namespaced_pod(namespace, _pod(), dry_run="All")
    return bool(created.spec.runtime_class_name == "nvidia")


def _sums(text: str, metric: str) -> dict[str, tuple[float, float]]:
    """{labels: (sum, count)} of a Prometheus histogram in `text`."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, index in (("_sum", 0), ("_count", 1)):
            if line.startswith(metric + part):
                labels, value = line[len(metric + part):].rsplit(" ", 1)
                out.setdefault(labels, [0.0, 0.0])[index] = float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _where_the_time_goes(cluster: Cluster) -> list[str]:
    """Mean time per webhook call as the API server measures it, and inside the webhook."""
    _, text = cluster.raw_text("/metrics")
    lines = []
    for labels, (total, count) in _sums(text, "apiserver_admission_webhook_admission_duration_seconds").items():
        if "gpu-webhook" in labels and count:
            lines.append(f"  API server, per call {labels}: mean {1000 * total / count:.2f} ms over {count:.0f}")
    for labels, (total, count) in _sums(cluster.webhook_metrics(), "gpu_webhook_review_duration_seconds").items():
        if count:
            lines.append(f"  inside the webhook {labels}: mean {1000 * total / count:.2f} ms over {count:.0f}")
    return lines


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p = statistics.quantiles(ms, n=100)
    return (f"{name:<16} n={len(ms):<5} p50 {p[49]:6.2f} ms   p90 {p[89]:6.2f} ms   p99 {p[98]:6.2f} ms   "
            f"mean {statistics.fmean(ms):6.2f} ms")


def main() -> int:
    """Run the rounds and print the percentiles."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creates", type=int, default=300, help="Pod creates per batch (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (with, without) batches (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="server-side dry-run creates (no etcd write)")
    args = parser.parse_args()

    from kubernetes import client

    with tempfile.TemporaryDirectory(prefix="pod-create-bench-") as tmp, running_cluster(Path(tmp)) as cluster:
        cluster.ensure_namespace("bench")
        core = client.CoreV1Api(cluster.api())
        configs = cluster.rendered_webhook_configurations()
        _batch(core, "bench", 20, args.dry_run)  # warm-up: connections, caches
        results: dict[str, list[float]] = {"with webhook": [], "without webhook": []}
        breakdown: list[str] = []
        for _ in range(args.rounds):
            results["with webhook"] += _batch(core, "bench", args.creates, args.dry_run)
            breakdown = _where_the_time_goes(cluster)
            cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "gpu-webhook")
            wait_until(lambda: not _webhook_active(core, "bench"), 30, "the webhook to be unregistered")
            _batch(core, "bench", 20, args.dry_run)
            results["without webhook"] += _batch(core, "bench", args.creates, args.dry_run)
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(configs))
            wait_until(lambda: _webhook_active(core, "bench"), 30, "the webhook to be registered")
            _batch(core, "bench", 20, args.dry_run)

    print(f"Pod create through kube-apiserver ({'server dry-run' if args.dry_run else 'stored in etcd'}), "
          f"{args.rounds} round(s) x {args.creates} creates, Python {platform.python_version()}, "
          f"{platform.machine()}")
    for name, seconds in results.items():
        print(_summary(name, seconds))
    with_p50 = statistics.median(results["with webhook"])
    without_p50 = statistics.median(results["without webhook"])
    print(f"webhook adds {1000 * (with_p50 - without_p50):.2f} ms at the median (two calls: mutate, validate)")
    print("mean per call (cumulative over the run, warm-ups included):")
    print("\n".join(breakdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
