"""Shared pieces of the benchmarks in bench/: realistic reviews, servers to compare, count-bounded clients.

Builds on bench/load.py (the keep-alive client, the floors, open and closed loops); imported by matrix.py,
memory.py and soak.py. Not a test, not a benchmark by itself.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import load  # noqa: E402  (bench/load.py: not a package)

REPO = load.REPO
REVIEWS = REPO / "tests" / "data" / "admission-reviews"
UID = load.UID_PLACEHOLDER


# --- realistic reviews -----------------------------------------------------------------------------


def _fixture(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((REVIEWS / f"{name}.json").read_text())
    document["request"]["uid"] = UID
    return document


def gpu_pod_review() -> dict[str, Any]:
    """A 1-container GPU Pod CREATE from a ReplicaSet, as kube-apiserver sends it (defaulted)."""
    return _fixture("pod-create-from-replicaset-gpu")


def big_pod_review(target_bytes: int = 10_240) -> dict[str, Any]:
    """A ~10 KB Pod: 4 containers (2 with GPUs), a sidecar, env, mounts, probes, tolerations."""
    document = gpu_pod_review()
    spec = document["request"]["object"]["spec"]
    base = spec["containers"][0]
    containers = []
    for i in range(4):
        c = copy.deepcopy(base)
        c["name"] = f"worker-{i}"
        c["resources"] = {"limits": {"cpu": "2", "memory": "8Gi"}, "requests": {"cpu": "2", "memory": "8Gi"}}
        if i < 2:
            c["resources"]["limits"]["nvidia.com/gpu"] = "1"
            c["resources"]["requests"]["nvidia.com/gpu"] = "1"
        c["ports"] = [{"containerPort": 8000 + i, "name": f"http-{i}", "protocol": "TCP"}]
        c["volumeMounts"] = [{"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/"
                              "serviceaccount", "readOnly": True}, {"name": "cache", "mountPath": "/cache"}]
        c["readinessProbe"] = {"httpGet": {"path": "/health", "port": 8000 + i, "scheme": "HTTP"},
                               "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
                               "failureThreshold": 3}
        containers.append(c)
    spec["containers"] = containers
    spec["initContainers"] = [{"name": "log-shipper", "image": "fluent/fluent-bit:3.0", "restartPolicy": "Always",
                               "resources": {"limits": {"cpu": "100m", "memory": "64Mi"},
                                             "requests": {"cpu": "100m", "memory": "64Mi"}},
                               "terminationMessagePath": "/dev/termination-log",
                               "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}]
    spec["volumes"] = [{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                       {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                           {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                           {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                                                  "path": "ca.crt"}]}}]}}]
    i = 0
    while len(json.dumps(document)) < target_bytes:
        containers[i % 4].setdefault("env", []).append(
            {"name": f"MODEL_SETTING_{i}", "value": f"value-{i:04d}-" + "x" * 24})
        i += 1
    return document


def deployment_review() -> dict[str, Any]:
    """A GPU Deployment CREATE (a pod template: validated, not mutated by default)."""
    return _fixture("deployment-create-gpu-template")


CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "gpu-pod": gpu_pod_review, "big-pod": big_pod_review, "deployment": deployment_review,
}


def template_of(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


# --- servers ---------------------------------------------------------------------------------------


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_WEBHOOK_", "PROMETHEUS_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


@dataclass
class Running:
    """A server process of a benchmark, on a loopback port."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    cafile: str

    def worker_pids(self) -> list[int]:
        """The gunicorn workers (children of the master)."""
        pids: list[int] = []
        task_dir = Path(f"/proc/{self.proc.pid}/task")
        for task in task_dir.iterdir():
            try:
                pids += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
        return sorted(set(pids))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start(name: str, kind: str, tls_dir: Path, *, workers: int = 2, threads: int = 4, worker_class: str = "gthread",
          log_level: str = "INFO", log: Path | None = None, extra: list[str] | None = None,
          checkout: Path | None = None) -> Running:
    """Start `kind`: `webhook` (gpu-webhook serve), `flask` / `wsgi` (floors of bench/load.py), on a free port.

    `worker_class="sync"` runs the same app under gunicorn's sync worker (through this module's `--serve`).
    `checkout` runs the webhook of another tree (its `webhook` package first on the path); with it, `workers` and
    `threads` are passed only through `extra`, so that each tree runs with its own defaults unless told.
    """
    port = load.free_port()
    common = [] if checkout else ["--workers", str(workers), "--threads", str(threads)]
    if kind == "webhook" and worker_class == "gthread":
        command = [sys.executable, "-m", "webhook.cli.server", "serve", "--tls-dir", str(tls_dir),
                   "--host", "127.0.0.1", "--port", str(port), "--metrics-host", "127.0.0.1",
                   "--metrics-port", str(load.free_port()), "--log-level", log_level, *common, *(extra or [])]
    elif kind == "webhook":
        command = [sys.executable, str(BENCH / "common.py"), "webhook", worker_class, str(tls_dir), str(port),
                   str(load.free_port()), str(workers), str(threads), log_level]
    elif worker_class == "gthread":
        command = [sys.executable, str(BENCH / "load.py"), "--serve-floor", kind, "--tls-dir", str(tls_dir),
                   "--port", str(port), "--metrics-port", str(load.free_port()), *common]
    else:
        command = [sys.executable, str(BENCH / "common.py"), kind, worker_class, str(tls_dir), str(port),
                   str(load.free_port()), str(workers), str(threads), "WARNING"]
    out: Any = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115  (closed below)
    try:
        env = clean_env() | ({"PYTHONPATH": str(checkout)} if checkout else {})
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=checkout)  # `-m` looks in the working directory first
    finally:
        if log:
            out.close()
    running = Running(name, proc, port, str(tls_dir / "ca.crt"))
    try:
        load.wait_ready(port, running.cafile, proc)
    except Exception:
        running.stop()
        raise
    return running


def _serve_other_worker(kind: str, worker_class: str, tls_dir: str, port: str, metrics_port: str, workers: str,
                        threads: str, log_level: str) -> int:
    """The webhook or a floor under another gunicorn worker class (the `sync` comparison)."""
    from webhook.admission import logs, metrics
    from webhook.admission.app import create_app
    from webhook.admission.gunicorn_conf import WebhookServer
    from webhook.admission.policy_store import PolicyStore
    from webhook.admission.settings import Settings
    from webhook.admission.tls import ServingTls

    settings = Settings(tls_dir=Path(tls_dir), host="127.0.0.1", port=int(port), metrics_host="127.0.0.1",
                        metrics_port=int(metrics_port), workers=int(workers), threads=int(threads),
                        log_level=log_level)  # type: ignore[arg-type]
    logs.configure(settings.log_level)
    metrics_dir = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    metrics.enable_multiprocess(metrics_dir)
    tls = ServingTls(Path(tls_dir))
    if kind == "webhook":
        store = PolicyStore(None)
        factory: Callable[[], Any] = lambda: create_app(settings, store=store, tls=tls)  # noqa: E731
    elif kind == "flask":
        factory = load.flask_floor_app
    else:
        factory = lambda: load.floor_app  # noqa: E731
    server = WebhookServer(settings, factory, tls, metrics_dir)
    server.cfg.set("worker_class", worker_class)  # the only difference from production
    server.run()
    return 0


# --- count-bounded keep-alive load ---------------------------------------------------------------


@dataclass
class Tally:
    sent: int = 0
    errors: list[str] = field(default_factory=list)


def _count_process(port: int, cafile: str, requests: list[tuple[bytes, str]], connections: int, count: int,
                   queue: Any) -> None:
    makers = [load.build_request(template, path) for template, path in requests]
    context = load.client_context(cafile)
    tallies = [Tally() for _ in range(connections)]

    def run(index: int) -> None:
        tally = tallies[index]
        mine = count // connections + (1 if index < count % connections else 0)
        conn = load.Connection(port, context)
        try:
            for i in range(mine):
                status, _ = conn.roundtrip(makers[(index + i) % len(makers)]())
                tally.sent += 1
                if status != 200:
                    tally.errors.append(str(status))
        except Exception as exc:
            tally.errors.append(repr(exc))
        finally:
            conn.close()

    load.fan_out(connections, run)
    queue.put((sum(t.sent for t in tallies), [e for t in tallies for e in t.errors][:20]))


def send_count(port: int, cafile: str, requests: list[tuple[bytes, str]], count: int, processes: int = 2,
               connections: int = 4, timeout: float = 3600) -> tuple[int, list[str], float]:
    """Send exactly `count` requests (cycling through `requests`) on keep-alive connections: (sent, errors, s)."""
    queue: Any = multiprocessing.Queue()
    started = time.perf_counter()
    share = [count // processes + (1 if i < count % processes else 0) for i in range(processes)]
    procs = [multiprocessing.Process(target=_count_process, args=(port, cafile, requests, connections, n, queue))
             for n in share]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=timeout) for _ in procs]
    for proc in procs:
        proc.join(30)
    return sum(r[0] for r in results), [e for r in results for e in r[1]], time.perf_counter() - started


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tls_version(cafile: str, port: int) -> str:
    context = load.client_context(cafile)
    conn = load.Connection(port, context)
    try:
        assert isinstance(conn.sock, ssl.SSLSocket)
        return str(conn.sock.version())
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(_serve_other_worker(*sys.argv[1:9]))
