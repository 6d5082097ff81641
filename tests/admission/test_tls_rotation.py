"""ServingTls: the context of new handshakes follows rotation, reads pairs from one `..data` target, keeps
the last good pair, and enforces TLS >= 1.2 and optional client certificates. Real handshakes over socket
pairs; the end-to-end rotation through gunicorn is in test_gunicorn_e2e.py.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
from pathlib import Path

import pytest
from support.admission import Pki, client_cert, client_context, kubelet_write, peer_serial

from webhook.admission import certs
from webhook.admission.tls import Loaded, ServingTls, TlsError, source_dir


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str = "localhost") -> int:
    """Complete one TLS handshake between the two contexts; the serial the client saw."""
    left, right = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server.wrap_socket(right, server_side=True) as tls:
                tls.recv(1)
                tls.sendall(b"y")  # the client waits for this: it never closes while we still write
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(left, server_hostname=hostname) as tls:
            serial = peer_serial(tls)
            tls.sendall(b"x")
            tls.recv(1)
    finally:
        left.close()
        thread.join(5)
        right.close()
    if errors:
        raise errors[0]
    return serial


@pytest.fixture(scope="module")
def pki() -> Pki:
    return Pki("ecdsa")


def test_context_is_cached_until_the_files_change(tmp_path: Path, pki: Pki) -> None:
    kubelet_write(tmp_path, pki.secret())
    tls = ServingTls(tmp_path)
    first = tls.context()
    assert tls.context() is first
    kubelet_write(tmp_path, pki.secret())
    assert tls.context() is not first


def test_kubelet_rotation_is_seen_by_the_next_handshake(tmp_path: Path, pki: Pki) -> None:
    old, new = pki.leaf(), pki.leaf()
    kubelet_write(tmp_path, pki.secret(old))
    seen: list[Loaded] = []
    tls = ServingTls(tmp_path, on_load=seen.append)
    client = client_context(pki.ca)
    assert handshake(tls.context(), client) == old.cert.serial_number
    target = kubelet_write(tmp_path, pki.secret(new))
    assert source_dir(tmp_path) == target.resolve()
    assert handshake(tls.context(), client) == new.cert.serial_number
    assert [loaded.serial for loaded in seen] == [old.cert.serial_number, new.cert.serial_number]
    assert seen[-1].not_after == new.cert.not_valid_after_utc


def test_rotation_to_a_new_ca(tmp_path: Path, pki: Pki) -> None:
    kubelet_write(tmp_path, pki.secret())
    tls = ServingTls(tmp_path)
    tls.context()
    other = Pki("ecdsa")
    leaf = other.leaf()
    kubelet_write(tmp_path, other.secret(leaf))
    assert handshake(tls.context(), client_context(pki.ca, other.ca)) == leaf.cert.serial_number


def _mismatched(pki: Pki) -> dict[str, bytes]:
    files = pki.secret()
    files["tls.key"] = pki.secret()["tls.key"]
    return files


@pytest.mark.parametrize(
    "bad_files",
    [
        pytest.param(_mismatched, id="key-of-another-cert"),
        pytest.param(lambda pki: {"tls.crt": pki.secret()["tls.crt"]}, id="key-missing"),
        pytest.param(lambda pki: {"tls.crt": b"garbage", "tls.key": b"garbage"}, id="not-pem"),
        pytest.param(lambda pki: {"tls.crt": b"", "tls.key": b""}, id="empty"),
    ],
)
def test_bad_material_keeps_the_last_good_pair(tmp_path: Path, pki: Pki, bad_files: object,
                                               caplog: pytest.LogCaptureFixture) -> None:
    good = pki.leaf()
    kubelet_write(tmp_path, pki.secret(good))
    failures: list[str] = []
    tls = ServingTls(tmp_path, on_failure=failures.append)
    good_context = tls.context()
    # a new ..data target without a usable pair (the kubelet layout's links may dangle: key-missing)
    assert callable(bad_files)
    kubelet_write(tmp_path, bad_files(pki))
    with caplog.at_level(logging.ERROR, logger="webhook.admission.tls"):
        assert tls.context() is good_context
        assert tls.context() is good_context  # logged and counted once per bad state, not per handshake
    assert handshake(tls.context(), client_context(pki.ca)) == good.cert.serial_number
    assert tls.failures == 1 and len(failures) == 1
    assert [r.__dict__.get("event") for r in caplog.records] == ["tls-load-failed"]
    fixed = pki.leaf()
    kubelet_write(tmp_path, pki.secret(fixed))
    assert handshake(tls.context(), client_context(pki.ca)) == fixed.cert.serial_number


@pytest.mark.parametrize("loaded_before", [False, True], ids=["first load", "a reload"])
def test_a_load_racing_a_rotation_reads_the_new_target(tmp_path: Path, pki: Pki, loaded_before: bool,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The kubelet deletes the old `..data` target right after the swap: a load that resolved the old target
    just before finds its files gone. That is a rotation, not bad material: read the new target, no error."""
    old, new = pki.leaf(), pki.leaf()
    kubelet_write(tmp_path, pki.secret(old))
    tls = ServingTls(tmp_path)
    if loaded_before:
        tls.context()
        kubelet_write(tmp_path, pki.secret(pki.leaf()))  # a change to notice
    stale = tls.signature()  # resolved now ...
    kubelet_write(tmp_path, pki.secret(new))  # ... then swapped, and the old target deleted
    assert not Path(stale[0]).exists()
    answers = iter([stale])
    real = tls.signature
    monkeypatch.setattr(tls, "signature", lambda: next(answers, None) or real())
    with caplog.at_level(logging.ERROR, logger="webhook.admission.tls"):
        assert handshake(tls.context(), client_context(pki.ca)) == new.cert.serial_number
    assert tls.failures == 0 and not caplog.records


def test_nothing_usable_at_all_raises(tmp_path: Path) -> None:
    with pytest.raises(TlsError, match="no usable"):
        ServingTls(tmp_path).context()


def test_plain_directory_rewrites_are_followed(tmp_path: Path, pki: Pki) -> None:
    first, second = pki.leaf(), pki.leaf()
    for name, content in pki.secret(first).items():
        (tmp_path / name).write_bytes(content)
    tls = ServingTls(tmp_path)
    assert handshake(tls.context(), client_context(pki.ca)) == first.cert.serial_number
    for name, content in pki.secret(second).items():  # replaced by rename, as `cp`/editors/cert tools do
        (tmp_path / f".{name}.new").write_bytes(content)
        os.replace(tmp_path / f".{name}.new", tmp_path / name)
    assert handshake(tls.context(), client_context(pki.ca)) == second.cert.serial_number


def test_half_written_plain_directory_is_never_served(tmp_path: Path, pki: Pki) -> None:
    first, second = pki.leaf(), pki.leaf()
    for name, content in pki.secret(first).items():
        (tmp_path / name).write_bytes(content)
    tls = ServingTls(tmp_path)
    tls.context()
    (tmp_path / "tls.crt").write_bytes(second.cert_pem())  # the key has not been written yet
    assert handshake(tls.context(), client_context(pki.ca)) == first.cert.serial_number
    (tmp_path / "tls.key").write_bytes(second.key_pem())
    assert handshake(tls.context(), client_context(pki.ca)) == second.cert.serial_number


@pytest.mark.parametrize("key_type", ["ecdsa", "rsa"])
def test_ecdsa_and_rsa(tmp_path: Path, key_type: certs.KeyType) -> None:
    pki = Pki(key_type)
    leaf = pki.leaf()
    kubelet_write(tmp_path, pki.secret(leaf))
    assert handshake(ServingTls(tmp_path).context(), client_context(pki.ca), "127.0.0.1") == leaf.cert.serial_number


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_1_1_is_refused(tmp_path: Path, pki: Pki) -> None:
    kubelet_write(tmp_path, pki.secret())
    context = ServingTls(tmp_path).context()
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    old_client = client_context(pki.ca)
    old_client.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old_client.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((ssl.SSLError, OSError)):
        handshake(context, old_client)


def test_alpn_is_http_1_1(tmp_path: Path, pki: Pki) -> None:
    kubelet_write(tmp_path, pki.secret())
    server = ServingTls(tmp_path).context()
    client = client_context(pki.ca)
    client.set_alpn_protocols(["http/1.1"])  # what kube-apiserver offers
    left, right = socket.socketpair()
    result: list[str | None] = []

    def serve() -> None:
        with server.wrap_socket(right, server_side=True) as tls:
            result.append(tls.selected_alpn_protocol())
            tls.recv(1)

    thread = threading.Thread(target=serve)
    thread.start()
    with client.wrap_socket(left, server_hostname="localhost") as tls:
        tls.sendall(b"x")
    thread.join(5)
    assert result == ["http/1.1"]


def test_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    kubelet_write(tmp_path / "tls", pki.secret())
    clients = Pki("ecdsa")
    (tmp_path / "client-ca.crt").write_bytes(clients.ca.cert_pem())
    server = ServingTls(tmp_path / "tls", client_ca=tmp_path / "client-ca.crt").context()
    apiserver = client_cert(clients.ca)
    stranger = client_cert(Pki("ecdsa").ca)
    assert handshake(server, client_context(pki.ca, client=apiserver, tmp=tmp_path))
    for client in (client_context(pki.ca), client_context(pki.ca, client=stranger, tmp=tmp_path)):
        with pytest.raises((ssl.SSLError, OSError)):
            # TLS 1.3 reports a refused client certificate on the first read after the handshake
            handshake(server, client)
            handshake(server, client)


def test_concurrent_handshakes_during_rotations_never_fail(tmp_path: Path, pki: Pki) -> None:
    leaves = [pki.leaf() for _ in range(4)]
    kubelet_write(tmp_path, pki.secret(leaves[0]))
    tls = ServingTls(tmp_path)
    client = client_context(pki.ca)
    # Loaded once before the clients start, as the server does at startup: otherwise a first load racing the
    # first rotation (its directory deleted mid-read) leaves nothing to serve yet.
    assert handshake(tls.context(), client) == leaves[0].cert.serial_number
    serials = {leaf.cert.serial_number for leaf in leaves}
    seen: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def connect() -> None:
        while not stop.is_set():
            try:
                seen.append(handshake(tls.context(), client))
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=connect) for _ in range(4)]
    for thread in threads:
        thread.start()
    for leaf in leaves[1:]:
        kubelet_write(tmp_path, pki.secret(leaf))
        stop.wait(0.15)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert not errors
    assert set(seen) <= serials
    assert handshake(tls.context(), client) == leaves[-1].cert.serial_number
