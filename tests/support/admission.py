"""Helpers for the admission-server tests: fixtures on disk, the kubelet's volume layout, real servers.

Nothing here fakes our own code: servers are real `gpu-webhook serve` processes (gunicorn over TLS) and
certificates are real ones from `webhook.admission.certs`.
"""

from __future__ import annotations

import copy
import datetime as dt
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.admission import certs
from webhook.policy import inventory

DATA = Path(__file__).parents[1] / "data"
REVIEWS = DATA / "admission-reviews"
CAPTURED = Path(__file__).parents[1] / "e2e" / "captured"  # reviews the e2e control plane really sent
KUBE = DATA / "kube"
RULES = DATA / "rules"
REPO = Path(__file__).parents[2]
NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
LOCAL_NAMES = (*certs.service_dns_names("gpu-webhook", "gpu-system"), "localhost")
LOCAL_IPS = ("127.0.0.1",)


def review(name: str, **request_changes: Any) -> dict[str, Any]:
    """A fixture AdmissionReview (a fresh copy), with `request` fields replaced."""
    document: dict[str, Any] = json.loads((REVIEWS / f"{name}.json").read_text())
    document["request"].update(copy.deepcopy(request_changes))
    return document


# The realistic GPU Pod CREATE (from a ReplicaSet, defaulted) most server tests send; send it through with_uid.
GPU_REVIEW = review("pod-create-from-replicaset-gpu")


def body(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document).encode()


def with_uid(document: Mapping[str, Any], uid: str | None = None) -> dict[str, Any]:
    fresh = copy.deepcopy(dict(document))
    fresh["request"]["uid"] = uid or str(uuid.uuid4())
    return fresh


def kube_items(name: str) -> list[dict[str, Any]]:
    """The items of a recorded List in tests/data/kube."""
    items: list[dict[str, Any]] = json.loads((KUBE / name).read_text())["items"]
    return items


class RecordedCluster:
    """The server's `Inventory` over the recorded cluster of tests/data/kube, always synced: the shape the live
    caches (`webhook.cluster.kube.ClusterInventory`) hand the server, built by the same parsers from API JSON."""

    def __init__(self) -> None:
        self._snapshot = inventory.snapshot_from_api(
            kube_items("nodes.json"), kube_items("runtimeclasses.json"), kube_items("namespaces.json"),
            kube_items("resourceclaimtemplates-v1.json"))

    @property
    def synced(self) -> bool:
        return True

    def snapshot(self) -> inventory.Snapshot:
        return self._snapshot


# --- the kubelet's AtomicWriter layout ---------------------------------------------------------


def kubelet_write(directory: Path, files: Mapping[str, bytes]) -> Path:
    """Project `files` into `directory` as the kubelet does for a Secret/ConfigMap volume update.

    A new `..<timestamp>` directory, a `..data_tmp` symlink renamed over `..data` (atomic), the visible
    `name -> ..data/name` links created once, then the previous timestamped directory removed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    stamp = f"..{dt.datetime.now(dt.UTC):%Y_%m_%d_%H_%M_%S.%f}_{uuid.uuid4().hex[:6]}"
    target = directory / stamp
    target.mkdir()
    for name, content in files.items():
        (target / name).write_bytes(content)
    data = directory / "..data"
    old = os.readlink(data) if os.path.islink(data) else None
    tmp = directory / "..data_tmp"
    os.symlink(stamp, tmp)
    os.replace(tmp, data)
    for name in files:
        link = directory / name
        if not os.path.lexists(link):
            os.symlink(f"..data/{name}", link)
    if old:
        shutil.rmtree(directory / old)
    return target


def rules_files(variant: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((RULES / variant).iterdir())}


# --- certificates --------------------------------------------------------------------------------


@dataclass
class Pki:
    """A CA and serving certificates for 127.0.0.1/localhost."""

    key_type: certs.KeyType = "ecdsa"
    ca: certs.Issued = field(init=False)

    def __post_init__(self) -> None:
        self.ca = certs.new_ca("test-ca", real_now(), key=certs.new_key(self.key_type))

    def leaf(self) -> certs.Issued:
        return certs.new_serving_cert(self.ca, LOCAL_NAMES, real_now(), key=certs.new_key(self.key_type),
                                      ip_addresses=LOCAL_IPS)

    def secret(self, leaf: certs.Issued | None = None) -> dict[str, bytes]:
        """The files of a cert-manager Secret for a (new) serving certificate."""
        leaf = leaf or self.leaf()
        return {"tls.crt": leaf.cert_pem(), "tls.key": leaf.key_pem(), "ca.crt": self.ca.cert_pem()}


def real_now() -> dt.datetime:  # real time, for certificates a real TLS client checks
    return dt.datetime.now(dt.UTC)


def client_context(*cas: certs.Issued, client: certs.Issued | None = None, tmp: Path | None = None
                   ) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata="".join(ca.cert_pem().decode() for ca in cas))
    if client is not None:
        assert tmp is not None
        pem = tmp / f"client-{uuid.uuid4().hex}.pem"
        pem.write_bytes(client.cert_pem() + client.key_pem())
        context.load_cert_chain(str(pem))
    return context


def peer_serial(sock: ssl.SSLSocket) -> int:
    der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


# --- real server processes -----------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running `gpu-webhook serve` (gunicorn master) on loopback."""

    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log_path: Path
    copier: threading.Thread | None = None  # with pipe=True: copies the server's stdout pipe to log_path

    def log(self) -> str:
        if self.copier is not None and self.proc.poll() is not None:
            self.copier.join(10)  # everything the server wrote before it exited
        return self.log_path.read_text(errors="replace")

    def connection(self, context: ssl.SSLContext, timeout: float = 10) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=timeout)

    def metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=10)
        try:
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        finally:
            conn.close()

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """The sum of the samples of `name` whose labels include `labels` (0 when absent)."""
        total = 0.0
        for line in self.metrics().splitlines():
            match = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$", line)
            if not match or match.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            if all(have.get(k) == v for k, v in (labels or {}).items()):
                total += float(match.group(3))
        return total

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)


def start_server(tmp: Path, *args: str, trust: ssl.SSLContext | None = None, cwd: Path | None = None,
                 workers: int = 2, threads: int = 4, startup_timeout: float = 30, pipe: bool = False,
                 shutdown_delay: float = 0) -> Server:
    """Start `serve` on free loopback ports and wait until /healthz answers (over TLS when `trust` given).

    `shutdown_delay` is 0 (gunicorn's plain SIGTERM) unless a test is about the delay: the default 5 s would
    only slow every stop.

    Its stdout and stderr go to a log file; with `pipe`, through a pipe first, as in a container.
    """
    port, metrics_port = free_port(), free_port()
    log_path = tmp / f"server-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_WEBHOOK_", "PROMETHEUS_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "webhook.cli.server", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
               "--workers", str(workers), "--threads", str(threads), "--shutdown-delay-seconds", str(shutdown_delay),
               *args]
    copier = None
    if pipe:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd or tmp, env=env)
        copier = threading.Thread(target=_copy_out, args=(proc, log_path), daemon=True)
        copier.start()
    else:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd or tmp, env=env)
    server = Server(proc, port, metrics_port, log_path, copier)
    context = trust or ssl._create_unverified_context()
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            conn = server.connection(context, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                conn.close()
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server did not start within {startup_timeout}s:\n{server.log()}")


def _copy_out(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    assert proc.stdout is not None
    with open(log_path, "wb") as log:
        while chunk := proc.stdout.read1(65536):
            log.write(chunk)
            log.flush()


def post(conn: http.client.HTTPConnection, path: str, document: Mapping[str, Any] | bytes
         ) -> tuple[int, dict[str, Any]]:
    payload = document if isinstance(document, bytes) else body(document)
    conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def client_cert(ca: certs.Issued) -> certs.Issued:
    """A TLS client certificate (clientAuth), as a cluster admin gives kube-apiserver for webhooks."""
    key = certs.new_key()
    now = ca.cert.not_valid_before_utc
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return certs.Issued(cert, key)
