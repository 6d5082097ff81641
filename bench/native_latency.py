"""Pod-create latency through a real kube-apiserver in four modes, interleaved. Prints numbers; not a test.

    python bench/native_latency.py [--creates 300] [--dry-run]

Starts the e2e control plane (tests/e2e/cluster.py; it registers gpu-webhook), applies the native policies
(`gpu-webhook policies render`), and scopes each mode to one namespace by a label, `bench.gpu-webhook.io/mode`:

- none:    no webhook and no policy (the namespace carries the opt-out label gpu-webhook.io/ignore);
- native:  the MutatingAdmissionPolicy and the ValidatingAdmissionPolicies only;
- hybrid:  the native policies, plus the validating webhook (the cluster-aware rules) and the mutating webhook
           narrowed by matchConditions to the Pods native mode defers (`native.hybrid_match_conditions`): a plain
           GPU Pod is not sent to it;
- webhook: the mutating and validating webhooks, as shipped (today's deployment).

Then `--creates` rounds, each creating one one-GPU Pod per mode in a shuffled order, so that all four modes see
the same machine load. Latency is the client's wall time of one `POST .../pods` (Python client, keep-alive).
The Pods name a scheduler that does not exist, so scheduling does not compete for the cores; they are deleted
every 100 rounds. Afterwards it prints the API server's own `apiserver_admission_*_duration_seconds`
(per step, per plugin and per webhook: mean over the run, all modes together).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

import yaml
from cluster import Cluster, gpu_pod, running_cluster, wait_until

from webhook.admission.loader import load_policy
from webhook.policy import native

HERE = Path(__file__).resolve().parent
MODES = ("none", "native", "hybrid", "webhook")
MODE_LABEL = "bench.gpu-webhook.io/mode"


def _pod() -> dict[str, Any]:
    pod = gpu_pod("unused", gpus=1)
    pod["metadata"] = {"generateName": "bench-"}
    pod["spec"]["schedulerName"] = "bench-nobody"
    return pod


def _in_modes(selector: dict[str, Any], modes: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(selector)
    out.setdefault("matchExpressions", []).append({"key": MODE_LABEL, "operator": "In", "values": modes})
    return out


def _configure(cluster: Cluster) -> None:
    """Webhook configurations and policy bindings scoped to the modes' namespaces."""
    policy = load_policy(HERE.parent / "rules")
    objects = native.render(policy)
    for obj in objects:
        if obj["kind"].endswith("Binding"):
            obj["spec"]["matchResources"]["namespaceSelector"] = _in_modes(
                obj["spec"]["matchResources"]["namespaceSelector"], ["native", "hybrid"])
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(objects[0]))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{objects[0]['metadata']['name']}", "--timeout=60s")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects[1:]))
    mutating, validating = cluster.rendered_webhook_configurations()
    hook = mutating["webhooks"][0]
    narrowed = copy.deepcopy(hook)
    hook["namespaceSelector"] = _in_modes(hook["namespaceSelector"], ["webhook"])
    narrowed["name"] = "hybrid.mutate.gpu-webhook.io"
    narrowed["namespaceSelector"] = _in_modes(narrowed["namespaceSelector"], ["hybrid"])
    narrowed["matchConditions"] = narrowed.get("matchConditions", []) + native.hybrid_match_conditions(policy)
    mutating["webhooks"].append(narrowed)
    for vhook in validating["webhooks"]:
        vhook["namespaceSelector"] = _in_modes(vhook["namespaceSelector"], ["webhook", "hybrid"])
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([mutating, validating]))
    for mode in MODES:
        labels = {MODE_LABEL: mode} | ({"gpu-webhook.io/ignore": "true"} if mode == "none" else {})
        cluster.ensure_namespace(f"bench-{mode}", labels=labels)


def _mutated(core: Any, mode: str) -> bool:
    created = core.create_namespaced_pod(f"bench-{mode}", _pod(), dry_run="All")
    return bool(created.spec.runtime_class_name == "nvidia")


def _sums(text: str, metric: str) -> dict[str, tuple[float, float]]:
    """{labels: (sum, count)} of a Prometheus histogram in `text`."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, index in (("_sum", 0), ("_count", 1)):
            if line.startswith(metric + part + "{"):
                labels, value = line[len(metric + part):].rsplit(" ", 1)
                out.setdefault(labels, [0.0, 0.0])[index] = float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _stages(cluster: Cluster) -> list[str]:
    _, text = cluster.raw_text("/metrics")
    names = sorted({line.split("{")[0].rsplit("_", 1)[0] for line in text.splitlines()
                    if line.startswith("apiserver_admission_") and "_duration_seconds_sum{" in line})
    lines = []
    for metric in names:
        for labels, (total, count) in sorted(_sums(text, metric).items()):
            if count and ('resource="pods"' in labels or "gpu-webhook" in labels or "AdmissionPolicy" in labels):
                lines.append(f"  {metric}{labels}: mean {1000 * total / count:.3f} ms over {count:.0f}")
    return lines


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p = statistics.quantiles(ms, n=100)
    return f"{name:<8} n={len(ms):<5} p50 {p[49]:6.2f} ms   p90 {p[89]:6.2f} ms   p99 {p[98]:6.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creates", type=int, default=300, help="creates per mode (default 300)")
    parser.add_argument("--dry-run", action="store_true", help="server-side dry-run creates (no etcd write)")
    parser.add_argument("--seed", type=int, default=26, help="seed of the per-round shuffle")
    args = parser.parse_args()

    from kubernetes import client

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="native-bench-") as tmp, running_cluster(Path(tmp)) as cluster:
        _configure(cluster)
        core = client.CoreV1Api(cluster.api())
        for mode in ("native", "hybrid", "webhook"):
            wait_until(lambda m=mode: _mutated(core, m), 60, f"{mode} mode to inject the class")
        assert not _mutated(core, "none"), "the none namespace must see no injection"
        pod = _pod()
        dry = "All" if args.dry_run else None
        results: dict[str, list[float]] = {m: [] for m in MODES}
        for round_ in range(args.creates + 20):
            order = list(MODES)
            rng.shuffle(order)
            for mode in order:
                started = time.perf_counter()
                core.create_namespaced_pod(f"bench-{mode}", pod, dry_run=dry, _preload_content=False)
                if round_ >= 20:  # the first 20 rounds warm connections and caches
                    results[mode].append(time.perf_counter() - started)
            if round_ % 100 == 99 and not args.dry_run:
                for mode in MODES:
                    core.delete_collection_namespaced_pod(f"bench-{mode}", grace_period_seconds=0)
        stages = _stages(cluster)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    print(f"Pod create through kube-apiserver v1.36.3 ({'server dry-run' if args.dry_run else 'stored in etcd'}), "
          f"{args.creates} creates per mode, interleaved; commit {commit}; Python {platform.python_version()}, "
          f"{platform.machine()}")
    for mode in MODES:
        print(_summary(mode, results[mode]))
    base = statistics.median(results["none"])
    for mode in MODES[1:]:
        print(f"{mode} adds {1000 * (statistics.median(results[mode]) - base):.2f} ms at the median over none")
    print("the API server's admission metrics (mean per observation, the whole run, all modes):")
    print("\n".join(stages))
    print(json.dumps({m: round(1000 * statistics.median(v), 3) for m, v in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
