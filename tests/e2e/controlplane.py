"""The e2e control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

`ControlPlane.start_control_plane()` runs each in its own process group with its log in the work directory: etcd,
then kube-apiserver (its own CA, an admin client certificate, service-account keys, the default admission plugins
plus ExtendedResourceToleration, and `--enable-aggregator-routing=true` so that it resolves a Service-backed webhook
to the Service's endpoints itself: there is no kube-proxy), then the controller-manager and the scheduler. It writes
an admin kubeconfig and gives the clients on it (kubectl, the Python client, raw HTTPS).

The binaries come from `tests/e2e/build.sh` (a cache outside the repository keyed by the Kubernetes version).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pki import key_pem, new_ca, new_leaf
from procs import LOOPBACK, ClusterError, Json, Proc, free_port, insecure_tls, spawn, tail, wait_until, yaml_of

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
CONTROL_PLANE = ["kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]


def build_binaries() -> Path:
    """Run build.sh (seconds when warm) and return the bin directory it prints."""
    try:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ClusterError(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
    except subprocess.CalledProcessError as exc:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit {exc.returncode}:\n{tail(exc.stderr)}") from exc
    return Path(done.stdout.strip().splitlines()[-1])



@dataclass
class ControlPlane:
    """etcd, the API server, the controller-manager and the scheduler; see the module docstring."""

    bindir: Path
    workdir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    etcd_port: int = 0
    apiserver_port: int = 0
    kubeconfig: Path = Path()
    ca_pem: bytes = b""

    # ------------------------------------------------------------------ paths and clients

    @property
    def logdir(self) -> Path:
        """Where every process's log is kept."""
        return self.workdir / "logs"

    @property
    def pki(self) -> Path:
        """Certificates and keys of the control plane."""
        return self.workdir / "pki"

    @property
    def kubectl_path(self) -> Path:
        """The kubectl built from the same release as the server."""
        return self.bindir / "kubectl"

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://{LOOPBACK}:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        """etcd's client URL."""
        return f"http://{LOOPBACK}:{self.etcd_port}"

    def env(self) -> dict[str, str]:
        """This environment with KUBECONFIG pointing at the cluster and the built binaries first on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bindir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against the cluster; raises on a non-zero exit when `check`."""
        done = subprocess.run([str(self.kubectl_path), *args], input=input, capture_output=True, text=True,
                              env=self.env(), timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done

    def api(self) -> Any:
        """A kubernetes.client.ApiClient on the admin kubeconfig."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS client context with the admin certificate, trusting the cluster CA."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    def raw(self, method: str, path: str, body: Json | None = None,
            content_type: str = "application/json") -> tuple[int, Json]:
        """One request to the API server with the admin certificate; returns (status, parsed body)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method,
                                         headers={"Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self.ssl_context(), timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            payload = err.read()
            try:
                return err.code, json.loads(payload or b"{}")
            except ValueError:
                return err.code, {"raw": payload.decode(errors="replace")}

    def raw_text(self, path: str) -> tuple[int, str]:
        """GET a plain-text path of the API server (e.g. /metrics) with the admin certificate."""
        request = urllib.request.Request(self.server + path, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(request, context=self.ssl_context(), timeout=30) as response:
            return response.status, response.read().decode()

    def logs(self) -> str:
        """Every process's log tail, for a failure report."""
        parts = []
        for name, proc in self.procs.items():
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"===== {name} ({state}), {proc.log} =====\n{proc.log_tail()}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ lifecycle

    def start_control_plane(self) -> list[tuple[str, Callable[[], None]]]:
        """The steps that start the control plane, in order (the caller runs them and reports a failed one)."""
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.pki.mkdir(parents=True, exist_ok=True)
        return [("etcd", self._start_etcd), ("kube-apiserver", self._start_apiserver),
                ("kube-controller-manager", self._start_controller_manager),
                ("kube-scheduler", self._start_scheduler)]

    def stop_procs(self, names: Sequence[str]) -> None:
        """Stop the named processes in that order; safe to call twice."""
        for name in names:
            proc = self.procs.get(name)
            if proc is not None:
                proc.stop()

    def _check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if not proc.alive():
            raise ClusterError(f"{name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")

    def _wait_http(self, name: str, url: str, context: ssl.SSLContext | None, timeout: float = 60) -> None:
        def ready() -> bool:
            self._check_alive(name)
            try:
                with urllib.request.urlopen(url, context=context, timeout=5) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_until(ready, timeout, f"{name} at {url}", interval=0.25)

    def _start_etcd(self) -> None:
        self.etcd_port = free_port()
        peer = f"http://{LOOPBACK}:{free_port()}"
        self.procs["etcd"] = spawn("etcd", [
            str(self.bindir / "etcd"), "--name", "default", "--data-dir", str(self.workdir / "etcd-data"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}",
            "--unsafe-no-fsync", "--log-level", "warn", "--quota-backend-bytes", str(2 * 1024**3),
        ], self.logdir)
        self._wait_http("etcd", f"{self.etcd_url}/health", None, timeout=30)

    def _write_pki(self) -> None:
        ca, ca_key, ca_cert = new_ca("e2e-cluster-ca")
        self.ca_pem = ca.cert
        serving = new_leaf(ca_key, ca_cert, "kube-apiserver", server=True,
                           dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                "kubernetes.default.svc.cluster.local"],
                           # 10.222.0.1: the real node's bridge, where realnode.py relays Pods to this server.
                           ips=[LOOPBACK, "10.0.0.1", "10.222.0.1"])
        admin = new_leaf(ca_key, ca_cert, "system:admin", organization="system:masters")
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        files = {
            "ca.crt": ca.cert, "ca.key": ca.key, "apiserver.crt": serving.cert, "apiserver.key": serving.key,
            "admin.crt": admin.cert, "admin.key": admin.key, "sa.key": key_pem(sa_key),
            "sa.pub": sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo),
        }
        for name, content in files.items():
            (self.pki / name).write_bytes(content)
            (self.pki / name).chmod(0o600)

    def _write_kubeconfig(self) -> None:
        def b64(name: str) -> str:
            return base64.b64encode((self.pki / name).read_bytes()).decode()

        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {"server": self.server,
                                                      "certificate-authority-data": b64("ca.crt")}}],
            "users": [{"name": "admin", "user": {"client-certificate-data": b64("admin.crt"),
                                                 "client-key-data": b64("admin.key")}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin", "namespace": "default"}}],
        }
        self.kubeconfig = self.workdir / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def apiserver_args(self) -> list[str]:
        """The kube-apiserver command line (also used to restart it)."""
        pki = self.pki
        return [
            str(self.bindir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}", f"--secure-port={self.apiserver_port}",
            "--endpoint-reconciler-type=none",
            # No kube-proxy: the API server dials a Service-backed webhook at one of the Service's endpoints.
            "--enable-aggregator-routing=true",
            # The real node (realnode.py): reach its kubelet at its InternalIP (never a DNS lookup of its name),
            # as the admin client it trusts.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki / 'admin.crt'}", f"--kubelet-client-key={pki / 'admin.key'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-signing-key-file={pki / 'sa.key'}", f"--service-account-key-file={pki / 'sa.pub'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--enable-admission-plugins=ExtendedResourceToleration",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--storage-media-type=application/vnd.kubernetes.protobuf",
            # The e2e suite owns compaction (the watch-robustness scenario compacts on purpose).
            "--etcd-compaction-interval=0",
            "--profiling=false",
        ]

    def _start_apiserver(self) -> None:
        self._write_pki()
        self.apiserver_port = free_port()
        self._write_kubeconfig()
        self.procs["kube-apiserver"] = spawn("kube-apiserver", self.apiserver_args(), self.logdir)
        self._wait_http("kube-apiserver", f"{self.server}/readyz", self.ssl_context(), timeout=120)

    def restart_apiserver(self, between: Callable[[], None] | None = None) -> None:
        """Stop the API server, run `between` while it is down, and start it again on the same port."""
        self.procs["kube-apiserver"].stop()
        if between is not None:
            between()
        self.procs["kube-apiserver"] = spawn("kube-apiserver", self.apiserver_args(), self.logdir)
        self._wait_http("kube-apiserver", f"{self.server}/readyz", self.ssl_context(), timeout=120)

    def _start_controller_manager(self) -> None:
        pki = self.pki
        port = free_port()
        self.procs["kube-controller-manager"] = spawn("kube-controller-manager", [
            str(self.bindir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={LOOPBACK}", f"--secure-port={port}",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--service-cluster-ip-range=10.0.0.0/24", "--controllers=*", "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
        ], self.logdir)
        self._wait_http("kube-controller-manager", f"https://{LOOPBACK}:{port}/healthz", insecure_tls(), timeout=60)

    def _start_scheduler(self) -> None:
        port = free_port()
        config = self.workdir / "scheduler.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "leaderElection": {"leaderElect": False},
        }))
        self.procs["kube-scheduler"] = spawn("kube-scheduler", [
            str(self.bindir / "kube-scheduler"), f"--config={config}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            f"--bind-address={LOOPBACK}", f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
        ], self.logdir)
        self._wait_http("kube-scheduler", f"https://{LOOPBACK}:{port}/healthz", insecure_tls(), timeout=60)

    def ensure_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Create the namespace if needed and wait for its `default` ServiceAccount (Pods need it)."""
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
        exists = self.kubectl("get", "namespace", name, check=False).returncode == 0
        if not exists:
            self.kubectl("create", "-f", "-", input=yaml_of(namespace))
        wait_until(lambda: self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
                   60, f"ServiceAccount {name}/default")

    # ------------------------------------------------------------------ the webhook


def etcd_call(cluster: ControlPlane, path: str, body: Json) -> Json:
    """One call to etcd's JSON gateway (v3 API), e.g. `/v3/kv/range`."""
    request = urllib.request.Request(f"{cluster.etcd_url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def compact_etcd(cluster: ControlPlane) -> int:
    """Compact etcd (physically) at its current revision; returns that revision."""
    header = etcd_call(cluster, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]
    revision = int(header["revision"])
    etcd_call(cluster, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision

