"""Scenario 8: what the webhook must not touch. kube-system and a namespace labelled with the opt-out label are left
alone (the namespaceSelector as shipped); Pod UPDATE, status and binding go through (the scheduler's binding must
never be blocked)."""

from __future__ import annotations

import json

import pytest
import yaml
from cluster import Cluster, gpu_pod, pod_json, wait_scheduled, wait_until, yaml_of
from kubernetes import client

pytestmark = pytest.mark.e2e


def _assert_untouched(pod: dict[str, object]) -> None:
    spec = pod["spec"]
    assert isinstance(spec, dict)
    assert "runtimeClassName" not in spec
    assert "nodeSelector" not in spec
    annotations = pod["metadata"].get("annotations") or {}  # type: ignore[attr-defined]
    assert not any(k.startswith("gpu-webhook.io/") for k in annotations)


def test_kube_system_is_untouched(cluster: Cluster, namespace: str) -> None:
    name = f"gpu-in-{namespace}"[:60]
    pod = gpu_pod(name)
    pod["spec"]["nodeName"] = "gpu-t4-0"  # placed directly: nothing to schedule in kube-system
    try:
        cluster.kubectl("apply", "-n", "kube-system", "-f", "-", input=yaml_of(pod))
        _assert_untouched(pod_json(cluster, "kube-system", name))
    finally:
        cluster.kubectl("delete", "pod", name, "-n", "kube-system", "--grace-period=0", "--force", check=False)


def test_opt_out_namespace_is_untouched(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "gpu-webhook.io/ignore=true")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod("optout")))
    _assert_untouched(pod_json(cluster, namespace, "optout"))


def test_update_status_and_binding_go_through(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(gpu_pod("running")))
    wait_scheduled(cluster, namespace, "running")
    # UPDATE of a GPU Pod: a label change.
    cluster.kubectl("label", "pod", "running", "-n", namespace, "team=ml")
    cluster.kubectl("annotate", "pod", "running", "-n", namespace, "note=updated")
    # The status subresource, as a kubelet writes it.
    patch = {"status": {"conditions": [{"type": "e2e.example/Checked", "status": "True"}]}}
    cluster.kubectl("patch", "pod", "running", "-n", namespace, "--subresource=status", "--type=strategic",
                    "-p", json.dumps(patch))
    conditions = pod_json(cluster, namespace, "running")["status"]["conditions"]
    assert any(c["type"] == "e2e.example/Checked" for c in conditions)

    # The binding subresource: a Pod no scheduler picks up, bound through the API as a scheduler does.
    unscheduled = gpu_pod("bind-me")
    unscheduled["spec"]["schedulerName"] = "e2e-nobody"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(unscheduled))
    shown = yaml.safe_load(cluster.kubectl("get", "pod", "bind-me", "-n", namespace, "-o", "yaml").stdout)
    assert shown["spec"]["nodeSelector"]["gpu-type"] == "t4"
    core = client.CoreV1Api(cluster.api())
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bind-me"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-t4-1"}}
    core.create_namespaced_binding(namespace, binding, _preload_content=False)
    wait_until(lambda: pod_json(cluster, namespace, "bind-me")["spec"].get("nodeName") == "gpu-t4-1", 10,
               "the binding to land")
