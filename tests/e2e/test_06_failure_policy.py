"""Scenario 6: the shipped failure policies under a real API server. With the webhook process stopped the mutating
webhook fails open (Ignore) and the validating one fails closed (Fail); with it back, admission is normal again."""

from __future__ import annotations

import pytest
import yaml
from cluster import Cluster, gpu_pod, wait_until, yaml_of

pytestmark = pytest.mark.e2e


def test_webhook_down_then_back(cluster: Cluster, namespace: str) -> None:
    log = cluster.procs["kube-apiserver"].log
    log_offset = log.stat().st_size
    cluster.stop_webhook()
    try:
        done = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod("while-down")),
                               check=False)
        assert done.returncode == 1, done.stdout
        assert 'failed calling webhook "validate.gpu-webhook.io"' in done.stderr, done.stderr
        assert 'admission webhook "mutate.gpu-webhook.io"' not in done.stderr  # the mutation failed open
        absent = cluster.kubectl("get", "pod", "while-down", "-n", namespace, check=False)
        assert absent.returncode == 1

        def failed_open() -> bool:
            with log.open(errors="replace") as handle:
                handle.seek(log_offset)
                return "Failed calling webhook, failing open mutate.gpu-webhook.io" in handle.read()

        wait_until(failed_open, 10, "the API server to log that the mutating webhook failed open")

        # Namespaces outside the webhooks' namespaceSelector are not gated at all.
        cluster.ensure_namespace(f"{namespace}-optout", labels={"gpu-webhook.io/ignore": "true"})
        cluster.kubectl("apply", "-n", f"{namespace}-optout", "-f", "-", input=yaml_of(gpu_pod("optout")))
    finally:
        cluster.start_webhook()
    cluster.wait_webhook_active()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod("after")))
    shown = yaml.safe_load(cluster.kubectl("get", "pod", "after", "-n", namespace, "-o", "yaml").stdout)
    assert shown["spec"]["runtimeClassName"] == "nvidia"
    assert shown["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    cluster.kubectl("delete", "namespace", f"{namespace}-optout", "--wait=false")
