"""The shutdown delay: on SIGTERM the server keeps serving for a while and moves its clients elsewhere first.

Why. The API server calls a webhook Service over HTTP/1.1 and keeps its connections alive in a pool keyed by the
Service's host name, not by endpoint. It picks a Ready endpoint only when it dials, so a connection opened to a
Pod stays in use after the Pod has left the endpoints, until one side closes it. If the Pod is the side that
closes (gunicorn's graceful stop closes idle kept-alive connections), a review can be written on the connection
just as it goes away, and fail. kube-apiserver has the same problem on its own listener and solves it with
`--shutdown-delay-duration`; this is the webhook's version:

1. SIGTERM: the master sets a flag shared with every worker (`Drain.begin`) and keeps listeners and workers up.
   Each answer then carries `Connection: close` (the worker sets the request's `must_close`), so the API server
   closes the connection itself after reading the answer and dials again, to a Ready endpoint. New connections
   are still accepted and served, and `/readyz` answers 503 "shutting down".
2. The delay ends when both hold: `delay` seconds have passed, and no review (`/mutate`, `/validate`; probes do
   not count) has arrived for `quiet` seconds. An API server whose EndpointSlice informer still lists this Pod
   as Ready keeps dialling it; stopping then would leave its next review unanswered until the call's deadline
   (`timeoutSeconds`), so the server serves on while reviews keep coming, up to `longest` seconds. When the
   endpoints propagate in time (the usual case) the reviews stop within a second and the delay is `delay`.
3. Then gunicorn's own graceful stop: in-flight reviews finish within `graceful_timeout`. A worker closes its
   listening sockets as it stops accepting, so a client that still dials is refused at once (RST) instead of
   waiting in a listen backlog nobody accepts from until the call's deadline.

A second SIGTERM during the delay, SIGINT or SIGQUIT stops at once. `delay` 0 is gunicorn's plain behaviour.
The flag and the time of the last review are 16 bytes of anonymous shared memory, mapped by the master before
it forks the workers.
"""

from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass
from typing import Any

from gunicorn.arbiter import Arbiter

_LAST_REVIEW = struct.Struct("d")  # at offset 8: time.monotonic() of the last review while draining


class Drain:
    """What the master and every forked worker share: the flag "answer with Connection: close", set by the
    master, and the monotonic time of the last review a worker received while it was set.

    CLOCK_MONOTONIC is one clock for every process of the machine, so the master compares the workers' stamps
    with its own `time.monotonic()`."""

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, 16)  # MAP_SHARED | MAP_ANONYMOUS: the same page in every forked worker

    def begin(self, now: float) -> None:
        self.review_arrived(now)
        self._mem[0] = 1

    def draining(self) -> bool:
        return self._mem[0] == 1

    def review_arrived(self, now: float) -> None:
        _LAST_REVIEW.pack_into(self._mem, 8, now)

    def last_review(self) -> float:
        return float(_LAST_REVIEW.unpack_from(self._mem, 8)[0])


@dataclass(frozen=True)
class Timing:
    """How long the shutdown delay lasts (module doc, step 2), in seconds."""

    delay: float  # at least this long
    quiet: float  # and until no review has arrived for this long
    longest: float  # but never longer than this

    def done(self, since_sigterm: float, since_last_review: float) -> bool:
        """Whether the delay is over, `since_sigterm` seconds after SIGTERM and `since_last_review` after the
        last review received while draining."""
        if since_sigterm >= self.longest:
            return True
        return since_sigterm >= self.delay and since_last_review >= self.quiet


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


def review_arrived() -> None:
    """A worker got a review while draining: the master's delay waits for a quiet spell after it."""
    if _current is not None:
        _current.review_arrived(time.monotonic())


class DelayingArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's master, with the shutdown delay of the module doc before its graceful stop."""

    def __init__(self, app: Any, drain: Drain, timing: Timing) -> None:
        super().__init__(app)
        self.drain, self.timing = drain, timing
        self.sigterm_at: float | None = None
        self.extended = False

    def handle_term(self) -> None:
        if self.sigterm_at is not None or self.timing.delay <= 0:
            raise StopIteration  # a second SIGTERM, or no delay: gunicorn's graceful stop now
        self.sigterm_at = time.monotonic()
        self.drain.begin(self.sigterm_at)
        self.log.info("SIGTERM: answering with Connection: close for at least %.1f s, until no review has come "
                      "for %.1f s (at most %.1f s), so clients move to other endpoints; then stopping gracefully",
                      self.timing.delay, self.timing.quiet, self.timing.longest)

    def manage_workers(self) -> None:
        # The main loop calls this at least once a second, after the signals of that second.
        if self.sigterm_at is not None:
            now = time.monotonic()
            since_sigterm, since_review = now - self.sigterm_at, now - self.drain.last_review()
            if self.timing.done(since_sigterm, since_review):
                self.log.info("shutdown delay over after %.1f s (last review %.1f s ago): stopping gracefully",
                              since_sigterm, since_review)
                raise StopIteration
            if since_sigterm >= self.timing.delay and not self.extended:
                self.extended = True
                self.log.warning("reviews still arrive %.1f s after SIGTERM (the last %.1f s ago): a client still "
                                 "resolves the Service to this Pod, so it serves on until none has come for %.1f s "
                                 "(at most %.1f s after SIGTERM); if this shows in every rollout, the Service's "
                                 "EndpointSlice updates lag: look at kube-controller-manager's endpointslice "
                                 "controller", since_sigterm, since_review, self.timing.quiet, self.timing.longest)
        super().manage_workers()
