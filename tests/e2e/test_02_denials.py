"""Scenario 2: what a user sees when the webhook refuses a Pod, through kubectl and through the Python client, and
which message wins when the API server's own checks could answer too."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from cluster import GPU, Cluster, gpu_pod, yaml_of
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.e2e

DENIED = re.compile(r'admission webhook "(mutate|validate)\.gpu-webhook\.io" denied the request: ')


def _apply_fails(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> str:
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(pod), check=False)
    assert done.returncode == 1, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    absent = cluster.kubectl("get", "pod", pod["metadata"]["name"], "-n", namespace, check=False)
    assert absent.returncode == 1, "a refused Pod was created"
    return done.stderr


def test_requests_not_equal_to_limits_shows_the_webhook_message(cluster: Cluster, namespace: str) -> None:
    err = _apply_fails(cluster, namespace, gpu_pod("mismatch", requests={GPU: "1"}, limits={GPU: "2"}))
    # The mutating webhook is called first, and /mutate runs every check: its name is the one users see.
    assert err.startswith('Error from server (Forbidden): error when creating "STDIN": admission webhook '
                          '"mutate.gpu-webhook.io" denied the request: [gpu-requests-equal-limits] '), err
    assert "[gpu-requests-equal-limits]" in err
    assert 'resources.requests: Invalid value: "1": must be equal to nvidia.com/gpu limit of 2' in err
    assert "set requests equal to limits" in err  # the fix is part of what the user reads


def test_gpu_in_requests_only_shows_the_webhook_message(cluster: Cluster, namespace: str) -> None:
    err = _apply_fails(cluster, namespace, gpu_pod("requests-only", requests={GPU: "1"}))
    assert DENIED.search(err), err
    assert "[gpu-limits-required]" in err


def test_python_client_gets_403_with_the_message(cluster: Cluster, namespace: str) -> None:
    core = client.CoreV1Api(cluster.api())
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(namespace, gpu_pod("py-mismatch", requests={GPU: "1"}, limits={GPU: "2"}))
    assert caught.value.status == 403
    status = json.loads(caught.value.body)
    assert status["reason"] == "Forbidden"
    assert DENIED.search(status["message"]), status
    assert "[gpu-requests-equal-limits]" in status["message"]


def test_fraction_the_webhook_answers_before_the_api_servers_validation(cluster: Cluster, namespace: str) -> None:
    # Admission runs before the API server validates the object, so for a fraction the webhook's message wins,
    # and it says what the API server would have said (`must be an integer`) plus how to fix it.
    err = _apply_fails(cluster, namespace, gpu_pod("half", limits={GPU: "0.5"}))
    assert DENIED.search(err), err
    assert "[gpu-whole-number]" in err
    assert "must be an integer" in err


def test_unparseable_quantity_the_api_server_answers_alone(cluster: Cluster, namespace: str) -> None:
    # A quantity that is not a quantity fails when the API server decodes the request: no webhook is called,
    # and the user sees the API server's own message.
    err = _apply_fails(cluster, namespace, gpu_pod("junk", limits={GPU: "one"}))
    assert not DENIED.search(err), err
    assert "quantities must match the regular expression" in err, err
