"""pods.shape_problems: the fields `check` reads from files by hand, each of the wrong JSON type, named."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.policy import pods

GPU = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}


def pod(metadata: Any = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"} if metadata is None else metadata,
            "spec": {"containers": [GPU], **spec}}


def deployment(template_metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"metadata": template_metadata, "spec": {"containers": [GPU]}}}}


CASES = [
    pytest.param(pod(), [], id="well-typed"),
    pytest.param(pod(["p"]), ["metadata must be a mapping"], id="metadata-list"),
    pytest.param(pod({"name": "p", "namespace": {"nvidia.com/gpu": 0}}),
                 ["metadata.namespace must be a string, got dict"], id="namespace-object"),
    pytest.param(pod({"name": 7}), ["metadata.name must be a string, got int"], id="name-number"),
    pytest.param(pod({"generateName": ["a-"]}), ["metadata.generateName must be a string, got list"],
                 id="generate-name-list"),
    pytest.param(pod({"name": "p", "labels": ["a"]}), ["metadata.labels must be a mapping, got list"],
                 id="labels-list"),
    pytest.param(pod({"name": "p", "labels": {"gpu-webhook.io/workload": ["inference"]}}),
                 ["metadata.labels[gpu-webhook.io/workload] must be a string (quote it), got list"],
                 id="label-value-list"),
    pytest.param(pod({"name": "p", "annotations": {"replicas": 2}}),
                 ["metadata.annotations[replicas] must be a string (quote it), got int"], id="annotation-unquoted"),
    pytest.param(deployment({"labels": {"gpu": True}}),
                 ["spec.template.metadata.labels[gpu] must be a string (quote it), got bool"],
                 id="template-label-bool"),
    pytest.param(pod(nodeSelector=["a"]), ["spec.nodeSelector must be a mapping, got list"], id="node-selector-list"),
]


@pytest.mark.parametrize(("obj", "problems"), CASES)
def test_shape_problems(obj: dict[str, Any], problems: list[str]) -> None:
    assert pods.shape_problems(obj) == problems


@pytest.mark.parametrize("value", [{"a": 1}, ["a"], 3, 2.5, True, None, ""], ids=repr)
def test_string_keeps_only_strings(value: Any) -> None:
    assert pods.string(value) == ""
    assert pods.string("gpu-team") == "gpu-team"
