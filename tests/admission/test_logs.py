"""The log writer: whole lines, in writes a pipe keeps whole, held briefly, never failing a review."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.admission import logs
from webhook.admission.logs import JsonFormatter, JsonLineHandler, LineWriter


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    yield read_end, write_end
    for fd in (read_end, write_end):
        with contextlib.suppress(OSError):  # a test may have closed one
            os.close(fd)


def writes(fd: int) -> list[bytes]:
    """Everything readable now, one item per read (a pipe keeps the boundaries of atomic writes apart only by
    content, so the tests check whole lines rather than write boundaries where that matters)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return chunks
        if not chunk:
            return chunks
        chunks.append(chunk)


def line(i: int, size: int = 100) -> bytes:
    text = f"line {i} "
    return (text + "x" * (size - len(text) - 1)).encode() + b"\n"


@pytest.mark.parametrize(
    ("lines", "urgent_last", "expect_written"),
    [
        pytest.param(1, False, 0, id="one line is held"),
        pytest.param(40, False, 0, id="4000 bytes are held (under the batch)"),
        pytest.param(41, False, 40, id="the batch is written when the next line would overflow it"),
        pytest.param(3, True, 3, id="an urgent line is written at once with the lines before it"),
    ],
)
def test_batches_hold_whole_lines(pipe: tuple[int, int], lines: int, urgent_last: bool, expect_written: int) -> None:
    read_end, write_end = pipe
    writer = LineWriter(write_end, batch_bytes=4096, flush_seconds=60)
    for i in range(lines):
        writer.write(line(i), urgent=urgent_last and i == lines - 1)
    written = b"".join(writes(read_end))
    assert written == b"".join(line(i) for i in range(expect_written))
    writer.flush()
    rest = b"".join(writes(read_end))
    assert written + rest == b"".join(line(i) for i in range(lines)), "flush writes what was held, in order"


def test_no_write_is_larger_than_the_batch_unless_one_line_is(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []
    monkeypatch.setattr(logs.os, "write", lambda fd, data: sizes.append(len(data)) or len(data))
    writer = LineWriter(99, batch_bytes=1000, flush_seconds=60)
    for i in range(50):
        writer.write(line(i, size=90 + i))
    writer.write(line(99, size=3000))
    writer.flush()
    assert all(size <= 1000 for size in sizes[:-1])
    assert sizes[-1] == 3000  # a line longer than the batch goes out alone, whole
    assert sum(sizes) == sum(90 + i for i in range(50)) + 3000


def test_held_lines_are_written_within_the_flush_interval(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    writer = LineWriter(write_end, flush_seconds=0.05)
    writer.write(line(1))
    deadline = time.monotonic() + 5
    written = b""
    while not written and time.monotonic() < deadline:
        time.sleep(0.02)
        written = b"".join(writes(read_end))
    assert written == line(1)


def test_a_closed_descriptor_never_raises(pipe: tuple[int, int]) -> None:
    _, write_end = pipe
    writer = LineWriter(write_end, flush_seconds=60)
    os.close(write_end)
    writer.write(line(1))
    writer.write(line(2), urgent=True)  # EBADF: swallowed
    writer.flush()


def test_after_fork_starts_empty(pipe: tuple[int, int]) -> None:
    read_end, write_end = pipe
    writer = LineWriter(write_end, flush_seconds=60)
    writer.write(line(1))
    writer.after_fork()  # what the child of a fork gets: the parent's held lines are the parent's to write
    writer.flush()
    assert writes(read_end) == []


@pytest.mark.parametrize(("level", "written_at_once"), [(logging.INFO, False), (logging.WARNING, True),
                                                        (logging.ERROR, True)])
def test_handler_writes_warnings_at_once(pipe: tuple[int, int], level: int, written_at_once: bool) -> None:
    read_end, write_end = pipe
    handler = JsonLineHandler(LineWriter(write_end, flush_seconds=60))
    handler.setFormatter(JsonFormatter())
    record = logging.makeLogRecord({"name": "webhook.policy.rules", "levelno": level,
                                    "levelname": logging.getLevelName(level), "msg": "hello", "event": "e"})
    handler.emit(record)
    written = b"".join(writes(read_end))
    if not written_at_once:
        assert written == b""
        handler.writer.flush()
        written = b"".join(writes(read_end))
    parsed = json.loads(written)
    assert written.endswith(b"\n") and parsed["msg"] == "hello" and parsed["event"] == "e"


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "1970-01-01T00:00:00.000Z"),
    (1.9999, "1970-01-01T00:00:01.999Z"),
    (1796212849.123, "2026-12-02T12:00:49.123Z"),
])
def test_timestamp(seconds: float, text: str) -> None:
    assert logs.timestamp(seconds) == text
    assert logs.timestamp(seconds) == text  # the cached second gives the same text


@given(st.floats(min_value=0, max_value=4e9))
def test_timestamp_agrees_with_datetime(seconds: float) -> None:
    expected = dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert logs.timestamp(seconds) == expected
