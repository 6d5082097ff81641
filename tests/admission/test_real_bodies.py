"""The AdmissionReview bodies a real kube-apiserver (v1.36.3) sent, captured by the e2e suite
(tests/e2e/captured, see its README), answered by the app without a cluster.

What `/mutate` first receives is admitted with the class's patch, and the patch applied gives what the real API
server then sent `/validate`, which `/validate` admits as it is: the two endpoints agree on real bodies too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from webhook.admission.app import create_app, server_of
from webhook.admission.settings import Settings

CAPTURED = Path(__file__).resolve().parents[1] / "e2e" / "captured"
FIRST = sorted(p.name for p in CAPTURED.glob("*.mutating-first.json"))
FINAL = sorted(p.name for p in CAPTURED.glob("*.validating-final.json"))
PLACED = {"cuda-gpu-test", "dry-one"}  # Pods created by name in the capture (a controller's Pod has none yet)


@pytest.fixture
def app() -> Iterator[Flask]:
    app = create_app(Settings(rules_poll_seconds=0), registry=CollectorRegistry())
    yield app
    server_of(app).store.stop()


def answer(client: FlaskClient, path: str, review: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, data=json.dumps(review), content_type="application/json")
    assert response.status_code == 200, response.data
    answered: dict[str, Any] = response.get_json()["response"]
    assert answered["uid"] == review["request"]["uid"]
    return answered


def load(name: str) -> dict[str, Any]:
    review: dict[str, Any] = json.loads((CAPTURED / name).read_text())
    return review


def test_bodies_were_captured() -> None:
    assert len(FIRST) >= 4 and len(FINAL) >= 5, "tests/e2e/captured holds the real bodies"


@pytest.mark.parametrize("name", FIRST)
def test_mutate_admits_what_the_api_server_first_sends(client: FlaskClient, name: str) -> None:
    review = load(name)
    answered = answer(client, "/mutate", review)
    assert answered["allowed"] is True, answered
    request = review["request"]
    if request["operation"] != "CREATE":
        assert "patch" not in answered
        return
    patched = jsonpatch.apply_patch(request["object"], json.loads(base64.b64decode(answered["patch"])))
    assert patched["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
    gpu = [t for t in patched["spec"]["tolerations"] if t.get("key") == "nvidia.com/gpu"]
    assert gpu == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], "no second toleration"
    name_of = request["object"]["metadata"].get("name")
    final = CAPTURED / name.replace(".mutating-first.json", ".validating-final.json")
    if name_of in PLACED and final.exists():
        sent = load(final.name)["request"]["object"]
        assert patched["spec"]["nodeSelector"] == sent["spec"]["nodeSelector"]
        assert patched["spec"]["runtimeClassName"] == sent["spec"]["runtimeClassName"]


@pytest.mark.parametrize("name", FINAL)
def test_validate_admits_the_final_object(client: FlaskClient, name: str) -> None:
    answered = answer(client, "/validate", load(name))
    assert answered["allowed"] is True, answered
    assert "patch" not in answered
