"""Scenario 10: every kustomization in manifests/ is accepted by the real API server
(`kubectl apply --server-side --dry-run=server`): RBAC, the webhook configurations with their CEL matchConditions,
the PodDisruptionBudget, the Deployment.

The overlays are built from a copy of manifests/ and rules/ (the self-managed overlay needs tls/ files, which are
never committed). cert-manager's and the Prometheus Operator's kinds need their CRDs: minimal stand-ins with an open
schema are installed, so the API server checks everything but those two products' own field schemas.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from cluster import REPO, Cluster, wait_until

pytestmark = pytest.mark.e2e

STAND_IN_CRDS = [
    ("cert-manager.io", "Certificate", "certificates"),
    ("cert-manager.io", "Issuer", "issuers"),
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
]


def _crd(group: str, kind: str, plural: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    }


@pytest.fixture(scope="module")
def tree(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of manifests/ and rules/ with tls/ files for the self-managed overlay and an all-components overlay."""
    root = tmp_path_factory.mktemp("manifests")
    shutil.copytree(REPO / "manifests", root / "manifests")
    shutil.copytree(REPO / "rules", root / "rules", ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    tls = root / "manifests" / "overlays" / "self-managed" / "tls"
    tls.mkdir(exist_ok=True)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        shutil.copyfile(cluster.webhook_tls / name, tls / name)
    everything = root / "manifests" / "overlays" / "e2e-all-components"
    everything.mkdir()
    (everything / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../self-managed"],
        "components": ["../../components/servicemonitor", "../../components/runtimeclass-nvidia",
                       "../../components/cluster-awareness", "../../components/prometheus-rule",
                       "../../components/grafana-dashboard"],
    }))
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([_crd(*c) for c in STAND_IN_CRDS]))
    for _, _, plural in STAND_IN_CRDS:
        wait_until(lambda p=plural: cluster.kubectl("get", p, "-A", check=False).returncode == 0, 30,
                   f"CRD {plural} to be served")
    return root / "manifests"


def _kustomizations() -> list[str]:
    root = REPO / "manifests"
    found = sorted(str(p.parent.relative_to(root)) for p in root.rglob("kustomization.yaml")
                   if yaml.safe_load(p.read_text()).get("kind", "Kustomization") == "Kustomization")
    return [*found, "overlays/e2e-all-components"]


@pytest.mark.parametrize("path", _kustomizations())
def test_kustomization_is_accepted_by_the_api_server(cluster: Cluster, tree: Path, path: str) -> None:
    objects = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(tree / path)).stdout) if d]
    assert objects
    # The harness registered these webhook configurations with a URL; a server-side apply of the shipped ones
    # (with a service) would merge into those and hold both. Under another name they are checked as shipped.
    for obj in objects:
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            obj["metadata"]["name"] += "-dry-run"
    # The product's own CRDs (native mode's GPUClassMap) are applied first, for real: their objects can only be
    # checked once the CRD is served, as the docs say (apply twice on a fresh cluster).
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    if crds:
        cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
        for crd in crds:
            plural = f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"
            wait_until(lambda p=plural: cluster.kubectl("get", p, "-A", check=False).returncode == 0, 30,
                       f"CRD {plural} to be served")
    done = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-",
                           input=yaml.safe_dump_all(objects), check=False)
    assert done.returncode == 0, done.stderr
    applied = [line for line in done.stdout.splitlines() if line.endswith("serverside-applied (server dry run)")]
    assert len(applied) == len(objects), done.stdout
    for obj in objects:
        name = obj["metadata"]["name"]
        assert any(f"/{name} " in line for line in applied), f"{obj['kind']} {name} missing from:\n{done.stdout}"
