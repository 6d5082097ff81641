"""Scenario 7: a rule edit (the mounted-directory swap) changes the next decision within seconds, without a restart;
a certificate rotation while the API server holds keep-alive connections to the webhook fails no admission."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import Any

import pytest
from cluster import LOOPBACK, Cluster, edited_rules, gpu_pod, wait_until
from cryptography import x509
from kubernetes import client

pytestmark = pytest.mark.e2e


def _selector_of_dry_run(core: Any, namespace: str, name: str) -> dict[str, str]:
    created = core.create_namespaced_pod(namespace, gpu_pod(name), dry_run="All")
    return dict(created.spec.node_selector or {})


def _served_serial(cluster: Cluster) -> int:
    context = ssl.create_default_context(cafile=str(cluster.webhook_tls / "ca.crt"))
    with socket.create_connection((LOOPBACK, cluster.webhook_port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=LOOPBACK) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_rule_edit_changes_the_next_decision_without_restart(cluster: Cluster, namespace: str) -> None:
    core = client.CoreV1Api(cluster.api())
    pid = cluster.procs["gpu-webhook"].popen.pid
    assert _selector_of_dry_run(core, namespace, "before")["gpu-type"] == "t4"

    def default_a100(policy: dict[str, Any]) -> None:
        # The training A100 nodes: a default pair some live node satisfies (with cluster awareness, a default no
        # Ready GPU node satisfies, such as inference on a100, is held back instead of injected).
        policy["spec"]["classes"]["axes"]["gpu-type"]["default"] = "a100"
        policy["spec"]["classes"]["axes"]["workload"]["default"] = "training"

    started = time.monotonic()
    with edited_rules(cluster, default_a100):
        seen = wait_until(lambda: _selector_of_dry_run(core, namespace, "after").get("gpu-type") == "a100", 10,
                          "the API server's next call to see the edited rules")
        assert seen
        assert time.monotonic() - started < 10
    assert _selector_of_dry_run(core, namespace, "restored")["gpu-type"] == "t4"
    assert cluster.procs["gpu-webhook"].popen.pid == pid and cluster.procs["gpu-webhook"].alive()


def test_certificate_rotation_under_load_fails_no_admission(cluster: Cluster, namespace: str) -> None:
    core = client.CoreV1Api(cluster.api())
    failures: list[str] = []
    done = threading.Event()
    count = [0]

    def admit_continuously() -> None:
        while not done.is_set():
            try:
                created = core.create_namespaced_pod(namespace, gpu_pod(f"rot-{count[0]}"), dry_run="All")
                if created.spec.runtime_class_name != "nvidia":
                    failures.append(f"rot-{count[0]}: not mutated")
            except Exception as exc:  # every failure is the finding
                failures.append(f"rot-{count[0]}: {exc}")
            count[0] += 1

    first = _served_serial(cluster)
    workers = [threading.Thread(target=admit_continuously, daemon=True) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        time.sleep(2)
        for _ in range(3):
            cluster.issue_webhook_cert()
            time.sleep(2)
    finally:
        done.set()
        for worker in workers:
            worker.join(30)
    assert count[0] > 20, f"only {count[0]} admissions made"
    assert failures == []
    assert _served_serial(cluster) != first
