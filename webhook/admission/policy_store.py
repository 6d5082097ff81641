"""The rules being enforced, and their hot reload from a directory (a mounted ConfigMap or a plain folder).

Startup fails fast: the constructor loads the rules and raises `RuleError` when they are invalid. After that
a poller notices changes (the kubelet swaps the `..data` symlink; plain files change inode/mtime/size),
reloads, and on an invalid change logs the error (it names file and field), counts it, and keeps the last
good Policy serving. Readers never wait: `policy` is one attribute read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from webhook.admission.loader import load_policy, rule_files
from webhook.admission.metrics import Metrics
from webhook.admission.tls import source_dir
from webhook.policy.rules import Policy, RuleError

log = logging.getLogger("webhook.policy.rules")

Signature = tuple[str, tuple[tuple[str, int, int, int], ...]]
Loader = Callable[[Path | None], Policy]


def directory_signature(directory: Path) -> Signature:
    """What identifies the current content of a rules directory: the `..data` target and each rule file."""
    target = str(source_dir(directory))  # a mounted ConfigMap swaps `..data` as a mounted Secret does
    try:
        paths = rule_files(directory)  # exactly the files the loader reads
    except (RuleError, OSError):
        paths = []
    files = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        files.append((path.name, st.st_ino, st.st_mtime_ns, st.st_size))
    return (target, tuple(files))


class PolicyStore:
    """The last good Policy of a rules directory (None: the packaged rules, which never change)."""

    def __init__(self, rules_dir: Path | None, loader: Loader = load_policy) -> None:
        self.rules_dir = rules_dir
        self._loader = loader
        self._signature = directory_signature(rules_dir) if rules_dir else None
        self.policy: Policy = loader(rules_dir)  # fail fast: RuleError propagates
        self.metrics: Metrics | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> bool:
        """Reload if the directory changed; True when a new Policy was installed."""
        if self.rules_dir is None:
            return False
        for _ in range(3):  # a swap during the read gives a mixed view: read again
            before = directory_signature(self.rules_dir)
            if before == self._signature:
                return False
            try:
                policy: Policy | None = self._loader(self.rules_dir)
                error = None
            except (RuleError, OSError, UnicodeDecodeError) as exc:
                policy, error = None, str(exc)
            if directory_signature(self.rules_dir) == before:
                break
        self._signature = before
        if policy is None:
            self._failed(error or "unreadable rules")
            return False
        self._installed(policy)
        return True

    def _installed(self, policy: Policy) -> None:
        old, self.policy = self.policy, policy
        self.last_error = None
        log.info("rules reloaded", extra={"event": "rules-reloaded", "digest": policy.digest,
                                          "previous": old.digest, "dir": str(self.rules_dir)})
        if self.metrics is not None:
            self.metrics.rule_reloads.inc()
            self.metrics.rules_changed(old.digest, policy.digest)

    def _failed(self, error: str) -> None:
        self.last_error = error
        log.error("invalid rules refused, the last good rules keep serving",
                  extra={"event": "rules-reload-failed", "error": error, "digest": self.policy.digest,
                         "dir": str(self.rules_dir)})
        if self.metrics is not None:
            self.metrics.rule_reload_failures.inc()

    def start(self, interval: float) -> None:
        """Poll for changes every `interval` seconds in a daemon thread (call it in the serving process)."""
        if self.rules_dir is None or interval <= 0 or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, args=(interval,), name="rules-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _poll(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except Exception:  # the poller must outlive any surprise; the last good rules keep serving
                log.exception("rules poller error", extra={"event": "rules-poller-error"})
