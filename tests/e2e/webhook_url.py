"""The webhook run by URL: `gpu-webhook serve --cluster` as a host process on 127.0.0.1, registered with the
webhook configurations rendered from `manifests/` by kustomize, rewriting only `clientConfig` (a URL to 127.0.0.1)
and `caBundle`. Its rules sit in a directory laid out like a mounted ConfigMap, so tests can swap them.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import yaml
from controlplane import ControlPlane
from objects import gpu_pod
from procs import LOOPBACK, REPO, WEBHOOK_NAMESPACE, ClusterError, Json, free_port, spawn, wait_until


class UrlWebhook(ControlPlane):
    """Runs and registers the webhook by URL on a ControlPlane (the Cluster mixes it in)."""

    webhook_port: int
    webhook_metrics_port: int
    webhook_tls: Path
    webhook_rules: Path

    def start_webhook(self) -> None:
        """Run `gpu-webhook serve --cluster` on free ports (first call: certificate and rules directory too)."""
        if not self.webhook_port:
            self.webhook_port = free_port()
            self.webhook_metrics_port = free_port()
            self.webhook_tls = self.workdir / "webhook-tls"
            self.issue_webhook_cert()
            self.webhook_rules = self.workdir / "webhook-rules"
            write_rules(self.webhook_rules, {p.name: p.read_text() for p in sorted((REPO / "rules").glob("*.yaml"))})
        env = self.env()
        env.pop("GPU_WEBHOOK_RULES", None)
        self.procs["gpu-webhook"] = spawn("gpu-webhook", [
            sys.executable, "-m", "webhook", "serve", "--cluster",
            "--host", LOOPBACK, "--port", str(self.webhook_port),
            "--metrics-host", LOOPBACK, "--metrics-port", str(self.webhook_metrics_port),
            "--tls-dir", str(self.webhook_tls), "--rules", str(self.webhook_rules), "--rules-poll-seconds", "0.5",
            "--shutdown-delay-seconds", "0",  # stopped to show the failure policies: at once, as a crash would
        ], self.logdir, env=env, cwd=self.workdir)
        context = ssl.create_default_context(cafile=str(self.webhook_tls / "ca.crt"))
        self._wait_http("gpu-webhook", f"{self.webhook_url}/readyz", context, timeout=60)

    def stop_webhook(self) -> None:
        """Stop the webhook's process group (its configurations stay registered)."""
        proc = self.procs.get("gpu-webhook")
        if proc is not None:
            proc.stop()

    @property
    def webhook_url(self) -> str:
        """The webhook's HTTPS base URL."""
        return f"https://{LOOPBACK}:{self.webhook_port}"

    @property
    def webhook_metrics_url(self) -> str:
        """The webhook's plain-HTTP metrics URL."""
        return f"http://{LOOPBACK}:{self.webhook_metrics_port}/metrics"

    def issue_webhook_cert(self) -> None:
        """(Re)issue the webhook's serving certificate with `gpu-webhook certs` (IP SAN 127.0.0.1, same CA)."""
        subprocess.run([sys.executable, "-m", "webhook", "certs", "--service", "gpu-webhook",
                        "--namespace", WEBHOOK_NAMESPACE, "--ip", LOOPBACK, "--dns", "localhost",
                        "--out", str(self.webhook_tls)], check=True, capture_output=True, env=self.env())

    def rendered_webhook_configurations(self) -> list[Json]:
        """The Mutating/ValidatingWebhookConfigurations of `kubectl kustomize manifests/base`, rewritten for here."""
        rendered = self.kubectl("kustomize", str(REPO / "manifests" / "base")).stdout
        bundle = base64.b64encode((self.webhook_tls / "ca.crt").read_bytes()).decode()
        out = []
        for doc in yaml.safe_load_all(rendered):
            if not doc or doc.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                continue
            doc = copy.deepcopy(doc)
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"{self.webhook_url}{path}", "caBundle": bundle}
            out.append(doc)
        if len(out) != 2:
            raise ClusterError(f"expected 2 webhook configurations in manifests/base, got {len(out)}")
        return out

    def _register_webhooks(self) -> None:
        docs = self.rendered_webhook_configurations()
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        self.wait_webhook_active()

    def wait_webhook_active(self, timeout: float = 30) -> None:
        """Wait until a dry-run GPU Pod comes back mutated (the API server has loaded the configurations)."""
        self.ensure_namespace("e2e-probe")
        pod = gpu_pod("probe", gpus=1)

        def mutated() -> bool:
            done = self.kubectl("create", "--dry-run=server", "-o", "json", "-n", "e2e-probe", "-f", "-",
                                input=json.dumps(pod), check=False)
            return done.returncode == 0 and "runtimeClassName" in json.loads(done.stdout)["spec"]

        wait_until(mutated, timeout, "the API server to call the webhook", interval=0.5)

    def webhook_metrics(self) -> str:
        """The webhook's /metrics text."""
        with urllib.request.urlopen(self.webhook_metrics_url, timeout=10) as response:
            return str(response.read().decode())



def write_rules(directory: Path, files: Mapping[str, str]) -> None:
    """Write rule files the way the kubelet mounts a ConfigMap: `name -> ..data/name`, `..data` swapped at once."""
    directory.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix="..rules_", dir=directory))
    for name, text in files.items():
        (target / name).write_text(text)
    target.chmod(0o755)
    tmp_link = directory / "..data_tmp"
    if os.path.lexists(tmp_link):
        tmp_link.unlink()
    old = os.path.realpath(directory / "..data") if os.path.lexists(directory / "..data") else None
    os.symlink(target.name, tmp_link)
    os.replace(tmp_link, directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            if os.path.lexists(link):
                link.unlink()
            os.symlink(f"..data/{name}", link)
    for stale in directory.iterdir():
        if stale.is_symlink() and not stale.name.startswith("..") and stale.name not in files:
            stale.unlink()
    if old and Path(old) != target:
        shutil.rmtree(old, ignore_errors=True)



def webhook_readyz(cluster: UrlWebhook) -> Json:
    """The webhook's /readyz document (from whichever worker answers)."""
    context = ssl.create_default_context(cafile=str(cluster.webhook_tls / "ca.crt"))
    try:
        with urllib.request.urlopen(f"{cluster.webhook_url}/readyz", context=context, timeout=10) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


def wait_rules_digest(cluster: UrlWebhook, changed_from: str | None = None, equal_to: str | None = None,
                      timeout: float = 20) -> str:
    """Wait until every worker serves other rules than `changed_from` (or exactly `equal_to`); returns the digest."""

    def settled() -> str | None:
        digests = {webhook_readyz(cluster)["checks"]["rules"]["digest"] for _ in range(8)}
        if len(digests) != 1:
            return None
        (digest,) = digests
        if changed_from is not None and digest == changed_from:
            return None
        if equal_to is not None and digest != equal_to:
            return None
        return str(digest)

    return str(wait_until(settled, timeout, "the webhook's workers to load the rules", interval=0.3))


@contextlib.contextmanager
def edited_rules(cluster: UrlWebhook, edit: Callable[[Json], None]) -> Iterator[str]:
    """Swap in rules changed by `edit` (applied to the GPUPolicy document), the way a ConfigMap update lands;
    yields the new digest once every worker serves it, and puts the shipped rules back afterwards."""
    original = {p.name: p.read_text() for p in sorted((REPO / "rules").glob("*.yaml"))}
    before = webhook_readyz(cluster)["checks"]["rules"]["digest"]
    changed = {}
    for name, text in original.items():
        doc = yaml.safe_load(text)
        if doc.get("kind") == "GPUPolicy":
            edit(doc)
        changed[name] = yaml.safe_dump(doc, sort_keys=False)
    write_rules(cluster.webhook_rules, changed)
    try:
        yield wait_rules_digest(cluster, changed_from=before)
    finally:
        write_rules(cluster.webhook_rules, original)
        wait_rules_digest(cluster, equal_to=before)

