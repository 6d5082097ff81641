"""The shutdown delay (webhook/admission/shutdown.py): how long a SIGTERMed server serves on, and what a client
that still dials it gets once it stops.

A rollout replaces the webhook's Pods while the API server keeps resolving the Service from its EndpointSlice
informer. Where that informer lags (a loaded control plane; docs/serving.md "During a rollout"), reviews keep
coming to a Pod after its SIGTERM: the server serves them until they stop, and refuses a dial after its stop at
once instead of leaving it unanswered until the API server's deadline.
"""

from __future__ import annotations

import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
from support.admission import GPU_REVIEW, Pki, Server, client_context, kubelet_write, post, start_server, with_uid

from webhook.admission.shutdown import Timing

TIMING = Timing(delay=5, quiet=3, longest=30)


@pytest.mark.parametrize(("since_sigterm", "since_review", "done"), [
    pytest.param(0, 0, False, id="just signalled"),
    pytest.param(4.9, 4.9, False, id="within the delay, however quiet"),
    pytest.param(5, 5, True, id="the delay over and no review since SIGTERM: the usual rollout"),
    pytest.param(5, 2.9, False, id="a review 2.9 s ago: a client still resolves the Service to this Pod"),
    pytest.param(8, 3, True, id="quiet at last"),
    pytest.param(29.9, 0.1, False, id="reviews still coming, below the longest"),
    pytest.param(30, 0, True, id="the longest, reviews or not"),
])
def test_when_the_shutdown_delay_ends(since_sigterm: float, since_review: float, done: bool) -> None:
    assert TIMING.done(since_sigterm, since_review) is done


def _server(tmp_path: Path, delay: float, quiet: float, longest: float) -> tuple[Server, ssl.SSLContext]:
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), "--shutdown-quiet-seconds", str(quiet),
                          "--shutdown-delay-max-seconds", str(longest), trust=trust, shutdown_delay=delay)
    return server, trust


def test_reviews_after_sigterm_keep_the_server_serving_until_they_stop(tmp_path: Path) -> None:
    """A client that keeps dialling after SIGTERM (its endpoints still list the Pod) is served, each answer
    closing its connection, past the delay; the server stops one quiet spell after the last review."""
    server, trust = _server(tmp_path, delay=1, quiet=1.5, longest=20)
    try:
        server.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        answered = 0
        while time.monotonic() - signalled < 4:
            conn = server.connection(trust, timeout=5)
            status, answer = post(conn, "/mutate", with_uid(GPU_REVIEW))
            conn.close()
            assert status == 200 and answer["response"]["allowed"]
            answered += 1
            time.sleep(0.25)
        last_review = time.monotonic()
        assert server.proc.poll() is None, "stopped while reviews were still arriving"
        assert server.proc.wait(15) == 0
        stopped = time.monotonic()
        # One quiet spell after the last review, plus the master's tick (at most a second) and the graceful stop.
        assert 1.5 <= stopped - last_review < 1.5 + 3
        assert answered >= 10
        assert "reviews still arrive" in server.log() and "shutdown delay over after" in server.log()
    finally:
        server.stop()


def test_reviews_that_never_stop_end_at_the_longest_delay(tmp_path: Path) -> None:
    server, trust = _server(tmp_path, delay=0.5, quiet=2, longest=3)
    stop = threading.Event()

    def keep_sending() -> None:
        while not stop.is_set():
            try:
                conn = server.connection(trust, timeout=2)
                post(conn, "/validate", with_uid(GPU_REVIEW))
                conn.close()
            except OSError:
                pass
            time.sleep(0.2)

    sender = threading.Thread(target=keep_sending, daemon=True)
    try:
        sender.start()
        time.sleep(0.5)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(15) == 0
        assert 3 <= time.monotonic() - signalled < 3 + 3
    finally:
        stop.set()
        sender.join(5)
        server.stop()


def test_a_stopping_server_refuses_a_new_connection_at_once(tmp_path: Path) -> None:
    """gunicorn's graceful stop stops accepting but keeps a worker in it while a kept-alive connection lingers; a
    connection dialled then was completed by the kernel and never accepted, so its client waited for its whole
    deadline (kube-apiserver: `context deadline exceeded`). Now the worker closes its listener as it stops."""
    server, trust = _server(tmp_path, delay=0, quiet=0, longest=0)
    kept = server.connection(trust, timeout=5)
    try:
        assert post(kept, "/mutate", with_uid(GPU_REVIEW))[0] == 200  # a kept-alive connection: the worker lingers
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.proc.poll() is None, "the worker should still be lingering on the kept-alive connection"
        started = time.monotonic()
        with pytest.raises(OSError) as refused, \
                socket.create_connection(("127.0.0.1", server.port), timeout=3) as raw, \
                trust.wrap_socket(raw, server_hostname="localhost"):
            pass
        assert time.monotonic() - started < 1, f"waited {time.monotonic() - started:.1f} s: {refused.value!r}"
        assert not isinstance(refused.value, TimeoutError)
        assert server.proc.wait(15) == 0
    finally:
        kept.close()
        server.stop()
