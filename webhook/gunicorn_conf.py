"""How gunicorn runs the admission server: gthread workers over TLS that follows rotation, metrics in the master.

* `gthread` workers keep connections alive (a `sync` worker closes every one, so each admission would pay a
  TLS handshake); keep-alive 120 s outlives the API server's 90 s idle timeout, so the server never closes
  a connection the API server is about to reuse.
* gunicorn 27's gthread worker wraps each accepted connection with `sock.ssl_wrap_socket`, which calls the
  `ssl_context(conf, default_factory)` server hook every time. The hook returns `ServingTls.context()`: a
  cached context, rebuilt only when the `..data` target or a file changes, from a pair read from one target.
  The default factory (which re-reads certfile and keyfile separately, racing a rotation) is never used;
  `certfile`/`keyfile` are set only because gunicorn decides "TLS or not" from them.
* SIGTERM: the master stops the workers gracefully; in-flight reviews complete within `graceful_timeout`.
* Errors gunicorn answers itself (a malformed request line or header, a header section too large) get a
  JSON metav1.Status like every other error of this server, not gunicorn's HTML page: `JsonErrorWorker`.
* Prometheus multiprocess mode: workers write samples to a private directory; the master serves their sum as
  plain HTTP from `when_ready`, and drops a dead worker's live gauges in `child_exit`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from gunicorn import util as gunicorn_util
from gunicorn.app.base import BaseApplication
from gunicorn.workers.gthread import ThreadWorker

from webhook import metrics
from webhook.review import error_status
from webhook.settings import Settings
from webhook.tls import CERT_FILE, KEY_FILE, ServingTls

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

    def child_exit(arbiter: Any, worker: Any) -> None:
        metrics.worker_exited(worker.pid, metrics_dir)

    def on_exit(arbiter: Any) -> None:
        shutil.rmtree(metrics_dir, ignore_errors=True)

    return {
        "bind": [bind_address(settings.host, settings.port)],
        "worker_class": "webhook.gunicorn_conf.JsonErrorWorker",
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
        "child_exit": child_exit,
        "on_exit": on_exit,
        "preload_app": False,
        "proc_name": "gpu-webhook",
        "loglevel": settings.log_level.lower(),
        "errorlog": "-",
        "accesslog": None,
        "control_socket_disable": True,  # no ~/.gunicorn/gunicorn.ctl: read-only root file systems, many instances
        "worker_tmp_dir": "/dev/shm" if os.path.isdir("/dev/shm") else None,
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


class JsonErrorWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker, answering its own protocol errors with a JSON Status instead of HTML."""

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
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self) -> WsgiApp:
        return self._app_factory()
