"""What the chart asks of the cluster's Kubernetes version, against the real API server of the release under test.

The control plane's release is the one tests/e2e/build.sh builds: tests/e2e/controlplane's by default, another with
GPU_WEBHOOK_E2E_K8S=MINOR (tests/e2e/version_matrix.py runs the core scenarios so, one release after another).
`helm install --dry-run=server` asks the API server for its version (.Capabilities.KubeVersion), as a real install
does, and creates nothing (on 1.36 and later, where native mode is let through, `helm template --kube-version` with
the server's version stands in: the dry run would need the GPUClassMap CRD installed):
- native and hybrid mode need MutatingAdmissionPolicy v1 (Kubernetes 1.36): refused before, naming the version;
- the install notes warn about DRA claims before 1.34 (resource.k8s.io v1 GA), and only there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import HERE, REPO, WEBHOOK_NAMESPACE, Cluster
from test_12_helm import HelmCli, _helm_binary

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "gpu-webhook"


def _pinned_release() -> str:
    """The k8s.io/kubernetes version the selected control plane module pins (what build.sh built)."""
    minor = os.environ.get("GPU_WEBHOOK_E2E_K8S", "")
    go_mod = HERE / (f"controlplane-{minor}" if minor else "controlplane") / "go.mod"
    found = re.search(r"^\s*k8s\.io/kubernetes (v1\.\d+\.\d+)", go_mod.read_text(), re.M)
    assert found, f"{go_mod} pins no k8s.io/kubernetes version"
    return found.group(1)


def _server_version(cluster: Cluster) -> tuple[str, tuple[int, int]]:
    info = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    return info["gitVersion"], (int(info["major"]), int(re.sub(r"\D.*", "", info["minor"])))


def _url_mode(cluster: Cluster) -> list[str]:
    """The harness's webhook by URL with its CA (the cluster has no cert-manager CRDs and runs no server Pod)."""
    return ["--set", f"webhook.url={cluster.webhook_url}", "--set", "certificates.mode=provided",
            "--set-file", f"certificates.provided.caCert={cluster.webhook_tls / 'ca.crt'}"]


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> HelmCli:
    return HelmCli(_helm_binary(), cluster, tmp_path_factory.mktemp("helm-home"))


def test_the_api_server_is_the_selected_release(cluster: Cluster) -> None:
    assert _server_version(cluster)[0] == _pinned_release()


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_native_modes_are_refused_before_1_36(cluster: Cluster, helm: HelmCli, tmp_path: Path, mode: str) -> None:
    values = tmp_path / "native-values.yaml"
    values.write_text(subprocess.run(
        [sys.executable, "-m", "webhook", "policies", "render", "--rules", str(REPO / "rules"), "--mode", mode,
         "--format", "helm-values"], capture_output=True, text=True, cwd=REPO, timeout=120, check=True).stdout)
    done = helm("install", "gpu-webhook-native", str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--dry-run=server",
                "-f", str(values), *_url_mode(cluster), check=False)
    version, minor = _server_version(cluster)
    if minor < (1, 36):
        assert done.returncode != 0, f"mode={mode} was accepted on {version}"
        assert f"mode={mode} needs Kubernetes >= 1.36" in done.stderr, done.stderr
        assert f"the cluster is {version}" in done.stderr, done.stderr
    else:
        # A dry run of the install needs the GPUClassMap CRD in the cluster (helm installs crds/ only for real):
        # render for this server's version instead, which is what the gate reads.
        rendered = helm("template", "gpu-webhook-native", str(CHART), "--namespace", WEBHOOK_NAMESPACE,
                        "--kube-version", version, "-f", str(values), *_url_mode(cluster))
        assert "kind: MutatingAdmissionPolicy" in rendered.stdout


def test_install_notes_name_the_dra_limit_before_1_34(cluster: Cluster, helm: HelmCli) -> None:
    done = helm("install", "gpu-webhook-notes", str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--dry-run=server",
                *_url_mode(cluster))
    notes = done.stdout.split("NOTES:", 1)[-1]
    version, minor = _server_version(cluster)
    if minor < (1, 34):
        assert f"Kubernetes {version}: the webhook reads DRA ResourceClaimTemplates" in notes, notes
    else:
        assert "resource.k8s.io" not in notes, notes
