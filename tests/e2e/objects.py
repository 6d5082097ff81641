"""Objects and small queries the e2e tests share: a GPU Pod, what the webhook injects into the seed's Pod, a Pod
as stored, its scheduling and its events.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping

from controlplane import ControlPlane
from procs import GPU, Json, wait_until


def gpu_pod(name: str, gpus: int = 1, labels: Mapping[str, str] | None = None, *,
            requests: Mapping[str, str] | None = None, limits: Mapping[str, str] | None = None,
            node_selector: Mapping[str, str] | None = None) -> Json:
    """A one-container Pod asking for `gpus` in limits (or the given requests/limits)."""
    resources: Json = {}
    if limits is not None or requests is not None:
        if limits is not None:
            resources["limits"] = dict(limits)
        if requests is not None:
            resources["requests"] = dict(requests)
    elif gpus:
        resources["limits"] = {GPU: str(gpus)}
    spec: Json = {"restartPolicy": "Never",
                  "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                                  "command": ["nvidia-smi"], "resources": resources}]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": spec}



# What the webhook gives the seed's cuda-gpu-test Pod with the packaged rules: the default class's nodeSelector and
# runtime class, one GPU toleration (ExtendedResourceToleration added it before the webhook saw the Pod; the
# webhook must not add a second), and the class annotation.
SEED_POD_INJECTED: Json = {
    "nodeSelector": {"workload": "inference", "gpu-type": "t4"},
    "runtimeClassName": "nvidia",
    "gpu tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
    "class": "workload=inference,gpu-type=t4",
}


def injected(pod: Json) -> Json:
    """The parts of a stored Pod that SEED_POD_INJECTED describes."""
    spec = pod["spec"]
    return {
        "nodeSelector": spec.get("nodeSelector"),
        "runtimeClassName": spec.get("runtimeClassName"),
        "gpu tolerations": [t for t in spec.get("tolerations") or () if t.get("key") == GPU],
        "class": (pod["metadata"].get("annotations") or {}).get("gpu-webhook.io/class"),
    }


def pod_json(cluster: ControlPlane, namespace: str, name: str) -> Json:
    """`kubectl get pod -o json`."""
    return dict(json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout))


def wait_scheduled(cluster: ControlPlane, namespace: str, name: str, timeout: float = 60) -> str:
    """Wait until the scheduler has bound the Pod; returns its node name."""
    return str(wait_until(lambda: pod_json(cluster, namespace, name)["spec"].get("nodeName"), timeout,
                          f"pod {namespace}/{name} to be scheduled"))


def events_for(cluster: ControlPlane, namespace: str, kind: str, name: str) -> list[Json]:
    """The events whose involvedObject is kind/name."""
    done = cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                           f"--field-selector=involvedObject.kind={kind},involvedObject.name={name}")
    return list(json.loads(done.stdout)["items"])



class CreateLoop:
    """Creates GPU Pods (server-side dry run: real admission, both webhooks called, nothing stored) in a thread
    until stopped, counting what the API server answered."""

    def __init__(self, cluster: ControlPlane, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.results: list[tuple[int, str]] = []  # (HTTP status, "mutated" | "unmutated" | the refusal)
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods?dryRun=All"
        number = 0
        while not self._stop.is_set():
            number += 1
            started = time.monotonic()
            status, body = self.cluster.raw("POST", path, gpu_pod(f"loop-{number}", gpus=1))
            self.latencies.append(time.monotonic() - started)
            if status == 201:
                self.results.append((status, "mutated" if body["spec"].get("runtimeClassName") else "unmutated"))
            else:
                self.results.append((status, str(body.get("message", body))))

    def __enter__(self) -> CreateLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def summary(self) -> str:
        """p50/p90/p99 of the creates, for a printed measurement."""
        ordered = sorted(self.latencies)

        def at(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000

        return f"p50 {at(0.5):.1f} ms, p90 {at(0.9):.1f} ms, p99 {at(0.99):.1f} ms over {len(ordered)} creates"

    def counts(self) -> dict[str, int]:
        """How many creates were mutated, admitted unmutated, refused."""
        out = {"mutated": 0, "unmutated": 0, "refused": 0}
        for status, what in self.results:
            out[what if status == 201 else "refused"] += 1
        return out
