"""The e2e harness's processes and the small pieces every part of it shares.

`spawn` starts a process in its own session with its log in a directory; `Proc.stop` ends its whole group (SIGTERM,
then SIGKILL). Every started process is also stopped by `atexit` and, should the test process die first, killed by
the kernel (PR_SET_PDEATHSIG), so none outlives the session.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LOOPBACK = "127.0.0.1"
GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
WEBHOOK_NAMESPACE = "gpu-system"

Json = dict[str, Any]


class ClusterError(RuntimeError):
    """The control plane could not be built or started; str() says which part and ends with its log tail."""


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll `predicate` until it returns a truthy value (returned); raises TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # polled: an error now may be success later
            last_error = exc
        if time.monotonic() > deadline:
            suffix = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{suffix}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Proc:
    """One started process (its own process group) and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the process's log."""
        try:
            return tail(self.log.read_text(errors="replace"), lines)
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after `timeout`."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        # The group may outlive its leader (gunicorn workers): always sweep it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)


_LIVE: list[Proc] = []


def _reap_all() -> None:
    for proc in list(reversed(_LIVE)):
        proc.stop(timeout=3)


atexit.register(_reap_all)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, even by SIGKILL (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(name: str, argv: Sequence[str], logdir: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> Proc:
    """Start `argv` in a new session (so its whole group can be killed), output appended to logdir/name.log.

    Teardown stops the group; should the test process die before that, the child gets SIGKILL from the kernel.
    """
    log = logdir / f"{name}.log"
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        popen = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env=dict(env) if env is not None else None,
                                 cwd=str(cwd) if cwd else None,
                                 preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    proc = Proc(name, popen, log)
    _LIVE.append(proc)
    return proc


def insecure_tls() -> ssl.SSLContext:
    """For the health ports of the controller-manager and scheduler (self-signed, loopback only)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def signal_group(proc: Proc, sig: signal.Signals) -> None:
    """Send a signal to a started process's whole group (SIGSTOP/SIGCONT to freeze and thaw it)."""
    os.killpg(proc.popen.pid, sig)


def yaml_of(*docs: Json) -> str:
    """Objects as multi-document YAML (what a user would apply)."""
    return yaml.safe_dump_all(list(docs), sort_keys=False)
