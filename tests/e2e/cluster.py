"""A real Kubernetes control plane on 127.0.0.1 for the e2e suite, and the real gpu-webhook registered with it.

`Cluster.start()` runs, each in its own process group with its log in the work directory:
etcd, kube-apiserver (its own CA, an admin client certificate, service-account keys, the default admission plugins
plus ExtendedResourceToleration), kube-controller-manager, kube-scheduler and kwok (which keeps the fake nodes
Ready by renewing their Leases, and moves bound Pods to Running). It writes a kubeconfig, creates the seed's
nodes (2 x A100, 2 x T4, 1 CPU-only), the RuntimeClass `nvidia` and the device-plugin DaemonSet, then runs
`gpu-webhook serve --cluster` on a free port and registers it with the webhook configurations rendered from
`manifests/` by kustomize, rewriting only `clientConfig` (a URL to 127.0.0.1) and `caBundle`.

`Cluster.stop()` ends every process group it started (SIGTERM, then SIGKILL); it is also registered with `atexit`,
so no process outlives the test session even when it fails.

The binaries come from `tests/e2e/build.sh` (a cache outside the repository keyed by the Kubernetes version).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import copy
import ctypes
import datetime as dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD_SCRIPT = HERE / "build.sh"
LOOPBACK = "127.0.0.1"
GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
WEBHOOK_NAMESPACE = "gpu-system"

Json = dict[str, Any]


class ClusterError(RuntimeError):
    """The control plane could not be built or started; str() says which part and ends with its log tail."""


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `predicate` until it returns a truthy value (returned); raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # polled: an error now may be success later
            last_error = exc
        if time.monotonic() > deadline:
            suffix = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{suffix}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def build_binaries() -> Path:
    """Run build.sh (seconds when warm) and return the bin directory it prints."""
    try:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ClusterError(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
    except subprocess.CalledProcessError as exc:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit {exc.returncode}:\n{_tail(exc.stderr)}") from exc
    return Path(done.stdout.strip().splitlines()[-1])


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Pem:
    """A certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def new_ca(common_name: str) -> tuple[Pem, ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)), key, cert


def new_leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, common_name: str, *,
             organization: str | None = None, dns: Sequence[str] = (), ips: Sequence[str] = (),
             server: bool = False) -> Pem:
    """A certificate signed by the CA: a server certificate with SANs, or a client certificate (CN, O)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(common_name, organization)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


# --------------------------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """One started process (its own process group) and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the process's log."""
        try:
            return _tail(self.log.read_text(errors="replace"), lines)
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after `timeout`."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        # The group may outlive its leader (gunicorn workers): always sweep it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)


_LIVE: list[Proc] = []


def _reap_all() -> None:
    for proc in reversed(_LIVE):
        proc.stop(timeout=3)
    _LIVE.clear()


atexit.register(_reap_all)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(name: str, argv: Sequence[str], logdir: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> Proc:
    """Start `argv` in a new session (so its whole group can be killed), output appended to logdir/name.log.

    Teardown stops the group; should the test process die before that, the child gets SIGKILL from the kernel.
    """
    log = logdir / f"{name}.log"
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        popen = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=dict(env) if env is not None else None,
                                 cwd=str(cwd) if cwd else None,
                                 preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    proc = Proc(name, popen, log)
    _LIVE.append(proc)
    return proc


# --------------------------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    """The control plane, its nodes and the registered webhook; see the module docstring."""

    bindir: Path
    workdir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    etcd_port: int = 0
    apiserver_port: int = 0
    webhook_port: int = 0
    webhook_metrics_port: int = 0
    kubeconfig: Path = Path()
    webhook_tls: Path = Path()
    webhook_rules: Path = Path()
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

    def start(self) -> None:
        """Start everything and create the seed's cluster; raises ClusterError with the logs on failure."""
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.pki.mkdir(parents=True, exist_ok=True)
        steps: list[tuple[str, Callable[[], None]]] = [
            ("etcd", self._start_etcd), ("kube-apiserver", self._start_apiserver),
            ("kube-controller-manager", self._start_controller_manager), ("kube-scheduler", self._start_scheduler),
            ("kwok", self._start_kwok), ("seed objects", self._create_seed), ("gpu-webhook", self.start_webhook),
            ("webhook configurations", self._register_webhooks),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                raise ClusterError(f"starting {what} failed: {exc}\n{self.logs()}") from exc

    def stop(self) -> None:
        """Stop every process, webhook first; safe to call twice."""
        for name in ["gpu-webhook", "kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]:
            proc = self.procs.get(name)
            if proc is not None:
                proc.stop()
                with contextlib.suppress(ValueError):
                    _LIVE.remove(proc)

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
                           ips=[LOOPBACK, "10.0.0.1"])
        admin = new_leaf(ca_key, ca_cert, "system:admin", organization="system:masters")
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        files = {
            "ca.crt": ca.cert, "ca.key": ca.key, "apiserver.crt": serving.cert, "apiserver.key": serving.key,
            "admin.crt": admin.cert, "admin.key": admin.key, "sa.key": _key_pem(sa_key),
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
        self._wait_http("kube-controller-manager", f"https://{LOOPBACK}:{port}/healthz", _insecure(), timeout=60)

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
        self._wait_http("kube-scheduler", f"https://{LOOPBACK}:{port}/healthz", _insecure(), timeout=60)

    def _start_kwok(self) -> None:
        stages = self.bindir.parent / "kwok-stages"
        configs = [stages / "node" / "fast" / "node-initialize.yaml",
                   stages / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
                   stages / "pod" / "fast" / "pod-ready.yaml", stages / "pod" / "fast" / "pod-complete.yaml",
                   stages / "pod" / "fast" / "pod-delete.yaml"]
        args = [str(self.bindir / "kwok"), f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                # Pod and node addresses are data only (no kubelet answers on them): keep them on loopback.
                "--cidr=127.64.0.0/16", f"--node-ip={LOOPBACK}",
                "--node-lease-duration-seconds=40", f"--server-address={LOOPBACK}:{free_port()}"]
        for path in configs:
            args += ["--config", str(path)]
        home = self.workdir / "kwok-home"
        home.mkdir(exist_ok=True)
        env = dict(os.environ)
        env["HOME"] = str(home)  # kwok reads ~/.kwok/kwok.yaml by default: keep the user's out of it
        self.procs["kwok"] = spawn("kwok", args, self.logdir, env=env)
        time.sleep(1)
        self._check_alive("kwok")

    # ------------------------------------------------------------------ the seed's cluster

    def _create_seed(self) -> None:
        nodes = seed_nodes()
        self.kubectl("create", "-f", "-", input=yaml.safe_dump_all(nodes))
        node_names = [n["metadata"]["name"] for n in nodes]

        def nodes_ready() -> bool:
            listed = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            by_name = {n["metadata"]["name"]: n for n in listed}
            for name in node_names:
                node = by_name.get(name)
                if node is None:
                    return False
                ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
                taints = [t["key"] for t in node["spec"].get("taints", [])]
                if not ready or ready[0]["status"] != "True" or "node.kubernetes.io/not-ready" in taints:
                    return False
                if node["status"].get("allocatable", {}).get(GPU, "0") != node_gpus(name):
                    return False
            return True

        wait_until(nodes_ready, 90, "the seed's nodes to be Ready with their GPUs and no not-ready taint")
        runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                         "handler": "nvidia"}
        self.kubectl("create", "-f", "-", input=yaml_of(runtime_class, device_plugin_daemonset()))
        self.ensure_namespace(WEBHOOK_NAMESPACE)

    def ensure_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Create the namespace if needed and wait for its `default` ServiceAccount (Pods need it)."""
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
        exists = self.kubectl("get", "namespace", name, check=False).returncode == 0
        if not exists:
            self.kubectl("create", "-f", "-", input=yaml_of(namespace))
        wait_until(lambda: self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
                   60, f"ServiceAccount {name}/default")

    # ------------------------------------------------------------------ the webhook

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
        ], self.logdir, env=env, cwd=self.workdir)
        context = ssl.create_default_context(cafile=str(self.webhook_tls / "ca.crt"))
        self._wait_http("gpu-webhook", f"{self.webhook_url}/readyz", context, timeout=60)

    def stop_webhook(self) -> None:
        """Stop the webhook's process group (its configurations stay registered)."""
        proc = self.procs.get("gpu-webhook")
        if proc is not None:
            proc.stop()
            with contextlib.suppress(ValueError):
                _LIVE.remove(proc)

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


def _insecure() -> ssl.SSLContext:
    """For the health ports of the controller-manager and scheduler (self-signed, loopback only)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


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


# --------------------------------------------------------------------------------------------- seed objects

_GFD = {
    "a100": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.family": "ampere",
             "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.compute.major": "8",
             "nvidia.com/gpu.compute.minor": "0", "nvidia.com/mig.capable": "true",
             "nvidia.com/mig.strategy": "single"},
    "t4": {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.family": "turing",
           "nvidia.com/gpu.memory": "15360", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.compute.major": "7",
           "nvidia.com/gpu.compute.minor": "5", "nvidia.com/mig.capable": "false"},
}
_COMMON_GFD = {
    "nvidia.com/gpu.present": "true", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/gpu.machine": "e2e-fake", "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "127", "nvidia.com/cuda.driver-version.revision": "05",
    "nvidia.com/cuda.driver-version.full": "550.127.05", "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4", "nvidia.com/cuda.runtime-version.full": "12.4",
    "nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
}
SEED_NODES = {
    "gpu-a100-0": ("a100", "training", "nvidia-a100", 8),
    "gpu-a100-1": ("a100", "training", "nvidia-a100", 8),
    "gpu-t4-0": ("t4", "inference", "nvidia-tesla-t4", 4),
    "gpu-t4-1": ("t4", "inference", "nvidia-tesla-t4", 4),
    "cpu-0": None,
}


def node_gpus(name: str) -> str:
    """The GPU count a seed node advertises ("0" for the CPU node)."""
    spec = SEED_NODES[name]
    return str(spec[3]) if spec else "0"


def seed_nodes() -> list[Json]:
    """The five Nodes of the seed's cluster, with status (capacity, allocatable, Ready) set at CREATE."""
    nodes = []
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for name, spec in SEED_NODES.items():
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": "e2e-fake"}
        taints: list[Json] = []
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
        if spec:
            gpu_type, workload, accelerator, gpus = spec
            labels |= {"gpu-type": gpu_type, "workload": workload, "accelerator": accelerator,
                       **_COMMON_GFD, **_GFD[gpu_type]}
            taints.append(dict(GPU_TAINT))
            capacity[GPU] = str(gpus)
        else:
            labels["workload"] = "cpu"
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {"taints": taints},
            "status": {
                "capacity": capacity, "allocatable": dict(capacity),
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kwok-managed fake node", "lastHeartbeatTime": now,
                                "lastTransitionTime": now}],
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake",
                             "kubeProxyVersion": "fake", "containerRuntimeVersion": "fake", "osImage": "fake",
                             "kernelVersion": "fake", "machineID": "", "systemUUID": "", "bootID": ""},
                "phase": "Running",
            },
        })
    return nodes


def device_plugin_daemonset() -> Json:
    """NVIDIA's device-plugin DaemonSet (static manifest, v0.17), limited to GPU nodes."""
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {"name": "nvidia-device-plugin-ds"}},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                    "containers": [{
                        "name": "nvidia-device-plugin-ctr", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}],
                    }],
                    "volumes": [{"name": "device-plugin",
                                 "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}],
                },
            },
        },
    }


def gpu_pod(name: str, gpus: int = 1, labels: Mapping[str, str] | None = None, *,
            requests: Mapping[str, str] | None = None, limits: Mapping[str, str] | None = None,
            node_selector: Mapping[str, str] | None = None) -> Json:
    """A one-container Pod asking for `gpus` in limits (or the given requests/limits)."""
    resources: Json = {}
    if limits is not None or requests is not None:
        if limits is not None:
            resources["limits"] = dict(limits)
        if requests is not None:
            resources["requests"] = dict(requests)
    elif gpus:
        resources["limits"] = {GPU: str(gpus)}
    spec: Json = {"restartPolicy": "Never",
                  "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                                  "command": ["nvidia-smi"], "resources": resources}]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": spec}


@contextlib.contextmanager
def running_cluster(workdir: Path) -> Iterator[Cluster]:
    """Build (or reuse) the binaries, start the cluster, yield it, stop it."""
    cluster = Cluster(bindir=build_binaries(), workdir=workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# --------------------------------------------------------------------------------------------- test helpers


# What the webhook gives the seed's cuda-gpu-test Pod with the packaged rules: the default class's nodeSelector and
# runtime class, one GPU toleration (ExtendedResourceToleration added it before the webhook saw the Pod; the
# webhook must not add a second), and the class annotation.
SEED_POD_INJECTED: Json = {
    "nodeSelector": {"workload": "inference", "gpu-type": "t4"},
    "runtimeClassName": "nvidia",
    "gpu tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
    "class": "workload=inference,gpu-type=t4",
}


def injected(pod: Json) -> Json:
    """The parts of a stored Pod that SEED_POD_INJECTED describes."""
    spec = pod["spec"]
    return {
        "nodeSelector": spec.get("nodeSelector"),
        "runtimeClassName": spec.get("runtimeClassName"),
        "gpu tolerations": [t for t in spec.get("tolerations") or () if t.get("key") == GPU],
        "class": (pod["metadata"].get("annotations") or {}).get("gpu-webhook.io/class"),
    }


def pod_json(cluster: Cluster, namespace: str, name: str) -> Json:
    """`kubectl get pod -o json`."""
    return dict(json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout))


def wait_scheduled(cluster: Cluster, namespace: str, name: str, timeout: float = 60) -> str:
    """Wait until the scheduler has bound the Pod; returns its node name."""
    return str(wait_until(lambda: pod_json(cluster, namespace, name)["spec"].get("nodeName"), timeout,
                          f"pod {namespace}/{name} to be scheduled"))


def events_for(cluster: Cluster, namespace: str, kind: str, name: str) -> list[Json]:
    """The events whose involvedObject is kind/name."""
    done = cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                           f"--field-selector=involvedObject.kind={kind},involvedObject.name={name}")
    return list(json.loads(done.stdout)["items"])


def yaml_of(*docs: Json) -> str:
    """Objects as multi-document YAML (what a user would apply)."""
    return yaml.safe_dump_all(list(docs), sort_keys=False)


def webhook_readyz(cluster: Cluster) -> Json:
    """The webhook's /readyz document (from whichever worker answers)."""
    context = ssl.create_default_context(cafile=str(cluster.webhook_tls / "ca.crt"))
    try:
        with urllib.request.urlopen(f"{cluster.webhook_url}/readyz", context=context, timeout=10) as response:
            return dict(json.loads(response.read()))
    except urllib.error.HTTPError as err:
        return dict(json.loads(err.read()))


def wait_rules_digest(cluster: Cluster, changed_from: str | None = None, equal_to: str | None = None,
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
def edited_rules(cluster: Cluster, edit: Callable[[Json], None]) -> Iterator[str]:
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


def etcd_call(cluster: Cluster, path: str, body: Json) -> Json:
    """One call to etcd's JSON gateway (v3 API), e.g. `/v3/kv/range`."""
    request = urllib.request.Request(f"{cluster.etcd_url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def compact_etcd(cluster: Cluster) -> int:
    """Compact etcd (physically) at its current revision; returns that revision."""
    header = etcd_call(cluster, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]
    revision = int(header["revision"])
    etcd_call(cluster, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def signal_group(proc: Proc, sig: signal.Signals) -> None:
    """Send a signal to a started process's whole group (SIGSTOP/SIGCONT to freeze and thaw it)."""
    os.killpg(proc.popen.pid, sig)
