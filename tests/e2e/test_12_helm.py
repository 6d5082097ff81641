"""Scenario 1 against the Helm chart: `helm install` (url mode: the harness's webhook and its CA) registers the
webhook configurations, then the seed's GPU Pod is mutated by the real API server's call and placed by the real
scheduler, as test_01 does against the configurations rendered from manifests/.

The harness registers configurations named `gpu-webhook` (from manifests/base); helm refuses to adopt objects it
does not own, so the module's fixture saves and deletes them, installs the chart as release `gpu-webhook`, and on
teardown uninstalls it and restores the harness's configurations exactly as they were.

helm comes from tests/e2e/build_helm.sh (built from helm.sh/helm/v4 via the Go module proxy, cached).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import (
    REPO,
    SEED_NODES,
    SEED_POD_INJECTED,
    WEBHOOK_NAMESPACE,
    Cluster,
    injected,
    pod_json,
    wait_scheduled,
    wait_until,
)
from cryptography import x509
from installed import strip_server_fields

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "gpu-webhook"
RELEASE = "gpu-webhook"
HOOK_KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
SEED_REVIEW = REPO / "tests" / "data" / "admission-reviews" / "pod-create-limits-only-defaulted.json"

Json = dict[str, Any]


def _helm_binary() -> Path:
    """tests/e2e/build_helm.sh's helm; skips without Go outside CI, fails on CI (CI=true)."""
    on_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    reason = ""
    if shutil.which("go") is None:
        reason = "no Go toolchain on PATH to build helm (tests/e2e/build_helm.sh)"
    else:
        done = subprocess.run(["bash", str(REPO / "tests/e2e/build_helm.sh")], capture_output=True, text=True,
                              timeout=3600, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip().splitlines()[-1]) / "helm"
        reason = f"tests/e2e/build_helm.sh failed ({done.returncode}):\n{done.stderr[-3000:]}"
    if on_ci:
        pytest.fail(f"{reason} (CI=true: not skipping)", pytrace=False)
    pytest.skip(reason)


class HelmCli:
    """helm against the e2e cluster, with its own cache/config directories."""

    def __init__(self, binary: Path, cluster: Cluster, home: Path) -> None:
        self.binary, self.cluster, self.home = binary, cluster, home

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = self.cluster.env()
        env |= {f"HELM_{part}_HOME": str(self.home / part.lower()) for part in ("CACHE", "CONFIG", "DATA")}
        done = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env, timeout=300,
                              check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done


def _configuration(cluster: Cluster, kind: str) -> Json | None:
    done = cluster.kubectl("get", kind, RELEASE, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


@pytest.fixture(scope="module")
def helm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> HelmCli:
    return HelmCli(_helm_binary(), cluster, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def harness_configurations(cluster: Cluster) -> dict[str, Json]:
    """The configurations the harness registered (from manifests/base), as the API server stored them."""
    saved = {}
    for kind in HOOK_KINDS:
        found = _configuration(cluster, kind)
        assert found is not None, f"the harness registered no {kind} {RELEASE}"
        saved[kind] = found
    return saved


@pytest.fixture(scope="module")
def chart_installed(cluster: Cluster, helm: HelmCli, harness_configurations: dict[str, Json]) -> Iterator[None]:
    """The chart installed in url mode in place of the harness's configurations; restored afterwards."""
    for kind in HOOK_KINDS:
        cluster.kubectl("delete", kind, RELEASE, "--wait=true")
    try:
        helm("install", RELEASE, str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--create-namespace",
             "--set", f"webhook.url={cluster.webhook_url}", "--set", "certificates.mode=provided",
             "--set-file", f"certificates.provided.caCert={cluster.webhook_tls / 'ca.crt'}", "--wait")
        cluster.wait_webhook_active()
        yield
    finally:
        helm("uninstall", RELEASE, "--namespace", WEBHOOK_NAMESPACE, "--wait", check=False)
        restore = [strip_server_fields(harness_configurations[kind]) for kind in HOOK_KINDS]
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(restore))
        cluster.wait_webhook_active()


def test_chart_configurations_are_the_manifests_with_a_url(
    cluster: Cluster, chart_installed: None, harness_configurations: dict[str, Json]
) -> None:
    """What the API server stored from the chart equals what it stored from manifests/base, field for field."""
    bundle = base64.b64encode((cluster.webhook_tls / "ca.crt").read_bytes()).decode()
    for kind in HOOK_KINDS:
        ours = _configuration(cluster, kind)
        assert ours is not None
        assert ours["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert ours["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
        (hook,) = ours["webhooks"]
        path = "/mutate" if kind.startswith("mutating") else "/validate"
        assert hook["clientConfig"] == {"url": f"{cluster.webhook_url}{path}", "caBundle": bundle}
        assert ours["webhooks"] == harness_configurations[kind]["webhooks"]


def _seed_pod() -> Json:
    """The seed's GPU Pod as a user writes it: the review's object without what the API server defaulted."""
    seed = json.loads(SEED_REVIEW.read_text())["request"]["object"]
    (container,) = seed["spec"]["containers"]
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": seed["metadata"]["name"]},
        "spec": {"restartPolicy": seed["spec"]["restartPolicy"], "containers": [{
            "name": container["name"], "image": container["image"], "command": container["command"],
            "resources": {"limits": container["resources"]["limits"]},
        }]},
    }


def test_seed_gpu_pod_is_mutated_and_scheduled(cluster: Cluster, chart_installed: None, namespace: str) -> None:
    pod = _seed_pod()
    name = pod["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    node = wait_scheduled(cluster, namespace, name)
    spec_of_node = SEED_NODES[node]
    assert spec_of_node and spec_of_node[0] == "t4", f"bound to {node}"

    shown = pod_json(cluster, namespace, name)
    assert injected(shown) == SEED_POD_INJECTED
    wait_until(lambda: pod_json(cluster, namespace, name)["status"].get("phase") == "Running", 30, f"{name} to run")


def test_chart_validating_webhook_refuses_a_gpu_in_requests_only(
    cluster: Cluster, chart_installed: None, namespace: str
) -> None:
    pod = _seed_pod()
    container = pod["spec"]["containers"][0]
    container["resources"] = {"requests": container["resources"]["limits"]}
    done = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod),
                           check=False)
    assert done.returncode != 0
    # The chart's configurations are the only ones registered: whichever of its two webhooks answers first refuses.
    assert re.search(r'admission webhook "(mutate|validate)\.gpu-webhook\.io" denied the request: '
                     r"\[gpu-limits-required\]", done.stderr), done.stderr


LOOKUP_RELEASE = "lookup"  # objects named lookup-gpu-webhook*: nothing of the harness's is touched
CA_SECRET, TLS_SECRET = f"{LOOKUP_RELEASE}-gpu-webhook-ca", f"{LOOKUP_RELEASE}-gpu-webhook-tls"
# A release that matches no namespace and fails open, so it cannot affect any other test.
HARMLESS = ["--set", "certificates.mode=generate", "--set", "webhook.mutating.failurePolicy=Ignore",
            "--set", "webhook.validating.failurePolicy=Ignore",
            "--set-string", "webhook.namespaceSelector.matchLabels.gpu-webhook\\.io/e2e-never=true"]


def _secrets(cluster: Cluster, namespace: str) -> dict[str, Json]:
    return {name: json.loads(cluster.kubectl("get", "secret", name, "-n", namespace, "-o", "json").stdout)
            for name in (CA_SECRET, TLS_SECRET)}


def _ca_bundles(cluster: Cluster) -> set[str]:
    return {json.loads(cluster.kubectl("get", kind, f"{LOOKUP_RELEASE}-gpu-webhook", "-o", "json").stdout)
            ["webhooks"][0]["clientConfig"]["caBundle"] for kind in HOOK_KINDS}


def test_generated_certificates_are_kept_until_due_for_renewal(
    cluster: Cluster, helm: HelmCli, namespace: str
) -> None:
    """`helm upgrade` reuses the chart-made CA and serving certificate (lookup); a serving certificate that is due
    is reissued by the same CA, so caBundle does not change."""
    chart = [LOOKUP_RELEASE, str(CHART), "--namespace", namespace, *HARMLESS]
    helm("install", *chart)
    try:
        first = _secrets(cluster, namespace)
        bundle = first[TLS_SECRET]["data"]["ca.crt"]
        assert first[CA_SECRET]["data"]["tls.crt"] == bundle
        assert _ca_bundles(cluster) == {bundle}

        helm("upgrade", *chart)
        again = _secrets(cluster, namespace)
        for name in (CA_SECRET, TLS_SECRET):
            assert again[name]["data"] == first[name]["data"], f"{name} was not reused by the upgrade"

        # 400 days' notice: the 365-day serving certificate is due, the 3650-day CA is not.
        helm("upgrade", *chart, "--set", "certificates.generate.renewBeforeDays=400")
        renewed = _secrets(cluster, namespace)
        assert renewed[CA_SECRET]["data"] == first[CA_SECRET]["data"], "the CA must stay"
        assert renewed[TLS_SECRET]["data"]["ca.crt"] == bundle
        assert renewed[TLS_SECRET]["data"]["tls.crt"] != first[TLS_SECRET]["data"]["tls.crt"]
        assert _ca_bundles(cluster) == {bundle}

        # 3651 days' notice: the CA is due too. Renewed with its key kept (caKeyRotationPolicy: Never), it is in
        # both caBundles at once and verifies the serving certificate the old CA signed.
        helm("upgrade", *chart, "--set", "certificates.generate.renewBeforeDays=3651")
        ca_renewed = _secrets(cluster, namespace)
        new_bundle = ca_renewed[CA_SECRET]["data"]["tls.crt"]
        assert new_bundle != bundle and ca_renewed[TLS_SECRET]["data"]["ca.crt"] == new_bundle
        assert ca_renewed[CA_SECRET]["data"]["tls.key"] == first[CA_SECRET]["data"]["tls.key"]
        assert _ca_bundles(cluster) == {new_bundle}
        old_leaf = x509.load_pem_x509_certificate(base64.b64decode(renewed[TLS_SECRET]["data"]["tls.crt"]))
        old_leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(base64.b64decode(new_bundle)))

        # caKeyRotationPolicy: Always makes a new key (the CA is still due).
        helm("upgrade", *chart, "--set", "certificates.generate.renewBeforeDays=3651",
             "--set", "certificates.generate.caKeyRotationPolicy=Always")
        rekeyed = _secrets(cluster, namespace)
        assert rekeyed[CA_SECRET]["data"]["tls.key"] != first[CA_SECRET]["data"]["tls.key"]
    finally:
        helm("uninstall", LOOKUP_RELEASE, "--namespace", namespace, "--wait", check=False)
