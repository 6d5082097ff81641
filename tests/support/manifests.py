"""Rendered Kubernetes objects (kustomize or helm output) checked the same way in tests/deploy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CRD_GROUPS = {"cert-manager.io", "monitoring.coreos.com"}  # kubernetes-validate has no schemas for these


def group_of(doc: Mapping[str, Any]) -> str:
    api_version: str = doc["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""


def strict_errors(kv: Any, docs: Iterable[Mapping[str, Any]], k8s_version: str) -> list[str]:
    """kubernetes-validate (`kv`, strict) on every object outside the CRD groups: one line per error."""
    errors = []
    for doc in docs:
        if group_of(doc) in CRD_GROUPS:
            continue
        try:
            kv.validate(dict(doc), k8s_version, strict=True)
        except kv.ValidationError as exc:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
        except kv.SchemaNotFoundError as exc:
            errors.append(exc.message)
    return errors
