"""Cluster awareness at scale on the real API server: two control planes of tests/e2e side by side, one with the
seed's 5 nodes, one with the seed plus `--nodes` kwok nodes in GPU pools. Prints numbers; not a test, not in CI.

    export PATH=$HOME/.cache/gpu-webhook-e2e/v1.36.3/bin:$PATH
    python bench/scale_e2e.py --nodes 5000            # the big cluster: seed + 5,000 kwok nodes

The pools (every GPU node with GPU Feature Discovery's labels and the nvidia.com/gpu taint): T4 (4 GPUs), A100
(8), H100 (8), A100 in MIG mixed mode (nvidia.com/mig-1g.10gb x 7, no whole GPUs), T4 time-sliced
(nvidia.com/gpu.replicas=4, product Tesla-T4-SHARED, 16 nvidia.com/gpu), and CPU-only nodes: 15/25/10/10/10/30 %.

Measured, each cluster's webhook being `gpu-webhook serve --cluster` as the e2e suite runs it:

- Pod-create latency through the API server (server-side dry run: admission runs, nothing is stored), the
  seed's one-GPU Pod and a pinned A100 Pod, alternating between the two clusters in rounds, while the big cluster
  churns: a label and a Ready condition changed on `--churn` nodes per minute, and a pool scaled up by
  `--scale-up` nodes in the middle of the run;
- the webhook's RSS (master and workers) on both clusters;
- the time from a node's label change to the webhook acting on it: a Pod pinned to a label no node has is warned
  (gpu-class-no-node); the label is set on one node, and dry runs every 50 ms time the first answer without the
  warning; then the label is removed and the warning's return is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from cluster import GPU, GPU_TAINT, KWOK_ANNOTATION, Cluster, gpu_pod, running_cluster, yaml_of  # noqa: E402
from kubernetes import client  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

TRAINING = {"gpu-webhook.io/workload": "training", "gpu-webhook.io/gpu-type": "a100"}
GFD = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.machine": "kwok", "nvidia.com/cuda.driver-version.full":
       "550.127.05", "nvidia.com/cuda.runtime-version.full": "12.4", "nvidia.com/gpu.sharing-strategy": "none",
       "nvidia.com/gpu.replicas": "1"}
POOLS: dict[str, tuple[float, dict[str, str], dict[str, str]]] = {  # share, labels, allocatable
    "t4": (0.15, {"gpu-type": "t4", "workload": "inference", "nvidia.com/gpu.product": "Tesla-T4",
                  "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "15360"}, {GPU: "4"}),
    "a100": (0.25, {"gpu-type": "a100", "workload": "training", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                    "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81920"}, {GPU: "8"}),
    "h100": (0.10, {"gpu-type": "h100", "workload": "training", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559"}, {GPU: "8"}),
    "mig": (0.10, {"gpu-type": "a100-mig", "workload": "inference", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                   "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "1"},
            {GPU: "0", "nvidia.com/mig-1g.10gb": "7"}),
    "shared": (0.10, {"gpu-type": "t4", "workload": "inference", "nvidia.com/gpu.product": "Tesla-T4-SHARED",
                      "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
                      "nvidia.com/gpu.count": "4"}, {GPU: "16"}),
    "cpu": (0.30, {"workload": "cpu"}, {}),
}


def node(pool: str, index: int) -> dict[str, Any]:
    _, labels, extended = POOLS[pool]
    name = f"kw-{pool}-{index:06d}"
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    capacity = {"cpu": "96", "memory": "1024Gi", "pods": "110", **extended}
    gpu = pool != "cpu"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"}, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "topology.kubernetes.io/zone": f"zone-{index % 3}", "bench-pool": pool,
            **(GFD if gpu else {}), **labels}},
        "spec": {"taints": [dict(GPU_TAINT)] if gpu else []},
        "status": {"capacity": capacity, "allocatable": dict(capacity),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "kwok-managed fake node", "lastHeartbeatTime": now,
                                   "lastTransitionTime": now}]},
    }


def fleet(size: int, start: dict[str, int] | None = None) -> list[dict[str, Any]]:
    nodes = []
    for pool, (share, _, _) in POOLS.items():
        first = (start or {}).get(pool, 0)
        nodes += [node(pool, first + i) for i in range(round(size * share))]
    return nodes


def create_nodes(cluster: Cluster, nodes: list[dict[str, Any]], batch: int = 250) -> None:
    for i in range(0, len(nodes), batch):
        cluster.kubectl("create", "-f", "-", input=yaml_of(*nodes[i:i + batch]))


def rss_mib(cluster: Cluster) -> float:
    """The webhook's resident memory: its gunicorn master and workers (the process group's members)."""
    leader = cluster.procs["gpu-webhook"].popen.pid
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) == leader:  # pgid
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
    return total / 1024


def dry_run(core: Any, namespace: str, pod: dict[str, Any]) -> tuple[float, str]:
    """(seconds, answer) of one server-side dry-run create; the answer is "ok", the warnings, or the denial."""
    began = time.perf_counter()
    try:
        _, _, headers = core.create_namespaced_pod_with_http_info(namespace, pod, dry_run="All")
        answer = headers.get("Warning") or "ok"
    except ApiException as exc:
        answer = str(json.loads(exc.body).get("message")) if exc.body else str(exc)
    return time.perf_counter() - began, answer


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class Churn(threading.Thread):
    """A label and the Ready condition changed on `per_minute` nodes a minute, spread evenly."""

    def __init__(self, cluster: Cluster, names: list[str], per_minute: int) -> None:
        super().__init__(daemon=True)
        self.core = client.CoreV1Api(cluster.api())
        self.names, self.per_minute, self.done = names, per_minute, threading.Event()
        self.applied = 0

    def run(self) -> None:
        i = 0
        while not self.done.wait(60 / max(self.per_minute, 1)):
            name = self.names[i % len(self.names)]
            ready = "False" if (i // len(self.names)) % 2 == 0 else "True"
            with contextlib.suppress(ApiException):
                self.core.patch_node(name, {"metadata": {"labels": {"bench-churn": str(i)}}})
                self.core.patch_node_status(name, {"status": {"conditions": [
                    {"type": "Ready", "status": ready, "reason": "BenchChurn", "message": "bench/scale_e2e.py"}]}})
                self.applied += 1
            i += 1


def label_latency(cluster: Cluster, namespace: str, target: str, rounds: int) -> list[float]:
    """Seconds from a label change on `target` to the webhook answering differently, both directions."""
    core = client.CoreV1Api(cluster.api())
    pod = gpu_pod("canary", gpus=1, labels=TRAINING, node_selector={"bench-canary": "yes"})
    seen: list[float] = []
    for r in range(rounds):
        for value, wanted_warning in (("yes", False), (None, True)):
            core.patch_node(target, {"metadata": {"labels": {"bench-canary": value}}})
            began = time.perf_counter()
            while True:
                _, answer = dry_run(core, namespace, pod)
                if ("gpu-class-no-node" in answer) == wanted_warning:
                    break
                if time.perf_counter() - began > 60:
                    raise SystemExit(f"the webhook did not act on bench-canary={value} within 60 s (round {r})")
                time.sleep(0.05)
            seen.append(time.perf_counter() - began)
    return seen


@contextlib.contextmanager
def two_clusters(workdir: Path) -> Iterator[tuple[Cluster, Cluster]]:
    with running_cluster(workdir / "small") as small, running_cluster(workdir / "big") as big:
        yield small, big


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000, help="kwok nodes added to the big cluster")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds")
    parser.add_argument("--per-round", type=int, default=40, help="dry-run creates per Pod per cluster per round")
    parser.add_argument("--churn", type=int, default=300, help="nodes changed per minute during the run")
    parser.add_argument("--scale-up", type=int, default=500, help="A100 nodes added halfway through the run")
    parser.add_argument("--label-rounds", type=int, default=5, help="label change -> webhook acting, rounds")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="scale-e2e-"))
    with two_clusters(workdir) as (small, big):
        began = time.perf_counter()
        create_nodes(big, fleet(args.nodes))
        created = time.perf_counter() - began
        for cluster in (small, big):
            cluster.ensure_namespace("bench")
        cores = {"5 nodes": client.CoreV1Api(small.api()), f"{args.nodes + 5:,} nodes": client.CoreV1Api(big.api())}
        pods = {"seed Pod": gpu_pod("seed", gpus=1),
                "pinned A100 Pod": gpu_pod("pinned", gpus=4, labels=TRAINING, node_selector={"gpu-type": "a100"})}
        big_core = cores[f"{args.nodes + 5:,} nodes"]
        expected = len(fleet(args.nodes)) + 5
        deadline = time.monotonic() + 600
        while dry_run(big_core, "bench", pods["pinned A100 Pod"])[1] != "ok" and time.monotonic() < deadline:
            time.sleep(1)
        print(f"big cluster: {expected:,} nodes created in {created:.0f} s (kubectl create, 250 a call)")
        names = [n["metadata"]["name"] for n in fleet(args.nodes) if n["metadata"]["labels"]["bench-pool"] != "cpu"]
        churn = Churn(big, names, args.churn)
        churn.start()
        samples: dict[tuple[str, str], list[float]] = {(c, p): [] for c in cores for p in pods}
        answers: dict[tuple[str, str], set[str]] = {(c, p): set() for c in cores for p in pods}
        for r in range(args.rounds):
            if r == args.rounds // 2 and args.scale_up:
                threading.Thread(target=create_nodes, daemon=True, args=(
                    big, [node("a100", 900_000 + i) for i in range(args.scale_up)])).start()
            for cluster_name, core in cores.items():
                for pod_name, pod in pods.items():
                    for _ in range(args.per_round):
                        seconds, answer = dry_run(core, "bench", pod)
                        samples[(cluster_name, pod_name)].append(seconds)
                        answers[(cluster_name, pod_name)].add(answer[:80])
        churn.done.set()
        print(f"Pod create (server-side dry run), {args.rounds} alternating rounds x {args.per_round} per Pod; "
              f"churn: {churn.applied} nodes changed (label + Ready), {args.scale_up} A100 nodes added mid-run")
        for (cluster_name, pod_name), values in samples.items():
            ms = [v * 1000 for v in values]
            print(f"  {cluster_name:>12} {pod_name:16} p50 {statistics.median(ms):6.1f} ms  "
                  f"p99 {percentile(ms, 0.99):6.1f} ms  answers {sorted(answers[(cluster_name, pod_name)])}")
        print(f"webhook RSS (master + workers): 5 nodes {rss_mib(small):.0f} MiB, "
              f"{args.nodes + 5:,} nodes {rss_mib(big):.0f} MiB")
        latency = label_latency(big, "bench", names[len(names) // 3], args.label_rounds)
        print(f"node label change -> webhook acting: median {statistics.median(latency) * 1000:.0f} ms, "
              f"max {max(latency) * 1000:.0f} ms over {len(latency)} changes (dry runs every 50 ms)")
        print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
