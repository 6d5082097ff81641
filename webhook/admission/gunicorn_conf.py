"""How gunicorn runs the admission server: gthread workers over TLS that follows rotation, metrics in the master.

* `gthread` workers keep connections alive (a `sync` worker closes every one, so each admission would pay a
  TLS handshake); keep-alive 120 s outlives the API server's 90 s idle timeout, so the server never closes
  a connection the API server is about to reuse.
* gunicorn 27's gthread worker wraps each accepted connection with `sock.ssl_wrap_socket`, which calls the
  `ssl_context(conf, default_factory)` server hook every time. The hook returns `ServingTls.context()`: a
  cached context, rebuilt only when the `..data` target or a file changes, from a pair read from one target.
  The default factory (which re-reads certfile and keyfile separately, racing a rotation) is never used;
  `certfile`/`keyfile` are set only because gunicorn decides "TLS or not" from them.
* SIGTERM: for `shutdown_delay_seconds`, and on while reviews keep arriving (up to
  `shutdown_delay_max_seconds`), every answer says `Connection: close` and new connections are still served,
  so the API server moves its connections to other endpoints (shutdown.py); then the master stops the workers
  gracefully; in-flight reviews complete within `graceful_timeout`, and a stopping worker closes its listening
  sockets at once, so a late dial is refused rather than left unanswered.
* Errors gunicorn answers itself (a malformed request line or header, a header section too large) get a
  JSON metav1.Status like every other error of this server, not gunicorn's HTML page: `JsonErrorWorker`.
* Prometheus multiprocess mode: workers write samples to a private directory (review counts once a second,
  and in `worker_exit`); the master serves their sum as plain HTTP from `when_ready`, and drops a dead
  worker's live gauges in `child_exit`.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from gunicorn import util as gunicorn_util
from gunicorn.app.base import BaseApplication
from gunicorn.workers.gthread import ThreadWorker

from webhook.admission import logs, metrics, shutdown
from webhook.admission.review import error_status
from webhook.admission.settings import Settings
from webhook.admission.tls import CERT_FILE, KEY_FILE, SHM_DIR, ServingTls

WsgiApp = Callable[..., Any]


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def options(settings: Settings, tls: ServingTls, metrics_dir: Path) -> dict[str, Any]:
    """The gunicorn settings for `settings` (hooks included)."""
    if settings.tls_dir is None:
        raise ValueError("gunicorn serves TLS only: settings.tls_dir is required")

    def ssl_context(conf: Any, default_factory: Callable[[], Any]) -> Any:
        return tls.context()

    def when_ready(arbiter: Any) -> None:
        metrics.serve_aggregate(settings.metrics_host, settings.metrics_port, metrics_dir)
        arbiter.log.info("metrics on http://%s/metrics",
                         bind_address(settings.metrics_host, settings.metrics_port))

    def worker_exit(arbiter: Any, worker: Any) -> None:
        logs.flush()  # the review lines still held in this worker's batch
        metrics.flush()  # the review counts tallied since the last write

    def child_exit(arbiter: Any, worker: Any) -> None:
        metrics.worker_exited(worker.pid, metrics_dir)

    def on_exit(arbiter: Any) -> None:
        shutil.rmtree(metrics_dir, ignore_errors=True)

    return {
        "bind": [bind_address(settings.host, settings.port)],
        "worker_class": "webhook.admission.gunicorn_conf.JsonErrorWorker",
        "workers": settings.workers,
        "threads": settings.threads,
        "keepalive": settings.keepalive_seconds,
        "graceful_timeout": settings.graceful_timeout_seconds,
        "timeout": 30,
        "http_protocols": "h1",
        "certfile": str(settings.tls_dir / CERT_FILE),
        "keyfile": str(settings.tls_dir / KEY_FILE),
        "ssl_context": ssl_context,
        "when_ready": when_ready,
        "worker_exit": worker_exit,
        "child_exit": child_exit,
        "on_exit": on_exit,
        "preload_app": False,
        "proc_name": "gpu-webhook",
        "loglevel": settings.log_level.lower(),
        "errorlog": "-",
        "accesslog": None,
        "control_socket_disable": True,  # no ~/.gunicorn/gunicorn.ctl: read-only root file systems, many instances
        "worker_tmp_dir": SHM_DIR,
    }


# gunicorn's own answers to requests it cannot parse: (status, reason) by exception class name.
PROTOCOL_ERRORS = {
    "LimitRequestLine": (414, "URI Too Long"),
    "LimitRequestHeaders": (431, "Request Header Fields Too Large"),
    "UnsupportedTransferCoding": (501, "Not Implemented"),
    "ExpectationFailed": (417, "Expectation Failed"),
    "SSLError": (403, "Forbidden"),
    "SSLCertVerificationError": (403, "Forbidden"),
}
CLIENT_ERRORS = frozenset({
    "InvalidRequestLine", "InvalidRequestMethod", "InvalidHTTPVersion", "InvalidHeader", "InvalidHeaderName",
    "InvalidProxyLine", "ForbiddenProxyRequest", "InvalidSchemeHeaders", "ObsoleteFolding",
    "InvalidH2CPreface", "InvalidChunkSize", "ChunkMissingTerminator", "InvalidChunkExtension",
    *PROTOCOL_ERRORS,
})


REVIEW_PATHS = frozenset({"/mutate", "/validate"})


class JsonErrorWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker, answering its own protocol errors with a JSON Status instead of HTML, and
    with a deadline on every request a thread handles.

    gthread reads a request's TLS handshake and head in a worker thread with no read timeout, so a few clients
    sending a byte now and then (slowloris) could hold every thread of a worker for ever. Here a thread that
    takes a connection has `HEAD_SECONDS` to receive the TLS handshake and the request head, then
    `REQUEST_SECONDS` more for the body and the answer: past its deadline a watchdog thread shuts the socket
    down, the blocked read fails, and the thread is free again. The API server sends a review at once and
    gives up on a webhook after `timeoutSeconds` (at most 30 s, 5 s in our manifests), so no real review is
    ever cut; an attacker holds a thread for seconds, not for ever (docs/performance.md).
    """

    HEAD_SECONDS = 3.0
    REQUEST_SECONDS = 10.0

    def init_process(self) -> None:
        self._deadlines: dict[int, tuple[float, Any]] = {}
        self._deadline_lock = threading.Lock()
        threading.Thread(target=self._watchdog, name="request-deadlines", daemon=True).start()
        super().init_process()  # runs the worker's loop until it exits

    def handle(self, conn: Any) -> Any:
        self._set_deadline(conn, self.HEAD_SECONDS)
        try:
            return super().handle(conn)
        finally:
            with self._deadline_lock:
                self._deadlines.pop(id(conn), None)

    def handle_request(self, req: Any, conn: Any) -> Any:
        self._set_deadline(conn, self.REQUEST_SECONDS)  # the head is in: time for the body and the answer
        if shutdown.draining():
            req.must_close = True  # answered with `Connection: close`: the client dials another endpoint next
            if req.path in REVIEW_PATHS:
                shutdown.review_arrived()  # a client still sends reviews here: the master serves on
        return super().handle_request(req, conn)

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:
            # Stopping: the master has closed its copies of the listening sockets, so closing ours makes the
            # kernel refuse new connections (RST) instead of completing handshakes nobody will ever accept.
            for listener in self.sockets:
                with contextlib.suppress(OSError):
                    listener.close()

    def _set_deadline(self, conn: Any, seconds: float) -> None:
        with self._deadline_lock:
            self._deadlines[id(conn)] = (time.monotonic() + seconds, conn)

    def _watchdog(self) -> None:
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            with self._deadline_lock:
                late = [conn for deadline, conn in self._deadlines.values() if deadline < now]
            for conn in late:
                self.log.warning("closing a connection from %s: its request did not arrive in time",
                                 (conn.client or ("",))[0])
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        name = type(exc).__name__
        if name not in CLIENT_ERRORS:
            super().handle_error(req, client, addr, exc)  # application errors: gunicorn logs them (500)
            return
        code, reason = PROTOCOL_ERRORS.get(name, (400, "Bad Request"))
        self.log.warning("invalid request from %s: %s", (addr or ("",))[0], exc)
        payload = orjson.dumps(error_status(code, f"{reason}: {str(exc)[:200]}"))
        head = (f"HTTP/1.1 {code} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode("latin-1")
        try:
            gunicorn_util.write_nonblock(client, head + payload)
        except Exception:
            self.log.debug("failed to send the error answer")


class WebhookServer(BaseApplication):  # type: ignore[misc]
    """gunicorn's master in this process, serving `app_factory()` in each worker."""

    def __init__(self, settings: Settings, app_factory: Callable[[], WsgiApp], tls: ServingTls,
                 metrics_dir: Path) -> None:
        self._options = options(settings, tls, metrics_dir)
        self._app_factory = app_factory
        self._shutdown = shutdown.Timing(delay=settings.shutdown_delay_seconds,
                                         quiet=settings.shutdown_quiet_seconds,
                                         longest=max(settings.shutdown_delay_seconds,
                                                     settings.shutdown_delay_max_seconds))
        super().__init__()

    def run(self) -> None:
        """gunicorn's `BaseApplication.run`, with the master that delays its stop (shutdown.py)."""
        try:
            shutdown.DelayingArbiter(self, shutdown.install(), self._shutdown).run()
        except RuntimeError as exc:
            print(f"\nError: {exc}\n", file=sys.stderr)
            sys.exit(1)

    def load_config(self) -> None:
        for key, value in self._options.items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self) -> WsgiApp:
        return self._app_factory()
