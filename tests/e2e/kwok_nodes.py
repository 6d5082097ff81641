"""The seed's fake nodes, kept Ready by kwok: 2 x A100 (training), 2 x T4 (inference) and a CPU-only node.

kwok runs no containers: it renews the fake nodes' Leases and moves Pods bound to them to Running. The nodes are
created with their status (capacity, allocatable with `nvidia.com/gpu`, Ready) at CREATE; with them come the
RuntimeClass `nvidia` and NVIDIA's device-plugin DaemonSet (a static manifest: nothing runs it on fake nodes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import yaml
from controlplane import ControlPlane
from procs import GPU, GPU_TAINT, LOOPBACK, WEBHOOK_NAMESPACE, Json, free_port, spawn, wait_until, yaml_of

KWOK_ANNOTATION = "kwok.x-k8s.io/node"


_GFD = {
    "a100": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.family": "ampere",
             "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.compute.major": "8",
             "nvidia.com/gpu.compute.minor": "0", "nvidia.com/mig.capable": "true",
             "nvidia.com/mig.strategy": "single"},
    "t4": {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.family": "turing",
           "nvidia.com/gpu.memory": "15360", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.compute.major": "7",
           "nvidia.com/gpu.compute.minor": "5", "nvidia.com/mig.capable": "false"},
}
_COMMON_GFD = {
    "nvidia.com/gpu.present": "true", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/gpu.machine": "e2e-fake", "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "127", "nvidia.com/cuda.driver-version.revision": "05",
    "nvidia.com/cuda.driver-version.full": "550.127.05", "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4", "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
}
SEED_NODES = {
    "gpu-a100-0": ("a100", "training", "nvidia-a100", 8),
    "gpu-a100-1": ("a100", "training", "nvidia-a100", 8),
    "gpu-t4-0": ("t4", "inference", "nvidia-tesla-t4", 4),
    "gpu-t4-1": ("t4", "inference", "nvidia-tesla-t4", 4),
    "cpu-0": None,
}


def node_gpus(name: str) -> str:
    """The GPU count a seed node advertises ("0" for the CPU node)."""
    spec = SEED_NODES[name]
    return str(spec[3]) if spec else "0"


def seed_nodes() -> list[Json]:
    """The five Nodes of the seed's cluster, with status (capacity, allocatable, Ready) set at CREATE."""
    nodes = []
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, spec in SEED_NODES.items():
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": "e2e-fake"}
        taints: list[Json] = []
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
        if spec:
            gpu_type, workload, accelerator, gpus = spec
            labels |= {"gpu-type": gpu_type, "workload": workload, "accelerator": accelerator,
                       **_COMMON_GFD, **_GFD[gpu_type]}
            taints.append(dict(GPU_TAINT))
            capacity[GPU] = str(gpus)
        else:
            labels["workload"] = "cpu"
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {"taints": taints},
            "status": {
                "capacity": capacity, "allocatable": dict(capacity),
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kwok-managed fake node", "lastHeartbeatTime": now,
                                "lastTransitionTime": now}],
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake",
                             "kubeProxyVersion": "fake", "containerRuntimeVersion": "fake", "osImage": "fake",
                             "kernelVersion": "fake", "machineID": "", "systemUUID": "", "bootID": ""},
                "phase": "Running",
            },
        })
    return nodes


def device_plugin_daemonset() -> Json:
    """NVIDIA's device-plugin DaemonSet (static manifest, v0.17), limited to GPU nodes."""
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"name": "nvidia-device-plugin-ds"}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                    "containers": [{
                        "name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}],
                    }],
                    "volumes": [{"name": "device-plugin",
                                 "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}],
                },
            },
        },
    }



class KwokNodes(ControlPlane):
    """Starts kwok and creates the seed's nodes on a ControlPlane (the Cluster mixes it in)."""

    def _start_kwok(self) -> None:
        stages = self.bindir.parent / "kwok-stages"
        configs = [stages / "node" / "fast" / "node-initialize.yaml",
                   stages / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
                   stages / "pod" / "fast" / "pod-ready.yaml", stages / "pod" / "fast" / "pod-complete.yaml",
                   stages / "pod" / "fast" / "pod-delete.yaml"]
        args = [str(self.bindir / "kwok"), f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                # Pod and node addresses are data only (no kubelet answers on them): keep them on loopback.
                "--cidr=127.64.0.0/16", f"--node-ip={LOOPBACK}",
                "--node-lease-duration-seconds=40", f"--server-address={LOOPBACK}:{free_port()}"]
        for path in configs:
            args += ["--config", str(path)]
        home = self.workdir / "kwok-home"
        home.mkdir(exist_ok=True)
        env = dict(os.environ)
        env["HOME"] = str(home)  # kwok reads ~/.kwok/kwok.yaml by default: keep the user's out of it
        self.procs["kwok"] = spawn("kwok", args, self.logdir, env=env)
        time.sleep(1)
        self._check_alive("kwok")

    # ------------------------------------------------------------------ the seed's cluster

    def _create_seed(self) -> None:
        nodes = seed_nodes()
        self.kubectl("create", "-f", "-", input=yaml.safe_dump_all(nodes))
        node_names = [n["metadata"]["name"] for n in nodes]

        def nodes_ready() -> bool:
            listed = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            by_name = {n["metadata"]["name"]: n for n in listed}
            for name in node_names:
                node = by_name.get(name)
                if node is None:
                    return False
                ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
                taints = [t["key"] for t in node["spec"].get("taints", [])]
                if not ready or ready[0]["status"] != "True" or "node.kubernetes.io/not-ready" in taints:
                    return False
                if node["status"].get("allocatable", {}).get(GPU, "0") != node_gpus(name):
                    return False
            return True

        wait_until(nodes_ready, 90, "the seed's nodes to be Ready with their GPUs and no not-ready taint")
        runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                         "handler": "nvidia"}
        self.kubectl("create", "-f", "-", input=yaml_of(runtime_class, device_plugin_daemonset()))
        self.ensure_namespace(WEBHOOK_NAMESPACE)
