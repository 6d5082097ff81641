"""Pod-create latency through a real kube-apiserver in four modes, interleaved. Prints numbers; not a test.

    python bench/native_latency.py [--creates 300] [--dry-run] [--mix gpu|cpu|both]

Starts the e2e control plane (tests/e2e/cluster.py; it registers gpu-webhook), applies the native policies
(`gpu-webhook policies render`), and scopes each mode to one namespace by a label, `bench.gpu-webhook.io/mode`:

- none:    no webhook and no policy (the namespace carries the opt-out label gpu-webhook.io/ignore);
- floor:   one ValidatingAdmissionPolicy (`true`) and one MutatingAdmissionPolicy (an empty JSONPatch),
           bound to Pods, no params: the least any in-process policy costs on this API server. Read every native
           figure against it;
- native:  the MutatingAdmissionPolicy and the ValidatingAdmissionPolicies only;
- hybrid:  the native policies, plus the validating webhook narrowed to GPU Pods (the cluster-aware rules;
           `native.hybrid_validating_conditions`) and the mutating webhook narrowed to the Pods native mode defers
           (`native.hybrid_match_conditions`): a plain GPU Pod is sent to the validating webhook only, a CPU-only
           Pod to neither;
- webhook: the mutating and validating webhooks, as shipped (today's deployment).

Then `--creates` rounds, each creating one one-GPU Pod per mode in a shuffled order, so that all modes see the
same machine load (`--mix cpu`: a CPU-only Pod, cpu and memory limits and no GPU; `--mix both`: one of each per
mode and round, shuffled together). Latency is the client's wall time of one `POST .../pods` (Python client,
keep-alive). The Pods name a scheduler that does not exist, so scheduling does not compete for the cores; they
are deleted every 100 rounds. Afterwards it prints the API server's own `apiserver_admission_*_duration_seconds`
(per step, per plugin and per webhook: mean over the run, all modes together), and one JSON line of the medians
in ms: `{"none": ..., "floor": ..., ...}` for the GPU Pods, and `"cpu": {...}` for the CPU-only Pods.
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
MODES = ("none", "floor", "native", "hybrid", "webhook")
MODE_LABEL = "bench.gpu-webhook.io/mode"


def _pod(kind: str = "gpu") -> dict[str, Any]:
    pod = gpu_pod("unused", gpus=1) if kind == "gpu" else gpu_pod("unused", limits={"cpu": "100m", "memory": "64Mi"})
    pod["metadata"] = {"generateName": "bench-"}
    pod["spec"]["schedulerName"] = "bench-nobody"
    return pod


# An empty list(JSONPatch): a bare `[]` is list(dyn), which the API server refuses for a JSONPatch mutation.
_NO_PATCH = "[JSONPatch{op: 'test', path: '/kind', value: 'Pod'}].filter(p, false)"


def _floor() -> list[dict[str, Any]]:
    """The least in-process policy: a VAP whose one validation is `true` and a MAP whose patch is empty, no params."""
    meta = {"labels": {"app.kubernetes.io/name": "bench-floor"}}
    match = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                "resources": ["pods"]}]}
    selector = {"matchLabels": {MODE_LABEL: "floor"}}
    api = "admissionregistration.k8s.io/v1"
    return [
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "bench-floor", **meta},
         "spec": {"matchConstraints": match, "failurePolicy": "Fail", "validations": [{"expression": "true"}]}},
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "bench-floor", **meta},
         "spec": {"policyName": "bench-floor", "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": selector}}},
        {"apiVersion": api, "kind": "MutatingAdmissionPolicy", "metadata": {"name": "bench-floor", **meta},
         "spec": {"matchConstraints": match, "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": _NO_PATCH}}]}},
        {"apiVersion": api, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": "bench-floor", **meta},
         "spec": {"policyName": "bench-floor", "matchResources": {"namespaceSelector": selector}}},
    ]


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
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects[1:] + _floor()))
    mutating, validating = cluster.rendered_webhook_configurations()
    hook = mutating["webhooks"][0]
    narrowed = copy.deepcopy(hook)
    hook["namespaceSelector"] = _in_modes(hook["namespaceSelector"], ["webhook"])
    narrowed["name"] = "hybrid.mutate.gpu-webhook.io"
    narrowed["namespaceSelector"] = _in_modes(narrowed["namespaceSelector"], ["hybrid"])
    narrowed["matchConditions"] = narrowed.get("matchConditions", []) + native.hybrid_match_conditions(policy)
    mutating["webhooks"].append(narrowed)
    (vhook,) = validating["webhooks"]
    vnarrowed = copy.deepcopy(vhook)
    vhook["namespaceSelector"] = _in_modes(vhook["namespaceSelector"], ["webhook"])
    vnarrowed["name"] = "hybrid.validate.gpu-webhook.io"
    vnarrowed["namespaceSelector"] = _in_modes(vnarrowed["namespaceSelector"], ["hybrid"])
    vnarrowed["matchConditions"] = vnarrowed.get("matchConditions", []) + native.hybrid_validating_conditions()
    validating["webhooks"].append(vnarrowed)
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
    parser.add_argument("--mix", choices=("gpu", "cpu", "both"), default="gpu",
                        help="the Pods created: one-GPU (default), CPU-only, or one of each per mode and round")
    args = parser.parse_args()

    from kubernetes import client

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="native-bench-") as tmp, running_cluster(Path(tmp)) as cluster:
        _configure(cluster)
        core = client.CoreV1Api(cluster.api())
        for mode in ("native", "hybrid", "webhook"):
            wait_until(lambda m=mode: _mutated(core, m), 60, f"{mode} mode to inject the class")
        assert not _mutated(core, "none"), "the none namespace must see no injection"
        kinds = ["gpu", "cpu"] if args.mix == "both" else [args.mix]
        pods = {kind: _pod(kind) for kind in kinds}
        dry = "All" if args.dry_run else None
        results: dict[str, dict[str, list[float]]] = {k: {m: [] for m in MODES} for k in kinds}
        time.sleep(3)  # the floor policies were applied with the native ones; let the API server load them
        for round_ in range(args.creates + 20):
            order = [(kind, mode) for kind in kinds for mode in MODES]
            rng.shuffle(order)
            for kind, mode in order:
                started = time.perf_counter()
                core.create_namespaced_pod(f"bench-{mode}", pods[kind], dry_run=dry, _preload_content=False)
                if round_ >= 20:  # the first 20 rounds warm connections and caches
                    results[kind][mode].append(time.perf_counter() - started)
            if round_ % 100 == 99 and not args.dry_run:
                for mode in MODES:
                    core.delete_collection_namespaced_pod(f"bench-{mode}", grace_period_seconds=0)
        stages = _stages(cluster)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    print(f"Pod create through kube-apiserver v1.36.3 ({'server dry-run' if args.dry_run else 'stored in etcd'}), "
          f"{args.creates} creates per mode and Pod kind, interleaved; commit {commit}; Python "
          f"{platform.python_version()}, {platform.machine()}")
    medians: dict[str, Any] = {}
    for kind in kinds:
        print(f"{'one-GPU' if kind == 'gpu' else 'CPU-only'} Pods:")
        for mode in MODES:
            print(_summary(mode, results[kind][mode]))
        base = statistics.median(results[kind]["none"])
        floor = statistics.median(results[kind]["floor"]) - base
        for mode in MODES[1:]:
            adds = statistics.median(results[kind][mode]) - base
            versus = f" ({adds / floor:.2f}x floor)" if mode != "floor" and floor > 0 else ""
            print(f"{mode} adds {1000 * adds:.2f} ms at the median over none{versus}")
        table = {m: round(1000 * statistics.median(v), 3) for m, v in results[kind].items()}
        if kind == "gpu":
            medians.update(table)
        else:
            medians["cpu"] = table
    print("the API server's admission metrics (mean per observation, the whole run, all modes):")
    print("\n".join(stages))
    print(json.dumps(medians))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
