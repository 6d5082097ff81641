"""Thread CPU time inside a gunicorn worker, by stage: for `bench/load.py --inside`. Not a test.

    python bench/probe.py DIR MODULE [ARGS...]    # `python -m MODULE ARGS...` with the probe in its workers
    python bench/probe.py DIR SCRIPT.py [ARGS...] # the same for `python SCRIPT.py ARGS...`

In every process forked from it (the gunicorn workers) the probe wraps three calls with `time.thread_time()`
and adds up count and seconds per call, written to `DIR/PID.json` twice a second:

    handle          gthread's handling of one request on a connection: TLS read, HTTP parse, the request
    handle_request  the WSGI call (Flask) and writing the response
    answer          `AdmissionServer.answer` (the webhook only): parse, engine, patch, response, metrics, log
    gc              the garbage collector's passes, wherever they run (through `gc.callbacks`)

Thread CPU time counts what the thread itself ran, in the process and in the kernel, not time spent waiting
for the GIL or a core: it shows where a server's CPU goes per request when it shares the machine.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_totals: dict[str, list[float]] = {}
_lock = threading.Lock()


def _add(name: str, spent: float) -> None:
    with _lock:
        total = _totals.setdefault(name, [0, 0.0])
        total[0] += 1
        total[1] += spent


def _timed(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            _add(name, time.thread_time() - started)

    return wrapper


_gc_started = threading.local()
_gc_total = [0, 0.0]  # apart from _totals and its lock: a pass can start inside any allocation, even under it


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started.at = time.thread_time()
    elif hasattr(_gc_started, "at"):
        _gc_total[0] += 1
        _gc_total[1] += time.thread_time() - _gc_started.at


def _install(directory: Path) -> None:
    from gunicorn.workers.gthread import ThreadWorker

    gc.callbacks.append(_on_gc)

    ThreadWorker.handle = _timed("handle", ThreadWorker.handle)
    ThreadWorker.handle_request = _timed("handle_request", ThreadWorker.handle_request)
    try:
        from webhook.admission.app import AdmissionServer
    except ImportError:
        pass
    else:
        AdmissionServer.answer = _timed("answer", AdmissionServer.answer)  # type: ignore[method-assign]

    def write() -> None:
        while True:
            time.sleep(0.5)
            with _lock:
                text = json.dumps({**_totals, "gc": _gc_total})
            (directory / f"{os.getpid()}.json").write_text(text)

    threading.Thread(target=write, name="bench-probe", daemon=True).start()


def totals(directory: Path) -> dict[str, tuple[int, float]]:
    """The sums over every worker that wrote to `directory`: call name -> (count, seconds)."""
    out: dict[str, tuple[int, float]] = {}
    for path in directory.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for name, (count, seconds) in data.items():
            have = out.get(name, (0, 0.0))
            out[name] = (have[0] + int(count), have[1] + float(seconds))
    return out


def main(argv: list[str]) -> int:
    directory, module, *rest = argv
    Path(directory).mkdir(parents=True, exist_ok=True)
    os.register_at_fork(after_in_child=lambda: _install(Path(directory)))
    sys.argv = [module, *rest]
    if module.endswith(".py"):
        sys.path.insert(0, str(Path(module).resolve().parent))
        runpy.run_path(module, run_name="__main__")
    else:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
