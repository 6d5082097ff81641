"""End to end: real `gpu-webhook serve` processes (gunicorn gthread master + workers) over real TLS.

Keep-alive reuse, certificate rotation in the kubelet's layout while clients connect, graceful SIGTERM with
a review in flight, concurrent clients with distinct uids, metrics summed across workers (and written by a
worker as it exits), rules hot reload with an invalid edit refused, and `serve` with no arguments (packaged
rules, development certificates).
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.admission import (
    GPU_REVIEW,
    REPO,
    Pki,
    Server,
    body,
    client_context,
    kubelet_write,
    peer_serial,
    post,
    rules_files,
    start_server,
    wait_until,
    with_uid,
)

from webhook.admission.metrics import FLUSH_SECONDS


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, ssl.SSLContext, Path]]:
    """`serve` with no TLS or rules options, in an empty directory: packaged rules, dev certs in ./certs."""
    cwd = tmp_path_factory.mktemp("dev")
    server = start_server(cwd, cwd=cwd)
    try:
        context = ssl.create_default_context(cafile=str(cwd / "certs" / "ca.crt"))
        yield server, context, cwd
    finally:
        server.stop()


def test_serve_without_arguments_uses_dev_certs(dev_server: tuple[Server, ssl.SSLContext, Path]) -> None:
    server, context, cwd = dev_server
    log = server.log()
    assert f"curl --cacert certs/ca.crt https://localhost:{server.port}/healthz" in log
    assert (cwd / "certs" / "tls.key").exists()
    for host in ("localhost", "127.0.0.1"):  # the dev certificate is valid for both
        conn = http.client.HTTPSConnection(host, server.port, context=context, timeout=10)
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        conn.close()


def test_keep_alive_connection_is_reused(dev_server: tuple[Server, ssl.SSLContext, Path]) -> None:
    server, context, _ = dev_server
    conn = server.connection(context)
    try:
        conn.connect()
        first_sock = conn.sock
        local = first_sock.getsockname()
        for _ in range(20):
            document = with_uid(GPU_REVIEW)
            status, answer = post(conn, "/mutate?timeout=10s", document)
            assert status == 200 and answer["response"]["uid"] == document["request"]["uid"]
            assert conn.sock is first_sock  # http.client reconnects silently if the server closed it
        assert conn.sock.getsockname() == local
        assert conn.sock.version() in ("TLSv1.2", "TLSv1.3")
        time.sleep(3)  # longer than gunicorn's default 2 s keep-alive: ours is 120 s
        status, _ = post(conn, "/validate", with_uid(GPU_REVIEW))
        assert status == 200 and conn.sock is first_sock
    finally:
        conn.close()


def test_concurrent_clients_get_their_own_uids_and_metrics_add_up(
        dev_server: tuple[Server, ssl.SSLContext, Path]) -> None:
    server, context, _ = dev_server
    labels = {"endpoint": "mutate", "kind": "Pod", "decision": "patch"}
    time.sleep(FLUSH_SECONDS * 1.5)  # the reviews of earlier tests are written: workers tally for FLUSH_SECONDS
    before = server.metric("gpu_webhook_reviews_total", labels)
    clients, per_client = 8, 25

    def run(_: int) -> list[tuple[str, str]]:
        conn = server.connection(context)
        pairs = []
        try:
            for _ in range(per_client):
                uid = str(uuid.uuid4())
                status, answer = post(conn, "/mutate", with_uid(GPU_REVIEW, uid))
                assert status == 200
                pairs.append((uid, answer["response"]["uid"]))
        finally:
            conn.close()
        return pairs

    with ThreadPoolExecutor(clients) as pool:
        results = [pair for pairs in pool.map(run, range(clients)) for pair in pairs]
    assert len(results) == clients * per_client
    assert all(sent == got for sent, got in results)
    assert len({uid for uid, _ in results}) == len(results)
    # samples from both workers, summed by the master's plain-HTTP endpoint, within FLUSH_SECONDS
    assert wait_until(lambda: server.metric("gpu_webhook_reviews_total", labels) - before == clients * per_client,
                    timeout=FLUSH_SECONDS * 5)
    time.sleep(FLUSH_SECONDS * 1.5)
    assert server.metric("gpu_webhook_reviews_total", labels) - before == clients * per_client  # and no more
    assert server.metric("gpu_webhook_tls_cert_not_after_timestamp_seconds") > time.time()
    assert server.metric("gpu_webhook_review_duration_seconds_bucket", {"endpoint": "mutate", "le": "0.005"}) > 0


def test_malformed_and_oversized_bodies_over_the_wire(dev_server: tuple[Server, ssl.SSLContext, Path]) -> None:
    server, context, _ = dev_server
    conn = server.connection(context)
    try:
        status, answer = post(conn, "/mutate", b"{nope")
        assert status == 400 and answer["kind"] == "Status"
        conn.close()
        conn.request("POST", "/mutate", body=b"x" * (8 * 1024 * 1024 + 1),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 413
        assert response.getheader("Content-Type") == "application/json"
        assert json.loads(response.read())["code"] == 413
        conn.close()
        status, _ = post(conn, "/mutate", with_uid(GPU_REVIEW))  # still serving
        assert status == 200
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param(b"BLAH /mutate\r\n\r\n", 400, id="bad-request-line"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, id="bad-header"),
        pytest.param(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, id="uri-too-long"),
        pytest.param(b"GET /healthz HTTP/1.1\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431, id="too-many-headers"),
    ],
)
def test_protocol_errors_are_json_too(dev_server: tuple[Server, ssl.SSLContext, Path], raw: bytes,
                                      code: int) -> None:
    server, context, _ = dev_server
    with context.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10),
                             server_hostname="localhost") as tls:
        tls.sendall(raw)
        received = b""
        while chunk := tls.recv(65536):
            received += chunk
    head, _, answer = received.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {code} ".encode())
    assert b"Content-Type: application/json" in head
    assert json.loads(answer)["code"] == code


@pytest.mark.parametrize(
    ("rotations", "interval", "clients"),
    [pytest.param(2, 0.6, 3, id="two-rotations"),
     pytest.param(12, 0.4, 6, id="twelve-rotations", marks=pytest.mark.slow)],
)
def test_rotation_while_clients_connect(tmp_path: Path, rotations: int, interval: float, clients: int) -> None:
    """Rotate in the kubelet's layout (same CA, then a new CA last) under load: no failed call, and every
    handshake that starts after a swap sees the new certificate."""
    pki, next_pki = Pki("ecdsa"), Pki("ecdsa")
    leaves = [pki.leaf() for _ in range(rotations)] + [next_pki.leaf()]
    secrets = [pki.secret(leaf) for leaf in leaves[:-1]] + [next_pki.secret(leaves[-1])]
    tls_dir = tmp_path / "tls"
    kubelet_write(tls_dir, secrets[0])
    trust = client_context(pki.ca, next_pki.ca)  # a merged caBundle, as cainjector makes during CA rotation
    server = start_server(tmp_path, "--tls-dir", str(tls_dir), trust=trust)
    swaps: list[tuple[float, float]] = []  # (began, ended) of each ..data swap
    handshakes: list[tuple[float, float, int]] = []  # (connect started, answer received, serial seen)
    errors: list[str] = []
    stop = threading.Event()

    def new_connections() -> None:
        while not stop.is_set():
            started = time.monotonic()
            conn = server.connection(trust)
            try:
                document = with_uid(GPU_REVIEW)
                status, answer = post(conn, "/mutate", document)
                assert isinstance(conn.sock, ssl.SSLSocket)
                handshakes.append((started, time.monotonic(), peer_serial(conn.sock)))
                if status != 200 or answer["response"]["uid"] != document["request"]["uid"]:
                    errors.append(f"bad answer {status}")
            except Exception as exc:
                errors.append(repr(exc))
            finally:
                conn.close()

    def kept_alive() -> None:
        conn = server.connection(trust)
        try:
            while not stop.is_set():
                status, _ = post(conn, "/validate", with_uid(GPU_REVIEW))
                if status != 200:
                    errors.append(f"keep-alive {status}")
        except Exception as exc:
            errors.append("keep-alive " + repr(exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=new_connections) for _ in range(clients)]
    threads.append(threading.Thread(target=kept_alive))
    try:
        for thread in threads:
            thread.start()
        for files in secrets[1:]:
            time.sleep(interval)
            began = time.monotonic()
            kubelet_write(tls_dir, files)
            swaps.append((began, time.monotonic()))
        time.sleep(interval)
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
        server.stop()
    assert not errors, errors[:5]
    generation = {leaf.cert.serial_number: i for i, leaf in enumerate(leaves)}
    for started, finished, serial in handshakes:
        swapped_before = sum(1 for _, ended in swaps if ended < started)
        swapped_by_end = sum(1 for began, _ in swaps if began < finished)
        # a handshake that starts after a swap sees its certificate (or a newer one); never a future one
        assert swapped_before <= generation[serial] <= swapped_by_end
    assert {serial for _, _, serial in handshakes} == set(generation)


def test_bad_pair_keeps_the_last_good_one_serving(tmp_path: Path) -> None:
    pki = Pki("rsa")
    good = pki.leaf()
    tls_dir = tmp_path / "tls"
    kubelet_write(tls_dir, pki.secret(good))
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tls_dir), trust=trust)
    try:
        mismatched = pki.secret()
        mismatched["tls.key"] = pki.secret()["tls.key"]
        kubelet_write(tls_dir, mismatched)
        for _ in range(4):
            conn = server.connection(trust)
            status, _ = post(conn, "/mutate", with_uid(GPU_REVIEW))
            assert status == 200 and peer_serial(conn.sock) == good.cert.serial_number
            conn.close()
        assert server.metric("gpu_webhook_tls_reload_failures_total") >= 1
        assert "tls-load-failed" in server.log() and "does not match" in server.log()
        fixed = pki.leaf()
        kubelet_write(tls_dir, pki.secret(fixed))
        conn = server.connection(trust)
        post(conn, "/mutate", with_uid(GPU_REVIEW))
        assert peer_serial(conn.sock) == fixed.cert.serial_number
        conn.close()
    finally:
        server.stop()


def test_mutual_tls_end_to_end(tmp_path: Path) -> None:
    from support.admission import client_cert

    pki, clients = Pki("ecdsa"), Pki("ecdsa")
    kubelet_write(tmp_path / "tls", pki.secret())
    (tmp_path / "client-ca.crt").write_bytes(clients.ca.cert_pem())
    with_cert = client_context(pki.ca, client=client_cert(clients.ca), tmp=tmp_path)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), "--client-ca",
                          str(tmp_path / "client-ca.crt"), trust=with_cert)
    try:
        status, _ = post(server.connection(with_cert), "/mutate", with_uid(GPU_REVIEW))
        assert status == 200
        with pytest.raises((ssl.SSLError, OSError)):
            post(server.connection(client_context(pki.ca)), "/mutate", with_uid(GPU_REVIEW))
    finally:
        server.stop()


def test_sigterm_drains_in_flight_reviews(tmp_path: Path) -> None:
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), trust=trust, workers=1)
    try:
        document = with_uid(GPU_REVIEW)
        payload = body(document)
        raw = trust.wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=15),
                                server_hostname="localhost")
        head = (f"POST /mutate?timeout=10s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        raw.sendall(head + payload[: len(payload) // 2])
        time.sleep(0.5)  # the worker is now reading this request's body
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert server.proc.poll() is None  # still draining
        raw.sendall(payload[len(payload) // 2:])
        received = b""
        while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
            chunk = raw.recv(65536)
            if not chunk:
                break
            received += chunk
        raw.close()
        head_text, _, answer = received.partition(b"\r\n\r\n")
        assert head_text.startswith(b"HTTP/1.1 200")
        assert json.loads(answer)["response"]["uid"] == document["request"]["uid"]
        assert server.proc.wait(25) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        # The review's log line was held in the worker's batch and written as the worker exited.
        lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
        assert [line["decision"] for line in lines if line.get("uid") == document["request"]["uid"]] == ["patch"]
    finally:
        server.stop()


def exchange(conn: http.client.HTTPSConnection, method: str, path: str,
             document: dict[str, object] | None = None) -> tuple[int, str, dict[str, object]]:
    """One request: (status, the Connection header, the JSON answer)."""
    conn.request(method, path, body=body(document) if document else None,
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, response.getheader("Connection", ""), json.loads(response.read())


def test_sigterm_first_moves_kept_alive_clients_away(tmp_path: Path) -> None:
    """The shutdown delay (shutdown.py): after SIGTERM every answer, on a kept-alive connection or a new one, is
    served and says `Connection: close`; /readyz is 503; the server stops only after the delay."""
    delay = 3.0
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), trust=trust, shutdown_delay=delay)
    kept = [server.connection(trust) for _ in range(6)]
    try:
        for conn in kept:
            status, connection, _ = exchange(conn, "POST", "/mutate", with_uid(GPU_REVIEW))
            assert (status, connection) == (200, "keep-alive")
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        for conn in kept:  # the next review on each kept-alive connection: answered, then the connection closes
            document = with_uid(GPU_REVIEW)
            status, connection, answer = exchange(conn, "POST", "/validate", document)
            assert (status, connection) == (200, "close")
            assert answer["response"]["uid"] == document["request"]["uid"]  # type: ignore[index]
        fresh = server.connection(trust)  # a client that still dials this server is served, and told to go
        status, connection, answer = exchange(fresh, "POST", "/mutate", with_uid(GPU_REVIEW))
        assert (status, connection) == (200, "close") and answer["response"]["allowed"]  # type: ignore[index]
        status, _, ready = exchange(server.connection(trust), "GET", "/readyz")
        assert status == 503 and ready["checks"]["shutdown"] == {"draining": True}  # type: ignore[index]
        assert server.proc.poll() is None
        assert server.proc.wait(delay + 25) == 0
        # The master stops at its first tick (at most a second apart) after the delay.
        assert time.monotonic() - signalled >= delay - 0.1
        assert "answering with Connection: close for at least 3.0 s" in server.log()
    finally:
        for conn in kept:
            conn.close()
        server.stop()


def test_a_second_sigterm_stops_without_waiting_out_the_delay(tmp_path: Path) -> None:
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), trust=client_context(pki.ca),
                          shutdown_delay=60)
    try:
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert server.proc.poll() is None
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(25) == 0
        assert time.monotonic() - signalled < 30
    finally:
        server.stop()


def worker_pids(server: Server) -> set[int]:
    pid = server.proc.pid
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads gunicorn's workers from Linux /proc")
def test_review_counts_are_written_when_a_worker_exits(tmp_path: Path) -> None:
    """Workers tally review counts for FLUSH_SECONDS; a worker that exits (SIGHUP restarts them all) writes what
    it holds first, so the master's /metrics loses none of them. The reviews and the restart come within a
    fraction of FLUSH_SECONDS, so the periodic write has usually not run."""
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), trust=trust)
    labels = {"endpoint": "mutate", "kind": "Pod", "decision": "patch"}
    try:
        old = worker_pids(server)
        conn = server.connection(trust)
        try:
            for _ in range(20):
                assert post(conn, "/mutate", with_uid(GPU_REVIEW))[0] == 200
        finally:
            conn.close()
        server.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: not old & worker_pids(server) and len(worker_pids(server)) == 2)
        assert server.metric("gpu_webhook_reviews_total", labels) == 20
        assert server.metric("gpu_webhook_review_duration_seconds_count", {"endpoint": "mutate"}) == 20
    finally:
        server.stop()


def test_log_lines_of_several_workers_through_a_pipe_are_whole_and_complete(tmp_path: Path) -> None:
    """As in a container (stdout is a pipe): 3 workers x 4 threads log one line per review, in batched writes
    no larger than PIPE_BUF, so no two lines ever interleave; SIGTERM writes what was still held."""
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), trust=trust, workers=3, pipe=True)
    sent: list[str] = []
    failures: list[str] = []

    def client() -> None:
        conn = server.connection(trust)
        try:
            for _ in range(60):
                document = with_uid(GPU_REVIEW)
                status, _ = post(conn, "/mutate", document)
                sent.append(document["request"]["uid"])
                if status != 200:
                    failures.append(str(status))
        finally:
            conn.close()

    try:
        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        assert server.stop() == 0
    assert not failures and len(sent) == 480
    logged = []
    for line in server.log().splitlines():
        if '"event"' in line:
            record = json.loads(line)  # a line cut or mixed with another would not parse
            if record["event"] == "review":
                logged.append(record["uid"])
    assert sorted(logged) == sorted(sent)


def test_rules_hot_reload_refuses_an_invalid_edit(tmp_path: Path) -> None:
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    rules = tmp_path / "rules"
    kubelet_write(rules, rules_files("t4-default"))
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), "--rules", str(rules),
                          "--rules-poll-seconds", "0.2", trust=trust)

    def gpu_type() -> str:
        conn = server.connection(trust)
        try:
            _, answer = post(conn, "/mutate", with_uid(GPU_REVIEW))
        finally:
            conn.close()
        patch = json.loads(base64.b64decode(answer["response"]["patch"]))
        [selector] = [op["value"] for op in patch if op["path"] == "/spec/nodeSelector"]
        return str(selector["gpu-type"])

    try:
        assert gpu_type() == "t4"
        kubelet_write(rules, rules_files("invalid"))
        assert wait_until(lambda: server.metric("gpu_webhook_rules_reload_failures_total") >= 2)
        assert all(gpu_type() == "t4" for _ in range(6))  # both workers keep the last good rules
        assert "rules-reload-failed" in server.log() and "maxGPUsPerPod" in server.log()
        kubelet_write(rules, rules_files("a100-default"))
        assert wait_until(lambda: all(gpu_type() == "a100" for _ in range(6)))
    finally:
        server.stop()


def test_startup_with_invalid_rules_fails_fast(tmp_path: Path) -> None:
    kubelet_write(tmp_path / "rules", rules_files("invalid"))
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli.server", "serve", "--rules", str(tmp_path / "rules"),
         "--port", "0", "--dev-certs", str(tmp_path / "certs")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "gpu-policy.yaml" in result.stderr and "maxGPUsPerPod" in result.stderr
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_sigterm_under_load_never_breaks_a_started_review(tmp_path: Path) -> None:
    """Many clients on keep-alive connections when SIGTERM arrives: every review that got an answer got a
    complete, correct one; afterwards connections are refused, never reset mid-answer."""
    pki = Pki()
    kubelet_write(tmp_path / "tls", pki.secret())
    trust = client_context(pki.ca)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), trust=trust)
    answered: list[bool] = []
    broken: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            conn = server.connection(trust, timeout=30)
            try:
                while not stop.is_set():
                    document = with_uid(GPU_REVIEW)
                    status, answer = post(conn, "/mutate", document)
                    answered.append(status == 200 and answer["response"]["uid"] == document["request"]["uid"])
            except (ConnectionRefusedError, ConnectionResetError, ssl.SSLEOFError, BrokenPipeError):
                pass  # refused or closed between requests: the API server would open a new connection
            except http.client.RemoteDisconnected:
                pass  # the server closed an idle kept-alive connection while draining
            except Exception as exc:
                broken.append(repr(exc))
            finally:
                conn.close()
            if server.proc.poll() is not None:
                return

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0
    stop.set()
    for thread in threads:
        thread.join(30)
    assert answered and all(answered)
    assert not broken, broken[:3]
