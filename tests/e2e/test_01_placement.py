"""Scenario 1: the seed's GPU workloads are mutated by the real API server's webhook call and placed by the real
scheduler on the right GPU nodes."""

from __future__ import annotations

import json

import pytest
import yaml
from cluster import SEED_NODES, SEED_POD_INJECTED, Cluster, injected, pod_json, wait_scheduled, wait_until

pytestmark = pytest.mark.e2e

CUDA_GPU_TEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: cuda-gpu-test
spec:
  restartPolicy: Never
  containers:
    - name: cuda
      image: nvidia/cuda:12.4.1-base-ubuntu22.04
      command: ["nvidia-smi"]
      resources:
        limits:
          nvidia.com/gpu: 1
"""

A100_JOB = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: a100-job
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      nodeSelector:
        accelerator: nvidia-a100
      containers:
        - name: train
          image: nvidia/cuda:12.4.1-base-ubuntu22.04
          command: ["nvidia-smi"]
          resources:
            limits:
              nvidia.com/gpu: 1
"""


def _gpu_type(node: str) -> str | None:
    spec = SEED_NODES[node]
    return spec[0] if spec else None


def test_cuda_gpu_test_lands_on_a_t4_node_with_the_injected_fields(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=CUDA_GPU_TEST)
    node = wait_scheduled(cluster, namespace, "cuda-gpu-test")
    assert _gpu_type(node) == "t4", f"bound to {node}"

    wide = cluster.kubectl("get", "pod", "cuda-gpu-test", "-n", namespace, "-o", "wide").stdout
    assert node in wide

    shown = yaml.safe_load(cluster.kubectl("get", "pod", "cuda-gpu-test", "-n", namespace, "-o", "yaml").stdout)
    assert injected(shown) == SEED_POD_INJECTED
    # kwok plays the kubelet: the bound Pod runs.
    wait_until(lambda: pod_json(cluster, namespace, "cuda-gpu-test")["status"].get("phase") == "Running", 30,
               "cuda-gpu-test to run")


def test_a100_job_lands_on_an_a100_node(cluster: Cluster, namespace: str) -> None:
    # Needs issue 15: a Pod whose own nodeSelector names its GPU (accelerator: nvidia-a100) gets that class.
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=A100_JOB)

    def pod_name() -> str | None:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", "job-name=a100-job",
                                          "-o", "json").stdout)["items"]
        return pods[0]["metadata"]["name"] if pods else None

    name = str(wait_until(pod_name, 30, "the Job's Pod"))
    pod = pod_json(cluster, namespace, name)
    selector = pod["spec"].get("nodeSelector", {})
    assert selector.get("accelerator") == "nvidia-a100"
    assert selector.get("gpu-type", "a100") == "a100", f"class contradicts the Pod's own selector: {selector}"
    node = wait_scheduled(cluster, namespace, name, timeout=30)
    assert _gpu_type(node) == "a100", f"bound to {node}"
