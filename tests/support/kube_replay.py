"""A local Kubernetes API server that replays recorded-style responses, for the client-side tests.

Each (path, list|watch) route holds a queue of responses; the last one repeats. Lists are JSON documents
with a resourceVersion (and `continue` tokens for pages); watches are chunked streams of newline-delimited
JSON events, as the API server sends them, that either end cleanly, drop the connection in the middle of
a chunk, or stay open until the watch's `timeoutSeconds` (or the client) ends them. `down` makes the
server unreachable (connections are closed at once). Loopback only; every wait is bounded.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

DATA = Path(__file__).parents[1] / "data" / "kube"
MAX_HOLD = 20.0  # seconds: no stream is held longer, whatever timeoutSeconds says


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status body, as the API server sends errors."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def expired(resource_version: str = "5200") -> dict[str, Any]:
    """The ERROR event a watch gets when its resourceVersion was compacted away."""
    return event("ERROR", status(410, "Expired", f"too old resource version: {resource_version} (9100)"))


@dataclass(frozen=True)
class Request:
    path: str
    query: dict[str, str]
    headers: dict[str, str]

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass(frozen=True)
class Json:
    body: dict[str, Any]
    code: int = 200


@dataclass(frozen=True)
class Stream:
    """A watch response: `events`, then `end`: close (clean end), drop (cut mid-chunk) or hold."""

    events: Sequence[dict[str, Any]] = ()
    end: str = "hold"


@dataclass(frozen=True)
class Hang:
    """Answer nothing for `seconds` (bounded; ends early when the server stops), then this response."""

    seconds: float
    then: Json = field(default_factory=lambda: Json({}))


@dataclass(frozen=True)
class Computed:
    """A list answered from the request (e.g. events filtered by their fieldSelector)."""

    answer: Callable[[Request], Json]


Response = Json | Stream | Hang | Computed


class ReplayServer:
    """Routes: `server.route("/api/v1/nodes", list=[...], watch=[...])`; requests are recorded."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, str], list[Response]] = {}
        self.requests: list[Request] = []
        self.down = False
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def route(self, path: str, *, list: Sequence[Response] = (), watch: Sequence[Response] = ()) -> None:
        with self._lock:
            if list:
                self._routes[(path, "list")] = [*list]
            if watch:
                self._routes[(path, "watch")] = [*watch]

    def seen(self, path: str, *, watch: bool | None = None) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path == path and (watch is None or r.watch == watch)]

    def wait_until(self, condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.02)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; requests: "
                             f"{[(r.path, r.query) for r in self.requests][-12:]}")

    def kubeconfig(self, path: Path, namespace: str = "ml-research", token: str = "replay-token") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "replay",
            "clusters": [{"name": "replay", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [
                {"name": "replay", "context": {"cluster": "replay", "user": "tester", "namespace": namespace}},
                {"name": "other", "context": {"cluster": "replay", "user": "tester", "namespace": "ml-serving"}},
            ],
        }))
        return path

    # ----------------------------------------------------------------------------------------- serving

    def _next(self, key: tuple[str, str]) -> Response | None:
        with self._lock:
            queue = self._routes.get(key)
            if not queue:
                return None
            return queue.pop(0) if len(queue) > 1 else queue[0]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if server.down:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                request = Request(parts.path, query, {k.lower(): v for k, v in self.headers.items()})
                with server._lock:
                    server.requests.append(request)
                response = server._next((parts.path, "watch" if request.watch else "list"))
                if isinstance(response, Computed):
                    response = response.answer(request)
                if isinstance(response, Hang):
                    server._stopping.wait(min(response.seconds, MAX_HOLD))
                    response = response.then
                if response is None:
                    response = Json(status(404, "NotFound", f"the server could not find the requested resource "
                                                            f"({parts.path})"), 404)
                if isinstance(response, Json):
                    self._json(response)
                else:
                    self._stream(response, float(query.get("timeoutSeconds", MAX_HOLD)))

            def _json(self, response: Json) -> None:
                body = json.dumps(response.body).encode()
                self.send_response(response.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, response: Stream, timeout: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for item in response.events:
                    line = json.dumps(item).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                if response.end == "drop":
                    self.wfile.write(b"400\r\n{\"type\":\"MODIFIED\",\"object\":{\"metadata\":")
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if response.end == "hold":
                    self._hold(min(timeout, MAX_HOLD))
                if server.down:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _hold(self, seconds: float) -> None:
                """Keep the watch open until its timeout, the client leaves, the server stops or goes down."""
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline and not server._stopping.is_set() and not server.down:
                    readable, _, _ = select.select([self.connection], [], [], 0.05)
                    if readable:
                        try:
                            if not self.connection.recv(1, socket.MSG_PEEK):
                                return  # the client closed the connection
                        except OSError:
                            return

        return Handler
