"""Scenario 3: `kubectl apply --dry-run=server -o yaml` shows what the webhook injects and creates nothing."""

from __future__ import annotations

import pytest
import yaml
from cluster import Cluster, gpu_pod, yaml_of

pytestmark = pytest.mark.e2e


def test_server_dry_run_shows_the_injection_and_creates_nothing(cluster: Cluster, namespace: str) -> None:
    done = cluster.kubectl("apply", "--dry-run=server", "-o", "yaml", "-n", namespace, "-f", "-",
                           input=yaml_of(gpu_pod("dry", gpus=2)))
    shown = yaml.safe_load(done.stdout)
    assert shown["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    assert shown["spec"]["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in shown["spec"]["tolerations"]
    assert "nodeName" not in shown["spec"]

    missing = cluster.kubectl("get", "pod", "dry", "-n", namespace, check=False)
    assert missing.returncode == 1 and "NotFound" in missing.stderr
