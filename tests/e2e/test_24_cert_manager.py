"""The chart in cert-manager mode (its default), on the real node, with a real cert-manager issuing and injecting.

cert-manager here is cert-manager-lite (tests/e2e/certmanager, built by tests/e2e/build_certmanager.sh): upstream's
controller and cainjector packages of github.com/cert-manager/cert-manager in one process, because upstream's own
mains (the cmd/ modules) are not on the Go module proxy. It runs the Issuer and Certificate controllers, the
self-signed and CA signers, the approver and the CA injector; its CRDs are the module's deploy/crds.

The chart's chain: self-signed Issuer -> CA Certificate -> CA Issuer -> serving Certificate (Secret gpu-webhook-tls),
and both webhook configurations carry cert-manager.io/inject-ca-from. The API server calls the webhook's Pods
through the Service with the caBundle that cainjector copied in, so a mutated GPU Pod proves the whole path. Then:
- a renewal of the serving certificate (as `cmctl renew` asks for it: the Certificate's Issuing condition): a new
  key and serial, the same CA, so the caBundle stays and no create fails while the Pods pick it up;
- a renewal of the CA followed by the serving certificate, under the create loop: the chart injects from the CA
  Certificate, so cainjector merges the new CA into every caBundle beside the old one (cert-manager's
  CAInjectorMerging, GA and on in 1.21: `pkg/controller/cainjector/injectables.go` appends the new certificates
  to the bundle and prunes expired ones) as soon as it is issued, before the serving certificate it signs; no
  create fails. An earlier version of this test waited for the caBundle to *equal* the new CA, which merging never
  produces, and so reported the injection as missing;
- the same renewal with cainjector stopped (cert-manager-lite run as `--components=controller`), the order the
  kubelet can produce: the Pods serve the renewed CA's leaf while the caBundles hold only the old CA. The chart's
  CA keeps its key at renewal (`certManager.caKeyRotationPolicy: Never`), so the old CA verifies the new leaf and
  no create fails; the restarted cainjector merges the new CA in.

Needs what test_21 needs (the real node: run it under flock /tmp/gpu-webhook-realnode.lock) and Go for the build.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import HERE, WEBHOOK_NAMESPACE, Cluster, CreateLoop, gpu_pod, injected, spawn, wait_until
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from installed import HOOK_KINDS, RELEASE, InstalledWebhook
from procs import Proc
from realnode import RealNode
from test_21_installed import _served_certificates

pytestmark = pytest.mark.e2e

BUILD = HERE / "build_certmanager.sh"


def _cert_manager_bin() -> Path:
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, f"{BUILD} failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


class CertManager:
    """cert-manager-lite against the cluster, run whole or as one of its parts (`controller`, `cainjector`), as
    upstream runs them in two Deployments that can stop independently."""

    def __init__(self, cluster: Cluster, binary: Path) -> None:
        self.cluster, self.binary = cluster, binary
        self.proc: Proc | None = None

    def run(self, components: str = "controller,cainjector") -> None:
        self.stop()
        self.proc = spawn("cert-manager-lite", [str(self.binary), f"--kubeconfig={self.cluster.kubeconfig}",
                                                f"--components={components}"], self.cluster.logdir)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@pytest.fixture(scope="module")
def cert_manager(cluster: Cluster) -> Iterator[CertManager]:
    """cert-manager's CRDs applied and cert-manager-lite running against the cluster."""
    bindir = _cert_manager_bin()
    crds = bindir.parent / "crds"
    cluster.kubectl("apply", "--server-side", "-f", str(crds))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds))
    manager = CertManager(cluster, bindir / "cert-manager-lite")
    manager.run()
    try:
        yield manager
    finally:
        manager.stop()


@pytest.fixture(scope="module")
def installed(cluster: Cluster, real_node: RealNode, cert_manager: CertManager,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstalledWebhook]:
    webhook = InstalledWebhook(cluster=cluster, node=real_node, home=tmp_path_factory.mktemp("installed-cm"))
    webhook.prepare()
    try:
        webhook.install({"certificates": {"mode": "cert-manager"}})
        cluster.wait_webhook_active(timeout=120)
        yield webhook
    finally:
        webhook.uninstall()
        cluster.wait_webhook_active(timeout=60)


def _secret(cluster: Cluster, name: str) -> dict[str, bytes]:
    doc = json.loads(cluster.kubectl("get", "secret", name, "-n", WEBHOOK_NAMESPACE, "-o", "json").stdout)
    return {key: base64.b64decode(value) for key, value in doc["data"].items()}


def _ca_bundles(cluster: Cluster) -> set[bytes]:
    bundles = set()
    for kind in HOOK_KINDS:
        doc = json.loads(cluster.kubectl("get", kind, RELEASE, "-o", "json").stdout)
        bundles |= {base64.b64decode(hook["clientConfig"].get("caBundle", "")) for hook in doc["webhooks"]}
    return bundles


def _bundle_certificates(cluster: Cluster) -> list[set[bytes]]:
    """Each webhook's caBundle as the set of certificates (DER) its PEM blocks hold."""
    out = []
    for bundle in _ca_bundles(cluster):
        out.append({cert.public_bytes(serialization.Encoding.DER)
                    for cert in x509.load_pem_x509_certificates(bundle)} if bundle else set())
    return out


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)


def _renew(cluster: Cluster, certificate: str) -> None:
    """Ask cert-manager to issue the Certificate again now, as `cmctl renew` does (its Issuing condition)."""
    condition = {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                 "message": "Certificate re-issuance manually triggered",
                 "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    cluster.kubectl("patch", "certificate", certificate, "-n", WEBHOOK_NAMESPACE, "--subresource=status",
                    "--type=json", "-p", json.dumps([{"op": "add", "path": "/status/conditions/-",
                                                      "value": condition}]))


def _mutated_pod(cluster: Cluster, namespace: str, name: str) -> None:
    pod = json.loads(cluster.kubectl("create", "-o", "json", "-n", namespace, "-f", "-",
                                     input=json.dumps(gpu_pod(name, gpus=1))).stdout)
    assert injected(pod)["runtimeClassName"], f"Pod {name} was admitted without the GPU class: {pod['spec']}"


def test_cainjector_copies_the_chart_ca_and_a_pod_goes_through_it(cluster: Cluster, installed: InstalledWebhook,
                                                                  namespace: str) -> None:
    serving = _secret(cluster, f"{RELEASE}-tls")
    ca = _secret(cluster, f"{RELEASE}-ca")["tls.crt"]
    assert serving["ca.crt"] == ca, "the serving Secret's ca.crt is not the chart's CA"
    assert _ca_bundles(cluster) == {ca}, "a webhook's caBundle is not the CA cert-manager issued"
    _mutated_pod(cluster, namespace, "through-injected-ca")


def test_serving_certificate_renewal_keeps_the_ca_bundle(cluster: Cluster, installed: InstalledWebhook,
                                                          namespace: str) -> None:
    before = _secret(cluster, f"{RELEASE}-tls")
    bundles = _ca_bundles(cluster)
    with CreateLoop(cluster, namespace) as loop:
        time.sleep(2)
        _renew(cluster, f"{RELEASE}-serving")
        wait_until(lambda: _secret(cluster, f"{RELEASE}-tls")["tls.crt"] != before["tls.crt"], 120,
                   "cert-manager to issue the serving certificate again")
        renewed = _secret(cluster, f"{RELEASE}-tls")
        started = time.monotonic()
        wait_until(lambda: _served_certificates(installed) == {_der(renewed["tls.crt"])}, 180,
                   "every webhook Pod to serve the renewed certificate", interval=1)
        took = time.monotonic() - started
        time.sleep(3)
    assert renewed["tls.key"] != before["tls.key"], "rotationPolicy Always: the renewal kept the old key"
    assert _ca_bundles(cluster) == bundles
    counts = loop.counts()
    print(f"serving certificate renewed by cert-manager: served by every Pod after {took:.0f} s; {counts}")
    assert counts["refused"] == 0 and counts["unmutated"] == 0



def test_ca_renewal_is_merged_into_every_ca_bundle_with_no_failed_create(cluster: Cluster, installed: InstalledWebhook,
                                                                        namespace: str) -> None:
    """cert-manager renews the CA, then the serving certificate, under the create loop. The chart injects from the
    CA Certificate, so every caBundle holds the new CA beside the old one (merged, not replaced) before a serving
    certificate of the new CA exists; then the Pods serve the new leaf, and no create is refused or unmutated."""
    old_ca = _secret(cluster, f"{RELEASE}-ca")["tls.crt"]
    with CreateLoop(cluster, namespace) as loop:
        time.sleep(2)
        _renew(cluster, f"{RELEASE}-ca")
        wait_until(lambda: _secret(cluster, f"{RELEASE}-ca")["tls.crt"] != old_ca, 120,
                   "cert-manager to issue the CA again")
        new_ca = _secret(cluster, f"{RELEASE}-ca")["tls.crt"]
        issued = time.monotonic()
        wait_until(lambda: all(_der(new_ca) in certs for certs in _bundle_certificates(cluster)), 120,
                   "cainjector to merge the new CA into every caBundle")
        took = time.monotonic() - issued
        assert _secret(cluster, f"{RELEASE}-tls")["ca.crt"] == old_ca, "the serving certificate was re-issued early"
        bundles = _bundle_certificates(cluster)
        assert all(certs == {_der(old_ca), _der(new_ca)} for certs in bundles), \
            "each caBundle should hold the old CA (until it expires) and the new one"
        _renew(cluster, f"{RELEASE}-serving")
        wait_until(lambda: _secret(cluster, f"{RELEASE}-tls")["ca.crt"] == new_ca, 120,
                   "the serving certificate to be issued by the new CA")
        renewed = _secret(cluster, f"{RELEASE}-tls")["tls.crt"]
        wait_until(lambda: _served_certificates(installed) == {_der(renewed)}, 180,
                   "every webhook Pod to serve the certificate of the new CA", interval=1)
        time.sleep(3)
    counts = loop.counts()
    refusals = [what for status, what in loop.results if status != 201]
    print(f"CA renewed by cert-manager: the new CA merged into every caBundle ({len(bundles)} distinct) "
          f"{took:.0f} s after it was issued, before the serving certificate; {counts}; {loop.summary()}")
    assert counts["refused"] == 0, refusals[:5]
    assert counts["unmutated"] == 0
    _mutated_pod(cluster, namespace, "through-the-new-ca")


def test_ca_renewal_with_cainjector_stopped_fails_no_create(cluster: Cluster, installed: InstalledWebhook,
                                                            cert_manager: CertManager, namespace: str) -> None:
    """The order the kubelet can produce: the Pods serve a leaf of the renewed CA before any caBundle holds it
    (cainjector stopped for the renewal, restarted after). The chart's CA keeps its key at a renewal
    (`certManager.caKeyRotationPolicy: Never`), so the old CA certificate in the bundles already verifies the new
    leaf: no create is refused or unmutated; the restarted cainjector then merges the new CA in."""
    old_ca = _secret(cluster, f"{RELEASE}-ca")["tls.crt"]
    bundles_before = _bundle_certificates(cluster)
    assert all(_der(old_ca) in certs for certs in bundles_before)
    cert_manager.run("controller")
    try:
        with CreateLoop(cluster, namespace) as loop:
            time.sleep(2)
            _renew(cluster, f"{RELEASE}-ca")
            wait_until(lambda: _secret(cluster, f"{RELEASE}-ca")["tls.crt"] != old_ca, 120,
                       "cert-manager to issue the CA again")
            new_ca = _secret(cluster, f"{RELEASE}-ca")
            _renew(cluster, f"{RELEASE}-serving")
            wait_until(lambda: _secret(cluster, f"{RELEASE}-tls")["ca.crt"] == new_ca["tls.crt"], 120,
                       "the serving certificate to be issued by the renewed CA")
            renewed = _secret(cluster, f"{RELEASE}-tls")["tls.crt"]
            wait_until(lambda: _served_certificates(installed) == {_der(renewed)}, 180,
                       "every webhook Pod to serve the leaf of the renewed CA", interval=1)
            time.sleep(3)
            bundles_meanwhile = _bundle_certificates(cluster)
        counts = loop.counts()
    finally:
        cert_manager.run()
    ca_key = serialization.load_pem_private_key(new_ca["tls.key"], None).public_key()
    old_key = x509.load_pem_x509_certificate(old_ca).public_key()
    assert ca_key == old_key, "the renewed CA has a new key: caKeyRotationPolicy is not Never"
    assert bundles_meanwhile == bundles_before, "cainjector was stopped, yet a caBundle changed"
    assert all(_der(new_ca["tls.crt"]) not in certs for certs in bundles_meanwhile)
    refusals = [what for status, what in loop.results if status != 201]
    print(f"CA and serving certificate renewed with cainjector stopped: the Pods served the renewed CA's leaf "
          f"with only the old CA in the caBundles; {counts}; {loop.summary()}")
    assert counts["refused"] == 0, refusals[:5]
    assert counts["unmutated"] == 0
    wait_until(lambda: all(_der(new_ca["tls.crt"]) in certs for certs in _bundle_certificates(cluster)), 120,
               "the restarted cainjector to merge the renewed CA into every caBundle")
    _mutated_pod(cluster, namespace, "after-the-late-injection")

