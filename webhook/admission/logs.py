"""Structured logging: one JSON object per line on stderr, with the `extra=` fields of each record.

Fields whose names LogRecord reserves (`name`, `msg`...) go in `extra={"fields": {...}}`; they are merged
into the top level of the line. The per-review line takes a shorter path (`write_line`): the same JSON
shape without building a LogRecord (a third of the server's own time per review went to the logging machinery).

Every line goes through one `LineWriter` per process, which writes whole lines in batches of at most
PIPE_BUF bytes: a write(2) of that size to the container's stdout pipe is atomic, so the lines of several
workers never interleave, and a review no longer pays for a system call of its own (each write(2) also
lets go of the GIL, a hand-off between the worker's threads). What INFO logging still costs per review is
building and encoding the line (docs/performance.md). Lines are held at most `FLUSH_SECONDS`;
a warning or an error is written at once, with the lines before it; the rest is written at exit. A worker
killed outright (SIGKILL, OOM) loses at most the lines of its last `FLUSH_SECONDS`.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import select
import threading
import time
from collections.abc import Mapping
from typing import Any

import orjson

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
BATCH_BYTES = select.PIPE_BUF  # 4096 on Linux: the largest write a pipe keeps whole
FLUSH_SECONDS = 0.2


class LineWriter:
    """Whole lines to a file descriptor, gathered into writes of at most `batch_bytes` (see the module doc).

    Thread-safe, and fork-safe through `after_fork` (gunicorn forks its workers from a process that has
    already logged). Errors writing (a closed or full stderr) are swallowed: a log line never fails a review.
    """

    def __init__(self, fd: int, batch_bytes: int = BATCH_BYTES, flush_seconds: float = FLUSH_SECONDS) -> None:
        self.fd = fd
        self.batch_bytes = batch_bytes
        self.flush_seconds = flush_seconds
        self.after_fork()

    def after_fork(self) -> None:
        """A fresh lock and buffer, and no flusher thread yet (threads do not survive a fork)."""
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._flusher: threading.Thread | None = None

    def write(self, line: bytes, *, urgent: bool = False) -> None:
        """Queue one line (it ends with a newline); `urgent` writes it, and what came before it, now."""
        with self._lock:
            if self._buffer and len(self._buffer) + len(line) > self.batch_bytes:
                self._write_buffer()
            self._buffer += line
            if urgent or len(self._buffer) >= self.batch_bytes:
                self._write_buffer()
            elif self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_periodically, name="log-flusher", daemon=True)
                self._flusher.start()

    def flush(self) -> None:
        with self._lock:
            self._write_buffer()

    def _write_buffer(self) -> None:
        data = memoryview(bytes(self._buffer))
        self._buffer.clear()
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass

    def _flush_periodically(self) -> None:
        while True:
            time.sleep(self.flush_seconds)
            if self._buffer:
                self.flush()


STDERR = LineWriter(2)
os.register_at_fork(after_in_child=STDERR.after_fork)
atexit.register(STDERR.flush)


_second: tuple[float, str] = (-1.0, "")  # the last second formatted, and its text (swapped whole: thread-safe)
_MILLIS = tuple(f".{n:03d}Z" for n in range(1000))  # a timestamp's end by millisecond: no formatting per line


def timestamp(seconds: float) -> str:
    """UTC with milliseconds, `2026-12-02T12:00:49.123Z`; the date and time part is formatted once a second."""
    global _second
    fraction, whole = math.modf(seconds)  # floats throughout: int(seconds) builds an int to convert back
    micros = round(fraction * 1_000_000)  # as datetime.fromtimestamp rounds, then cut to milliseconds
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    cached_whole, prefix = _second
    if whole != cached_whole:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, prefix)
    return prefix + _MILLIS[micros // 1000]


class JsonLineHandler(logging.Handler):
    """A logging handler writing JsonFormatter lines through `STDERR`; WARNING and above are written at once."""

    def __init__(self, writer: LineWriter = STDERR) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record).encode() + b"\n"
        except Exception:
            self.handleError(record)
            return
        self.writer.write(line, urgent=record.levelno >= logging.WARNING)


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", ...extra}`; exceptions as one `exc` string."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key == "fields" and isinstance(value, dict):
                line.update(value)
            elif key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure(level: str) -> None:
    """Send the `webhook.*` loggers to stderr as JSON lines at `level` (idempotent)."""
    logger = logging.getLogger("webhook")
    logger.setLevel(level)
    logger.propagate = False
    for handler in list(logger.handlers):
        if getattr(handler, "_gpu_webhook", False):
            logger.removeHandler(handler)
    handler = JsonLineHandler()
    handler.setFormatter(JsonFormatter())
    handler._gpu_webhook = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def write_line(line: Mapping[str, Any]) -> None:
    """Write `line`, a whole record in JsonFormatter's shape (`ts`, `level`, `logger`, `msg` first), through `STDERR`:
    the per-review path builds it in one dict (`AdmissionServer._log`)."""
    STDERR.write(orjson.dumps(line, default=str, option=orjson.OPT_APPEND_NEWLINE))


def flush() -> None:
    """Write the lines held by `STDERR` now (gunicorn's worker_exit hook, tests)."""
    STDERR.flush()
