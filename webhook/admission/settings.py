"""Server settings: one frozen value, and the one place environment variables are read.

Tests and the CLI build `Settings` directly (or `dataclasses.replace` it with command-line overrides);
`Settings.from_env` is the only reader of `GPU_WEBHOOK_*` variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVELS: tuple[LogLevel, ...] = ("DEBUG", "INFO", "WARNING", "ERROR")

ENV_PREFIX = "GPU_WEBHOOK_"


class SettingsError(ValueError):
    """An environment variable or option with an unusable value; str() names it."""


# The smallest usable value of each numeric setting, checked however the value arrived (environment or option).
MINIMUMS: dict[str, int] = {"port": 0, "metrics_port": 0, "workers": 1, "threads": 1, "max_body_bytes": 1024,
                            "rules_poll_seconds": 0, "shutdown_delay_seconds": 0, "shutdown_quiet_seconds": 0,
                            "shutdown_delay_max_seconds": 0}


@dataclass(frozen=True)
class Settings:
    """Everything the server needs to know, with the production defaults."""

    rules_dir: Path | None = None  # None: the rules packaged with the webhook
    tls_dir: Path | None = None  # cert-manager Secret layout: tls.crt, tls.key, ca.crt
    client_ca: Path | None = None  # verify client certificates against this CA (mTLS)
    host: str = "0.0.0.0"
    port: int = 8443
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9090
    workers: int = 1  # one process: a second buys a second core, not a shorter review, and doubles the RSS
    threads: int = 8
    max_body_bytes: int = 8 * 1024 * 1024  # an UPDATE carries object and oldObject, each up to ~1.5 MiB
    log_level: LogLevel = "INFO"
    keepalive_seconds: int = 120  # longer than the API server's 90 s idle-connection timeout
    graceful_timeout_seconds: int = 20
    # After SIGTERM: serve on, every answer saying `Connection: close`, before the graceful stop (shutdown.py):
    # at least the delay, then until no review has come for the quiet time, at most the delay's maximum (or the
    # delay, when that is longer).
    shutdown_delay_seconds: float = 10.0
    shutdown_quiet_seconds: float = 3.0
    shutdown_delay_max_seconds: float = 30.0
    rules_poll_seconds: float = 2.0  # 0: no hot reload
    cluster: bool = False  # watch nodes, namespaces, runtime classes for the inventory checks

    def __post_init__(self) -> None:
        for name, minimum in MINIMUMS.items():
            value = getattr(self, name)
            if value < minimum:
                raise SettingsError(f"--{name.replace('_', '-')}={value!r} ({ENV_PREFIX}{name.upper()}): must be "
                                    f"at least {minimum}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from `GPU_WEBHOOK_*` variables (defaults for the unset ones); raises SettingsError."""
        env = os.environ if environ is None else environ
        defaults = cls()

        def text(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name, "").strip()
            return value or None

        def path(name: str) -> Path | None:
            value = text(name)
            return Path(value) if value else None

        def integer(name: str, default: int, minimum: int) -> int:
            value = text(name)
            if value is None:
                return default
            try:
                number = int(value)
            except ValueError:
                raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: expected an integer") from None
            if number < minimum:
                raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: must be at least {minimum}")
            return number

        def number(name: str, default: float) -> float:
            value = text(name)
            if value is None:
                return default
            try:
                result = float(value)
            except ValueError:
                raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: expected a number of seconds") from None
            if result < 0:
                raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: must not be negative")
            return result

        def boolean(name: str, default: bool) -> bool:
            value = text(name)
            if value is None:
                return default
            if value.lower() in ("true", "1", "yes", "on"):
                return True
            if value.lower() in ("false", "0", "no", "off"):
                return False
            raise SettingsError(f"{ENV_PREFIX}{name}={value!r}: expected true or false")

        return cls(
            rules_dir=path("RULES"),
            tls_dir=path("TLS_DIR"),
            client_ca=path("CLIENT_CA"),
            host=text("HOST") or defaults.host,
            port=integer("PORT", defaults.port, MINIMUMS["port"]),
            metrics_host=text("METRICS_HOST") or defaults.metrics_host,
            metrics_port=integer("METRICS_PORT", defaults.metrics_port, MINIMUMS["metrics_port"]),
            workers=integer("WORKERS", defaults.workers, MINIMUMS["workers"]),
            threads=integer("THREADS", defaults.threads, MINIMUMS["threads"]),
            max_body_bytes=integer("MAX_BODY_BYTES", defaults.max_body_bytes, MINIMUMS["max_body_bytes"]),
            log_level=log_level(text("LOG_LEVEL") or defaults.log_level),
            rules_poll_seconds=number("RULES_POLL_SECONDS", defaults.rules_poll_seconds),
            shutdown_delay_seconds=number("SHUTDOWN_DELAY_SECONDS", defaults.shutdown_delay_seconds),
            shutdown_quiet_seconds=number("SHUTDOWN_QUIET_SECONDS", defaults.shutdown_quiet_seconds),
            shutdown_delay_max_seconds=number("SHUTDOWN_DELAY_MAX_SECONDS", defaults.shutdown_delay_max_seconds),
            cluster=boolean("CLUSTER", defaults.cluster),
        )


def log_level(value: str) -> LogLevel:
    """Validate a log level name (case-insensitive)."""
    upper = value.upper()
    for level in LOG_LEVELS:
        if level == upper:
            return level
    raise SettingsError(f"{ENV_PREFIX}LOG_LEVEL={value!r}: expected one of {', '.join(LOG_LEVELS)}")
