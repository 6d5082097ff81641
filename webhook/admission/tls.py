"""Serving TLS that follows certificate rotation: the SSLContext every new handshake uses.

The directory is in cert-manager's Secret layout (`tls.crt`, `tls.key`, optional `ca.crt`). When the kubelet
projects it, the files are symlinks into `..data`, which points at a timestamped directory that is replaced by
an atomic rename on rotation. So:

* the pair is always read from one target: `realpath(<dir>/..data)` is resolved once and both files are read
  from it (a plain directory is read as is), then checked to match before use;
* the context is cached and rebuilt only when the target or a file's identity (inode, mtime, size) changes;
  a stat per new connection is the whole cost of following rotation;
* an unreadable or mismatched pair is logged once per bad state and the last good context keeps serving.
* files that vanish while being read because `..data` was swapped again (the kubelet deletes the old
  target) are a rotation, not a failure: the new target is read (up to three times) and nothing is logged.

TLS 1.2 is the minimum; client certificates are required and verified when a client CA file is configured.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from webhook.admission.certs import load_pair

log = logging.getLogger("webhook.admission.tls")

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
DATA_LINK = "..data"

# Memory-backed scratch space when the container has it (private key files, metrics, gunicorn heartbeats).
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

FileId = tuple[int, int, int] | None
Signature = tuple[str, FileId, FileId, FileId]


class TlsError(RuntimeError):
    """No usable certificate and key: nothing can be served."""


@dataclass(frozen=True)
class Loaded:
    """A context built from one certificate/key pair, and what was learnt from that pair."""

    context: ssl.SSLContext
    not_after: dt.datetime
    serial: int


def source_dir(tls_dir: Path) -> Path:
    """The directory to read from: the resolved `..data` target of a kubelet-projected volume (Secret or
    ConfigMap) when present, else `tls_dir` itself."""
    data = tls_dir / DATA_LINK
    if os.path.lexists(data):
        return Path(os.path.realpath(data))
    return tls_dir


def _file_id(path: Path) -> FileId:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def build_context(cert_pem: bytes, key_pem: bytes, client_ca: Path | None) -> ssl.SSLContext:
    """A server SSLContext (TLS >= 1.2, ALPN http/1.1) for a pair already checked to match."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_alpn_protocols(["http/1.1"])
    # load_cert_chain reads files only: hand it exactly the bytes that were checked, in a private file.
    fd, name = tempfile.mkstemp(prefix="gpu-webhook-tls-", suffix=".pem", dir=SHM_DIR)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(cert_pem.rstrip(b"\n") + b"\n" + key_pem)
        context.load_cert_chain(certfile=name)
    finally:
        os.unlink(name)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(client_ca))
    return context


class ServingTls:
    """The current serving context for a certificate directory; thread-safe, one per process."""

    def __init__(
        self,
        tls_dir: Path,
        client_ca: Path | None = None,
        on_load: Callable[[Loaded], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.tls_dir = tls_dir
        self.client_ca = client_ca
        self.on_load = on_load
        self.on_failure = on_failure
        self._lock = threading.Lock()
        self._loaded: Loaded | None = None
        self._signature: Signature | None = None  # of the last attempt, good or bad
        self.failures = 0
        self.last_error: str | None = None  # why the last load failed (None after a good one)

    def signature(self) -> Signature:
        """Where the pair is now and the identity of each file: a change means a reload."""
        src = source_dir(self.tls_dir)
        ca = _file_id(self.client_ca) if self.client_ca else None
        return (str(src), _file_id(src / CERT_FILE), _file_id(src / KEY_FILE), ca)

    def context(self) -> ssl.SSLContext:
        """The context for a new handshake; reloads after a rotation; raises TlsError if never loaded."""
        loaded = self.refresh()
        if loaded is None:
            raise TlsError(f"no usable {CERT_FILE}/{KEY_FILE} in {self.tls_dir}: {self.last_error}; write a "
                           f"matching PEM pair there (cert-manager's Secret layout), or create one with "
                           f"`gpu-webhook certs`")
        return loaded.context

    @property
    def current(self) -> Loaded | None:
        return self._loaded

    def refresh(self) -> Loaded | None:
        """Reload if the files changed since the last attempt; returns the last good material."""
        signature = self.signature()
        if signature == self._signature:
            return self._loaded
        with self._lock:  # handshakes racing a reload wait for it (a few ms) rather than get the old pair
            for attempt in range(3):
                if signature == self._signature:
                    break
                error = self._load(Path(signature[0]))
                self._signature = signature
                if error is None:
                    break
                now = self.signature()
                if now == signature or attempt == 2:  # still the same bad files: a real failure
                    self._failed(Path(signature[0]), error)
                    break
                signature = now  # swapped again while being read (the old target was deleted): read the new one
        return self._loaded

    def _failed(self, src: Path, error: str) -> None:
        self.failures += 1
        self.last_error = error
        message = ("unusable TLS material, keeping the last good pair" if self._loaded
                   else "unusable TLS material and no earlier pair to serve: fix tls.crt/tls.key")
        log.error(message, extra={"event": "tls-load-failed", "dir": str(src), "error": error,
                                  "keeping_serial": f"{self._loaded.serial:x}" if self._loaded else None})
        if self.on_failure is not None:
            self.on_failure(error)

    def _load(self, src: Path) -> str | None:
        """Load the pair in `src` and make it current; the error when it cannot be used (nothing changes then)."""
        try:
            cert_pem = (src / CERT_FILE).read_bytes()
            key_pem = (src / KEY_FILE).read_bytes()
            pair = load_pair(cert_pem, key_pem)
            context = build_context(cert_pem, key_pem, self.client_ca)
        except (OSError, ValueError, ssl.SSLError) as exc:
            return str(exc)
        loaded = Loaded(context, pair.cert.not_valid_after_utc, pair.cert.serial_number)
        previous, self._loaded = self._loaded, loaded
        self.last_error = None
        log.info(
            "serving certificate loaded",
            extra={
                "event": "tls-loaded",
                "dir": str(src),
                "serial": f"{loaded.serial:x}",
                "not_after": loaded.not_after.isoformat(),
                "rotated": previous is not None,
            },
        )
        if self.on_load is not None:
            self.on_load(loaded)
        return None
