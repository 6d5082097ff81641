"""The shutdown delay: on SIGTERM the server keeps serving for a while and moves its clients elsewhere first.

Why. The API server calls a webhook Service over HTTP/1.1 and keeps its connections alive in a pool keyed by the
Service's host name, not by endpoint. It picks a Ready endpoint only when it dials, so a connection opened to a
Pod stays in use after the Pod has left the endpoints, until one side closes it. If the Pod is the side that
closes (gunicorn's graceful stop closes idle kept-alive connections), a review can be written on the connection
just as it goes away, and fail. kube-apiserver has the same problem on its own listener and solves it with
`--shutdown-delay-duration`; this is the webhook's version:

1. SIGTERM: the master sets a flag shared with every worker (`Drain.begin`) and keeps listeners and workers up
   for `delay` seconds. Each answer then carries `Connection: close` (the worker sets the request's
   `must_close`), so the API server closes the connection itself after reading the answer and dials again,
   to a Ready endpoint. New connections are still accepted and served (a resolver that has not yet seen the
   endpoint change may send one), and `/readyz` answers 503 "shutting down".
2. After `delay`: gunicorn's own graceful stop (in-flight reviews finish within `graceful_timeout`).

A second SIGTERM during the delay, SIGINT or SIGQUIT stops at once. `delay` 0 is gunicorn's plain behaviour.
The flag is one byte of anonymous shared memory, mapped by the master before it forks the workers.
"""

from __future__ import annotations

import mmap
import time
from typing import Any

from gunicorn.arbiter import Arbiter


class Drain:
    """A flag the master sets and every forked worker reads: "answer with Connection: close"."""

    def __init__(self) -> None:
        self._byte = mmap.mmap(-1, 1)  # MAP_SHARED | MAP_ANONYMOUS: the same page in every forked worker

    def begin(self) -> None:
        self._byte[0] = 1

    def draining(self) -> bool:
        return self._byte[0] == 1


# The running server's flag, set by `install` in the master before any worker forks; None outside gunicorn.
_current: Drain | None = None


def install() -> Drain:
    """A new flag for this process and the workers it will fork."""
    global _current
    _current = Drain()
    return _current


def draining() -> bool:
    """Whether this server has received SIGTERM and is moving its clients away (False outside gunicorn)."""
    return _current is not None and _current.draining()


class DelayingArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's master, with the shutdown delay of the module doc before its graceful stop."""

    def __init__(self, app: Any, drain: Drain, delay: float) -> None:
        super().__init__(app)
        self.drain, self.delay = drain, delay
        self.stop_at: float | None = None

    def handle_term(self) -> None:
        if self.stop_at is not None or self.delay <= 0:
            raise StopIteration  # a second SIGTERM, or no delay: gunicorn's graceful stop now
        self.drain.begin()
        self.stop_at = time.monotonic() + self.delay
        self.log.info("SIGTERM: answering with Connection: close for %.1f s so clients move to other endpoints, "
                      "then stopping gracefully", self.delay)

    def manage_workers(self) -> None:
        # The main loop calls this at least once a second, after the signals of that second.
        if self.stop_at is not None and time.monotonic() >= self.stop_at:
            raise StopIteration
        super().manage_workers()
