"""Objects and small queries the e2e tests share: a GPU Pod, what the webhook injects into the seed's Pod, a Pod
as stored, its scheduling and its events.
"""

from __future__ import annotations

import json
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

