"""In-process decision cost: evaluate + patch for realistic objects. Prints numbers; not a test.

    python bench/decision.py [--seconds 2]

Target (issue 2): median under 50 µs for a typical one-container GPU Pod CREATE.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

from webhook.admission.loader import load_policy
from webhook.policy.engine import Context, evaluate
from webhook.policy.patch import operations


def _gpu_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "train-7d9c8b6f5-", "namespace": "team-a",
                     "labels": {"app": "train", "pod-template-hash": "7d9c8b6f5"}},
        "spec": {
            "containers": [{"name": "main", "image": "nvcr.io/x:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                            "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
            "serviceAccountName": "default", "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
        },
    }


def _big_pod() -> dict[str, Any]:
    pod = _gpu_pod()
    env = [{"name": f"VAR_{i}", "value": "x" * 40} for i in range(20)]
    pod["spec"]["containers"] = [
        {"name": f"c{i}", "image": "nvcr.io/x:1", "env": env,
         "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2", "memory": "4Gi"},
                       "requests": {"nvidia.com/gpu": "1", "cpu": "2", "memory": "4Gi"}}}
        for i in range(4)
    ]
    return pod


def _deployment() -> dict[str, Any]:
    pod = _gpu_pod()
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "train"}},
                     "template": {"metadata": {"labels": {"app": "train"}}, "spec": pod["spec"]}}}


def measure(name: str, obj: dict[str, Any], seconds: float) -> None:
    policy = load_policy()
    ctx = Context("team-a", "CREATE", "mutate")
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter_ns()
        verdict = evaluate(policy, obj, ctx)
        operations(obj, verdict.edits)
        samples.append((time.perf_counter_ns() - start) / 1000)
    samples.sort()
    p99 = samples[int(len(samples) * 0.99)]
    size = len(json.dumps(obj))
    print(f"{name:34} {size:6d} B  n={len(samples):7d}  median {statistics.median(samples):7.1f} µs  "
          f"p99 {p99:7.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per case")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, evaluate + patch per object")
    measure("1-container GPU Pod (mutate)", _gpu_pod(), args.seconds)
    measure("4-container GPU Pod, 20 env each", _big_pod(), args.seconds)
    measure("GPU Deployment (validate only)", _deployment(), args.seconds)
    no_gpu = _gpu_pod()
    no_gpu["spec"]["containers"][0]["resources"] = {}
    measure("Pod without GPU", no_gpu, args.seconds)


if __name__ == "__main__":
    main()
