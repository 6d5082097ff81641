"""The e2e suite's cluster: a real control plane on 127.0.0.1, the seed's kwok nodes and the webhook run by URL.

One module per thing the harness starts, composed here:
- `controlplane.py`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and the clients on them;
- `kwok_nodes.py`: kwok and the seed's fake nodes (2 x A100, 2 x T4, 1 CPU-only), the RuntimeClass `nvidia`;
- `webhook_url.py`: `gpu-webhook serve --cluster` on 127.0.0.1, registered by URL;
- `realnode.py`: an opt-in real node (kubelet + containerd + runc + bridge CNI), only for the real-node tests;
- `installed.py`: the webhook as shipped (image, `helm install`), on the real node;
- `procs.py`, `pki.py`, `objects.py`: processes, certificates, shared objects and queries.

`Cluster.start()` runs the control plane, kwok and its nodes, then the webhook; `Cluster.stop()` ends every
process group it started (SIGTERM, then SIGKILL); every process is also stopped at exit, so none outlives the
session even when it fails.

This module is a facade: test files import every name they need from `cluster`, and it keeps re-exporting them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from controlplane import BUILD_SCRIPT, CONTROL_PLANE, ControlPlane, build_binaries, compact_etcd, etcd_call
from kwok_nodes import KWOK_ANNOTATION, SEED_NODES, KwokNodes, device_plugin_daemonset, node_gpus, seed_nodes
from objects import SEED_POD_INJECTED, CreateLoop, events_for, gpu_pod, injected, pod_json, wait_scheduled
from pki import Pem, new_ca, new_leaf
from procs import (
    GPU,
    GPU_TAINT,
    HERE,
    LOOPBACK,
    REPO,
    WEBHOOK_NAMESPACE,
    ClusterError,
    Json,
    Proc,
    free_port,
    signal_group,
    spawn,
    wait_until,
    yaml_of,
)
from webhook_url import UrlWebhook, edited_rules, wait_rules_digest, webhook_readyz, write_rules

__all__ = [
    "BUILD_SCRIPT", "GPU", "GPU_TAINT", "HERE", "KWOK_ANNOTATION", "LOOPBACK", "REPO", "SEED_NODES",
    "SEED_POD_INJECTED", "WEBHOOK_NAMESPACE", "Cluster", "ClusterError", "ControlPlane", "CreateLoop", "Json",
    "KwokNodes", "Pem",
    "Proc", "UrlWebhook", "build_binaries", "compact_etcd", "device_plugin_daemonset", "edited_rules", "etcd_call",
    "events_for", "free_port", "gpu_pod", "injected", "new_ca", "new_leaf", "node_gpus", "pod_json",
    "running_cluster", "seed_nodes", "signal_group", "spawn", "wait_rules_digest", "wait_scheduled", "wait_until",
    "webhook_readyz", "write_rules", "yaml_of",
]


@dataclass
class Cluster(UrlWebhook, KwokNodes):
    """The control plane, the seed's kwok nodes and the webhook registered by URL; see the module docstring."""

    webhook_port: int = 0
    webhook_metrics_port: int = 0
    webhook_tls: Path = Path()
    webhook_rules: Path = Path()

    def start(self) -> None:
        """Start everything and create the seed's cluster; raises ClusterError with the logs on failure."""
        steps: list[tuple[str, Callable[[], None]]] = [
            *self.start_control_plane(),
            ("kwok", self._start_kwok), ("seed objects", self._create_seed), ("gpu-webhook", self.start_webhook),
            ("webhook configurations", self._register_webhooks),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                raise ClusterError(f"starting {what} failed: {exc}\n{self.logs()}") from exc

    def stop(self) -> None:
        """Stop every process, webhook first; safe to call twice."""
        self.stop_procs(["gpu-webhook", "kwok", *CONTROL_PLANE])


@contextlib.contextmanager
def running_cluster(workdir: Path) -> Iterator[Cluster]:
    """Build (or reuse) the binaries, start the cluster, yield it, stop it."""
    cluster = Cluster(bindir=build_binaries(), workdir=workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
