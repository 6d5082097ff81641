"""The `serve` and `certs` subcommands (`register(subparsers)`), and the certificate directory writer.

`gpu-webhook serve` becomes the gunicorn master (PID 1 friendly: SIGTERM moves clients away, then drains). With no
arguments it serves the packaged rules with a development CA and certificate under ./certs/.
`gpu-webhook certs` issues a CA (kept and reused) and a serving certificate in cert-manager's layout.
Both write certificate directories the way the kubelet projects a Secret: files in a fresh hidden
directory, then one atomic rename of the `..data` symlink, so a reader never sees a half-written pair.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from webhook.admission import certs

if TYPE_CHECKING:
    from webhook.admission.policy_store import PolicyStore
    from webhook.admission.settings import Settings
    from webhook.admission.tls import ServingTls

DEFAULT_SERVICE = "gpu-webhook"
DEFAULT_NAMESPACE = "gpu-system"
DEV_NAMES = ("localhost",)
DEV_IPS = ("127.0.0.1", "::1")
RENEW_LOOKAHEAD = dt.timedelta(days=30)
PRIVATE_FILES = frozenset({"tls.key", "ca.key"})


def register(subparsers: Any) -> None:
    """Add `serve` and `certs` to an argparse subparsers object (each sets `func`)."""
    serve = subparsers.add_parser(
        "serve",
        help="run the admission server (gunicorn, TLS)",
        description="Run the admission webhook under gunicorn over TLS. Options override GPU_WEBHOOK_* "
        "variables. Without --tls-dir a development CA and certificate are created under --dev-certs.",
    )
    serve.add_argument("--rules", type=Path, help="rules directory (default: the packaged rules)")
    serve.add_argument("--tls-dir", type=Path, help="directory with tls.crt and tls.key (cert-manager layout)")
    serve.add_argument("--client-ca", type=Path, help="require client certificates signed by this CA (mTLS)")
    serve.add_argument("--host", help="listen address (default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="HTTPS port (default 8443)")
    serve.add_argument("--metrics-host", help="listen address of the metrics port (default 0.0.0.0)")
    serve.add_argument("--metrics-port", type=int, help="plain-HTTP Prometheus port (default 9090)")
    serve.add_argument("--workers", type=int, help="gunicorn worker processes (default 1)")
    serve.add_argument("--threads", type=int, help="threads per worker (default 8)")
    serve.add_argument("--max-body-bytes", type=int, help="larger request bodies get HTTP 413")
    serve.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    serve.add_argument("--rules-poll-seconds", type=float, help="how often to look for rule changes (default 2)")
    serve.add_argument("--shutdown-delay-seconds", type=float,
                       help="after SIGTERM, serve on this long, closing each connection after its answer so "
                       "clients move to other endpoints, then stop gracefully (default 10; 0: stop at once)")
    serve.add_argument("--shutdown-quiet-seconds", type=float,
                       help="after the shutdown delay, serve on until no review has arrived for this long: a "
                            "client whose endpoints still list this server keeps sending (default 3)")
    serve.add_argument("--shutdown-delay-max-seconds", type=float,
                       help="the longest the shutdown delay lasts while reviews keep arriving (default 30)")
    serve.add_argument("--cluster", action="store_true", default=None,
                       help="watch nodes, namespaces and runtime classes for the inventory checks "
                            "(needs the cluster-awareness RBAC component; default: $GPU_WEBHOOK_CLUSTER, else off)")
    serve.add_argument("--dev-certs", type=Path, default=Path("certs"),
                       help="where development certificates go when --tls-dir is not given (default ./certs)")
    serve.set_defaults(func=run_serve)

    issue = subparsers.add_parser(
        "certs",
        help="issue a CA and a serving certificate for the webhook Service",
        description="Write ca.crt, ca.key, tls.crt, tls.key and ca-bundle.b64 to --out, atomically; an "
        "existing CA there is reused, so caBundle stays the same across re-issues.",
    )
    issue.add_argument("--service", default=DEFAULT_SERVICE, help=f"Service name (default {DEFAULT_SERVICE})")
    issue.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                       help=f"Service namespace (default {DEFAULT_NAMESPACE})")
    issue.add_argument("--out", type=Path, default=Path("certs"), help="output directory (default ./certs)")
    issue.add_argument("--key-type", choices=("ecdsa", "rsa"), default="ecdsa",
                       help="ecdsa (P-256, default) or rsa (2048)")
    issue.add_argument("--days", type=int, default=certs.SERVING_DAYS, help="serving certificate lifetime")
    issue.add_argument("--dns", action="append", default=[], help="extra DNS name (repeatable)")
    issue.add_argument("--ip", action="append", default=[], help="extra IP address (repeatable)")
    issue.set_defaults(func=run_certs)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m webhook.cli.server serve|certs ...` (the same commands as `gpu-webhook`)."""
    parser = argparse.ArgumentParser(prog="gpu-webhook")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


# --- certificate directories ---------------------------------------------------------------------


def write_atomically(out: Path, files: Mapping[str, bytes]) -> None:
    """Replace the files of `out` all at once, in the kubelet's layout (`name -> ..data/name`)."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    target = Path(tempfile.mkdtemp(prefix=stamp, dir=out))
    os.chmod(target, 0o755)
    for name, content in files.items():
        path = target / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if name in PRIVATE_FILES else 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
    data = out / "..data"
    old = os.path.realpath(data) if os.path.lexists(data) else None
    _replace_symlink(out / "..data_tmp", target.name, data)
    for name in files:
        link = out / name
        if not (link.is_symlink() and os.readlink(link) == f"..data/{name}"):
            _replace_symlink(out / f".{name}.tmp", f"..data/{name}", link)
    if old and Path(old).parent == out.resolve() and Path(old).name.startswith(".."):
        for leftover in Path(old).iterdir():
            leftover.unlink()
        Path(old).rmdir()


def _replace_symlink(tmp: Path, points_to: str, final: Path) -> None:
    if os.path.lexists(tmp):
        tmp.unlink()
    os.symlink(points_to, tmp)
    os.replace(tmp, final)


def _read_pair(directory: Path, cert_name: str, key_name: str) -> certs.Issued | None:
    try:
        return certs.load_pair((directory / cert_name).read_bytes(), (directory / key_name).read_bytes())
    except (OSError, ValueError):
        return None


def issue(out: Path, dns_names: Sequence[str], ip_addresses: Sequence[str], now: dt.datetime,
          key_type: certs.KeyType = "ecdsa", days: int = certs.SERVING_DAYS) -> certs.Issued:
    """Write a serving certificate (and a CA unless a usable one is in `out`); returns the CA."""
    ca = _read_pair(out, "ca.crt", "ca.key")
    if ca is None or certs.needs_renewal(ca.cert, now, dt.timedelta(days=days)):
        ca = certs.new_ca(f"{dns_names[0] if dns_names else 'gpu-webhook'}-ca", now, key=certs.new_key(key_type))
    leaf = certs.new_serving_cert(ca, dns_names, now, key=certs.new_key(key_type),
                                  ip_addresses=ip_addresses, days=days)
    bundle = certs.ca_bundle_b64(ca.cert_pem())
    write_atomically(out, {
        "ca.crt": ca.cert_pem(),
        "ca.key": ca.key_pem(),
        "tls.crt": leaf.cert_pem(),
        "tls.key": leaf.key_pem(),
        "ca-bundle.b64": (bundle + "\n").encode(),
    })
    return ca


def run_certs(args: argparse.Namespace) -> int:
    """`gpu-webhook certs`: issue, then print the caBundle."""
    names = [*certs.service_dns_names(args.service, args.namespace), *args.dns]
    try:
        ca = issue(args.out, names, args.ip, dt.datetime.now(dt.UTC), args.key_type, args.days)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}/ca.crt, tls.crt, tls.key (and ca.key, ca-bundle.b64) for {', '.join(names)}",
          file=sys.stderr)
    print("caBundle (base64 of ca.crt, also in ca-bundle.b64):", file=sys.stderr)
    print(certs.ca_bundle_b64(ca.cert_pem()))
    return 0


def ensure_dev_certs(out: Path, now: dt.datetime) -> bool:
    """Development certificates for the default Service plus localhost; True when (re)issued."""
    names = [*certs.service_dns_names(DEFAULT_SERVICE, DEFAULT_NAMESPACE), *DEV_NAMES]
    pair = _read_pair(out, "tls.crt", "tls.key")
    if pair and (out / "ca.crt").exists() and certs.covers(pair.cert, names, DEV_IPS) \
            and not certs.needs_renewal(pair.cert, now, RENEW_LOOKAHEAD):
        return False
    issue(out, names, DEV_IPS, now)
    return True


# --- serve ---------------------------------------------------------------------------------------


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the options given on the command line."""
    from webhook.admission.settings import Settings, log_level

    overrides: dict[str, Any] = {
        "rules_dir": args.rules, "tls_dir": args.tls_dir, "client_ca": args.client_ca, "host": args.host,
        "port": args.port, "metrics_host": args.metrics_host, "metrics_port": args.metrics_port,
        "rules_poll_seconds": args.rules_poll_seconds, "workers": args.workers,
        "shutdown_delay_seconds": getattr(args, "shutdown_delay_seconds", None),
        "shutdown_quiet_seconds": getattr(args, "shutdown_quiet_seconds", None),
        "shutdown_delay_max_seconds": getattr(args, "shutdown_delay_max_seconds", None),
        "threads": args.threads, "max_body_bytes": args.max_body_bytes,
        "log_level": log_level(args.log_level) if args.log_level else None,
        "cluster": getattr(args, "cluster", None),
    }
    return dataclasses.replace(Settings.from_env(), **{k: v for k, v in overrides.items() if v is not None})


def run_serve(args: argparse.Namespace) -> int:
    """`gpu-webhook serve`: check rules and TLS (fail fast), then run gunicorn in this process."""
    from webhook.admission import logs
    from webhook.admission.settings import SettingsError
    from webhook.policy.rules import RuleError

    try:
        settings = settings_from(args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level)
    if settings.tls_dir is None:
        try:
            fresh = ensure_dev_certs(args.dev_certs, dt.datetime.now(dt.UTC))
        except OSError as exc:
            print(f"error: cannot write development certificates to {args.dev_certs}: {exc}", file=sys.stderr)
            return 1
        settings = dataclasses.replace(settings, tls_dir=args.dev_certs)
        where = args.dev_certs
        print(f"{'created' if fresh else 'using'} development CA and certificate in {where}/ "
              f"(for {DEFAULT_SERVICE}.{DEFAULT_NAMESPACE}.svc, localhost, 127.0.0.1)\n"
              f"try:  curl --cacert {where}/ca.crt https://localhost:{settings.port}/healthz", flush=True)
    from webhook.admission.policy_store import PolicyStore
    from webhook.admission.tls import ServingTls, TlsError

    try:
        store = PolicyStore(settings.rules_dir)
    except (RuleError, OSError) as exc:
        print(f"error: invalid rules: {exc}", file=sys.stderr)
        return 1
    if settings.cluster:
        problem = _in_child(_check_credentials)  # each worker starts its own watches
        if problem:
            print(f"error: --cluster: {problem}", file=sys.stderr)
            return 1
    assert settings.tls_dir is not None
    tls = ServingTls(settings.tls_dir, settings.client_ca)
    try:
        tls.context()
    except TlsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return _run_gunicorn(settings, store, tls)


def _check_credentials() -> str | None:
    """The cluster credentials' problem, or None when an API client can be built from them."""
    from webhook.cluster import kube

    try:
        kube.inventory_from_env()
    except kube.KubeError as exc:
        return str(exc)
    return None


def _in_child(check: Callable[[], str | None]) -> str | None:
    """Run `check` in a forked child and return its answer, so that what it imports stays out of this process.

    The gunicorn master forks the workers from this process: the Kubernetes client the credential check needs
    (about 50 MiB resident once its API classes are built) would otherwise sit in the master for its whole life,
    though only the workers use it. A child that dies without answering is reported as such.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, exit without running the parent's atexit hooks
        code = 0
        try:
            os.close(read_end)
            answer = check()
            os.write(write_end, b"" if answer is None else answer.encode("utf-8", "replace"))
        except BaseException as exc:  # reported to the parent, which decides
            with contextlib.suppress(OSError):
                os.write(write_end, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    if answer:
        return answer
    if os.waitstatus_to_exitcode(status) != 0:
        return f"the credential check exited with status {os.waitstatus_to_exitcode(status)} without an answer"
    return None


def _run_gunicorn(settings: Settings, store: PolicyStore, tls: ServingTls) -> int:
    from webhook.admission import metrics
    from webhook.admission.gunicorn_conf import WebhookServer
    from webhook.admission.tls import SHM_DIR

    def app() -> Any:
        """The worker's app. Flask, the review path and the engine are imported here, after the fork: the master
        only forks and aggregates metrics, and RSS counts every page a process maps, shared or not."""
        from webhook.admission.app import create_app

        return create_app(settings, store=store, tls=tls)

    metrics_dir = Path(tempfile.mkdtemp(prefix="gpu-webhook-metrics-", dir=SHM_DIR))
    metrics.enable_multiprocess(metrics_dir)
    print(f"serving https://{settings.host}:{settings.port} (/mutate /validate /healthz /readyz), "
          f"metrics http://{settings.metrics_host}:{settings.metrics_port}/metrics, "
          f"rules {settings.rules_dir or 'packaged'} ({store.policy.digest})", flush=True)
    WebhookServer(settings, app, tls, metrics_dir).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
