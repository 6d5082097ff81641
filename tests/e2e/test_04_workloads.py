"""Scenario 4: workloads. A Deployment with a bad GPU template is refused at apply (template pre-flight); a
Deployment whose Pods the webhook refuses shows `FailedCreate` with the message on its ReplicaSet."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cluster import GPU, Cluster, edited_rules, events_for, wait_until, yaml_of

pytestmark = pytest.mark.e2e


def _deployment(name: str, resources: dict[str, Any], replicas: int = 1,
                labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name, **(labels or {})}},
                              "spec": {"containers": [{"name": "infer", "image": "vllm/vllm-openai:v0.6.3",
                                                       "resources": resources}]}}},
    }


def test_bad_template_is_refused_at_apply(cluster: Cluster, namespace: str) -> None:
    bad = _deployment("bad-class", {"limits": {GPU: "1"}}, labels={"gpu-webhook.io/gpu-type": "h100"})
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(bad), check=False)
    assert done.returncode == 1
    assert 'admission webhook "validate.gpu-webhook.io" denied the request' in done.stderr, done.stderr
    assert "[gpu-class-unknown]" in done.stderr
    assert cluster.kubectl("get", "deployment", "bad-class", "-n", namespace, check=False).returncode == 1


def test_template_quantity_errors_are_answered_by_the_api_server(cluster: Cluster, namespace: str) -> None:
    # Only Pods go through the mutating webhook; a workload meets the API server's own validation (which checks
    # pod templates like Pods) before the validating webhook, so for these the API server's message is the answer.
    cases = {
        "mismatch": ({"limits": {GPU: "2"}, "requests": {GPU: "1"}},
                     'spec.template.spec.containers[0].resources.requests: Invalid value: "1": must be equal to '
                     "nvidia.com/gpu limit of 2"),
        "requests-only": ({"requests": {GPU: "1"}},
                          "spec.template.spec.containers[0].resources.limits: Required value: Limit must be set for "
                          "non overcommitable resources"),
        "fraction": ({"limits": {GPU: "0.5"}},
                     "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: \"500m\": "
                     "must be an integer"),
    }
    for name, (resources, message) in cases.items():
        done = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(_deployment(name, resources)),
                               check=False)
        assert done.returncode == 1
        assert done.stderr.startswith(f'The Deployment "{name}" is invalid: '), done.stderr
        assert message in done.stderr, done.stderr
        assert "gpu-webhook.io" not in done.stderr


def test_refused_pods_show_failed_create_on_the_replicaset(cluster: Cluster, namespace: str) -> None:
    deployment = _deployment("t4-infer", {"limits": {GPU: "1"}}, replicas=0,
                             labels={"gpu-webhook.io/gpu-type": "t4"})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(deployment))

    def only_a100(policy: dict[str, Any]) -> None:
        policy["spec"].setdefault("namespaces", {})[namespace] = {"allowed": {"gpu-type": ["a100"]}}

    with edited_rules(cluster, only_a100):
        # Scaling leaves the template alone, so a newer rule never blocks it; the Pods are judged as created.
        cluster.kubectl("scale", "deployment", "t4-infer", "-n", namespace, "--replicas=1")

        def replicaset() -> str | None:
            items = json.loads(cluster.kubectl("get", "rs", "-n", namespace, "-l", "app=t4-infer",
                                               "-o", "json").stdout)["items"]
            return items[0]["metadata"]["name"] if items else None

        rs = str(wait_until(replicaset, 30, "the Deployment's ReplicaSet"))

        def failed_create() -> str | None:
            for event in events_for(cluster, namespace, "ReplicaSet", rs):
                if event["reason"] == "FailedCreate":
                    return str(event["message"])
            return None

        message = str(wait_until(failed_create, 30, "a FailedCreate event on the ReplicaSet"))
        assert message.startswith("Error creating: admission webhook"), message
        assert "gpu-webhook.io\" denied the request" in message
        assert "[gpu-class-not-allowed]" in message
        described = cluster.kubectl("describe", "rs", rs, "-n", namespace).stdout
        assert "FailedCreate" in described and "[gpu-class-not-allowed]" in described
        pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        assert pods == []
