"""Scenario 5: cluster awareness against real watches, and the real scheduler's view of GPU capacity; `doctor` and
`audit` run against this cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cluster import Cluster, events_for, gpu_pod, pod_json, wait_scheduled, wait_until, yaml_of

pytestmark = pytest.mark.e2e

TRAINING = {"gpu-webhook.io/workload": "training", "gpu-webhook.io/gpu-type": "a100"}


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", *args], capture_output=True, text=True,
                          env=cluster.env(), timeout=120)


def test_sixteen_gpus_is_refused_as_never_schedulable(cluster: Cluster, namespace: str) -> None:
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False,
                           input=yaml_of(gpu_pod("sixteen", gpus=16, labels=TRAINING)))
    assert done.returncode == 1
    assert "[gpu-never-schedulable]" in done.stderr, done.stderr
    assert "offers 8" in done.stderr, done.stderr


def test_third_full_a100_pod_stays_pending_and_doctor_explains_it(cluster: Cluster, namespace: str) -> None:
    nodes = []
    for name in ("train-0", "train-1"):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod(name, gpus=8, labels=TRAINING)))
        nodes.append(wait_scheduled(cluster, namespace, name))
    assert sorted(nodes) == ["gpu-a100-0", "gpu-a100-1"]  # one full node each

    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod("train-2", gpus=8, labels=TRAINING)))

    def insufficient() -> str | None:
        for event in events_for(cluster, namespace, "Pod", "train-2"):
            if event["reason"] == "FailedScheduling" and "Insufficient nvidia.com/gpu" in event["message"]:
                return str(event["message"])
        return None

    message = wait_until(insufficient, 60, "the scheduler's FailedScheduling event for train-2")
    assert "0/5 nodes are available" in message, message
    pod = pod_json(cluster, namespace, "train-2")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")

    doctor = _cli(cluster, "doctor", "train-2", "-n", namespace, "-o", "json")
    assert doctor.returncode == 1, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["broken"] is True
    assert "Insufficient nvidia.com/gpu" in json.dumps(report)
    assert any(s["status"] == "fail" for s in report["steps"])
    human = _cli(cluster, "doctor", "train-2", "-n", namespace)
    assert "Insufficient nvidia.com/gpu" in human.stdout, human.stdout

    audit = _cli(cluster, "audit", "-n", namespace, "-o", "json")
    assert audit.returncode in (0, 1), audit.stderr
    result = json.loads(audit.stdout)
    assert result["inventory"]["synced"] is True
    judged = {o["name"] for o in result["objects"]}
    assert {"train-0", "train-1", "train-2"} <= judged

    for name in ("train-0", "train-1", "train-2"):
        cluster.kubectl("delete", "pod", name, "-n", namespace, "--grace-period=0", "--force", check=False)
