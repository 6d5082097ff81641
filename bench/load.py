"""Load benchmark: the webhook against floor servers on the same stack, in one run.

Three gunicorn masters with the same workers, threads, TLS context hook and keep-alive (the floors are
started through `webhook.admission.gunicorn_conf.WebhookServer` too):
  webhook          `gpu-webhook serve` (Flask, parse, engine, patch, metrics, one log line per review)
  Flask floor      a Flask app that reads the body and answers a constant allow: the webhook's stack
  bare WSGI floor  the same without Flask: the cost of gunicorn + TLS alone
Clients keep their TLS connections alive, as kube-apiserver does; each request carries a fresh uid.

1. Closed loop: client processes send reviews back to back; the servers are measured in alternating
   rounds and the median round is kept (the machine is shared); prints requests/s, the servers' CPU time
   per request (their worker processes' utime + stime) and the ratios (target: webhook >= 0.80 x floor).
2. Open loop: a fixed rate (500 reviews/s by default) scheduled in advance; latency is measured from each
   request's scheduled time (a stall is not hidden by sending less): p50/p99/p99.9 (target p99 < 5 ms).
3. With --quiet-webhook, a second webhook at log level WARNING (no line per review) takes part in the same
   alternating rounds: what the INFO review line costs, measured in one run. With --baseline DIR, a webhook
   run from another checkout (`git worktree add DIR REV`) does: what a change gains, measured in one run.
4. With --references, two more webhooks take part (bench/variants.py): one answering every review from its
   first answer (the stack without the engine) and one answering every review twice (what one more answer()
   costs right after the first).
5. With --inside, the servers run under `bench/probe.py`, and the closed loop also prints the thread CPU time
   per request of their stages inside the workers (gthread's handling, the WSGI call, the webhook's answer()).

    python bench/load.py                      # defaults: realistic GPU Pod review, 2 workers x 4 threads
    python bench/load.py --duration 10 --rate 500 --rounds 5
    python bench/load.py --inside             # and where each server's CPU goes, stage by stage
    python bench/load.py --quiet-webhook      # and the webhook without its INFO line per review, same rounds
    python bench/load.py --baseline ../before # and the webhook of another checkout, same rounds
    python bench/load.py --references         # and the webhook without its engine, and with it twice
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import multiprocessing
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_REVIEW = REPO / "tests" / "data" / "admission-reviews" / "pod-create-from-replicaset-gpu.json"
UID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"
NAMES = ("bare", "floor", "webhook")
QUIET = "webhook-quiet"  # with --quiet-webhook: the webhook at log level WARNING (no line per review)
BASELINE = "webhook-baseline"  # with --baseline DIR: the webhook of the checkout in DIR
ONCE = "webhook-once"  # with --references: every review answered from the first answer (bench/variants.py)
TWICE = "webhook-twice"  # with --references: every review answered twice
LABELS = {"bare": "bare WSGI floor", "floor": "Flask floor", "webhook": "webhook", QUIET: "webhook, WARNING",
          BASELINE: "webhook, baseline", ONCE: "webhook, answer once", TWICE: "webhook, answer x2"}
WIDTH = max(map(len, LABELS.values()))  # of the first column
FLOOR_BODY = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": {"uid": UID_PLACEHOLDER, "allowed": True}}).encode()


class Webhook(NamedTuple):
    """One webhook server of a run.

    `name` is its key in LABELS, `checkout` the tree it runs from, `variant` its bench/variants.py variant
    ("": the webhook as it is).
    """

    name: str
    level: str
    checkout: Path
    variant: str = ""


# --- the floor server ----------------------------------------------------------------------------


def floor_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Read the body, answer a constant allow: the cost of the stack without the webhook."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    environ["wsgi.input"].read(length)
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(FLOOR_BODY)))])
    return [FLOOR_BODY]


def flask_floor_app() -> Callable[..., Any]:
    """The same framework as the webhook, answering a constant allow: the cost of the stack in Flask."""
    from flask import Flask, Response, request

    app = Flask("floor")

    @app.post("/")
    def allow() -> Response:
        request.get_data(cache=False)
        return Response(FLOOR_BODY, mimetype="application/json")

    return app


def serve_floor(args: argparse.Namespace) -> int:
    from webhook.admission import metrics
    from webhook.admission.gunicorn_conf import WebhookServer
    from webhook.admission.settings import Settings
    from webhook.admission.tls import ServingTls

    settings = Settings(tls_dir=Path(args.tls_dir), host="127.0.0.1", port=args.port, metrics_host="127.0.0.1",
                        metrics_port=args.metrics_port, workers=args.workers, threads=args.threads,
                        log_level="WARNING")
    metrics_dir = Path(tempfile.mkdtemp(prefix="bench-floor-metrics-"))
    metrics.enable_multiprocess(metrics_dir)
    assert settings.tls_dir is not None
    tls = ServingTls(settings.tls_dir)
    factory = flask_floor_app if args.serve_floor == "flask" else (lambda: floor_app)
    WebhookServer(settings, factory, tls, metrics_dir).run()
    return 0


# --- a minimal keep-alive HTTPS/1.1 client -------------------------------------------------------


class Connection:
    """One TLS connection, requests sent one after the other (no pipelining), as the API server does."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")

    def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            rest += chunk
        return int(head[9:12]), rest

    def close(self) -> None:
        self.sock.close()


def build_request(template: bytes, path: str) -> Callable[[], bytes]:
    """A function returning the full HTTP request with a fresh uid each time."""
    head = (f"POST {path}?timeout=10s HTTP/1.1\r\nHost: gpu-webhook.gpu-system.svc:443\r\n"
            f"Content-Type: application/json\r\nAccept: application/json, */*\r\n"
            f"User-Agent: kube-apiserver-admission\r\nContent-Length: {len(template)}\r\n\r\n").encode()
    whole = head + template
    placeholder = UID_PLACEHOLDER.encode()

    def make() -> bytes:
        return whole.replace(placeholder, str(uuid.uuid4()).encode(), 1)

    return make


def client_context(cafile: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context


# --- closed loop ---------------------------------------------------------------------------------


def closed_loop_process(port: int, cafile: str, template: bytes, path: str, connections: int,
                        start_at: float, duration: float, queue: Any) -> None:
    make = build_request(template, path)
    context = client_context(cafile)
    counts = [0] * connections
    errors: list[str] = []

    def run(index: int) -> None:
        conn = Connection(port, context)
        try:
            conn.roundtrip(make())  # warm: handshake before the clock starts
            while time.time() < start_at:
                time.sleep(0.001)
            end = start_at + duration
            while time.time() < end:
                status, _ = conn.roundtrip(make())
                if status != 200:
                    errors.append(str(status))
                counts[index] += 1
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            conn.close()

    fan_out(connections, run)
    queue.put((sum(counts), errors))


def fan_out(connections: int, run: Callable[[int], None]) -> None:
    """Run `run(i)` for each connection index in its own thread, and wait for all of them."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def closed_loop(port: int, cafile: str, template: bytes, path: str, processes: int, connections: int,
                duration: float) -> float:
    """Requests per second over `processes` x `connections` keep-alive connections."""
    queue: Any = multiprocessing.Queue()
    start_at = time.time() + 0.5
    procs = [multiprocessing.Process(target=closed_loop_process,
                                     args=(port, cafile, template, path, connections, start_at, duration, queue))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    results: list[tuple[int, list[str]]] = [queue.get(timeout=duration + 60) for _ in procs]
    for proc in procs:
        proc.join()
    errors = [e for _, errs in results for e in errs]
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[:3]}")
    return sum(count for count, _ in results) / duration


# --- open loop -----------------------------------------------------------------------------------


def open_loop(port: int, cafile: str, template: bytes, path: str, rate: float, duration: float,
              connections: int) -> list[float]:
    """Latencies (s) of requests scheduled at a fixed rate, measured from their scheduled time."""
    make = build_request(template, path)
    context = client_context(cafile)
    total = int(rate * duration)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    conns = []
    for _ in range(connections):  # a request right after each handshake, as the API server does
        conns.append(Connection(port, context))
        conns[-1].roundtrip(make())
    start = time.perf_counter() + 0.2

    def run(index: int) -> None:
        conn = conns[index]
        mine: list[float] = []
        try:
            for i in range(index, total, connections):
                due = start + i / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                status, _ = conn.roundtrip(make())
                mine.append(time.perf_counter() - due)
                if status != 200:
                    errors.append(str(status))
        except Exception as exc:  # a dropped or stalled connection is a failure, never a missing sample
            errors.append(repr(exc))
        finally:
            with lock:
                latencies.extend(mine)

    fan_out(connections, run)
    for conn in conns:
        conn.close()
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. {errors[:3]}")
    return sorted(latencies)


def workers_cpu_seconds(master: int) -> float | None:
    """User + system CPU seconds used so far by a gunicorn master's worker processes (Linux /proc; None elsewhere).

    Per request, it shows what the server spends apart from the clients, which share the same cores.
    """
    try:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        total = 0
        for pid in children:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def inside(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]) -> str:
    """`request handling 400 µs > WSGI call and response 300 µs > answer() 100 µs; garbage collector 3.0 µs`:
    per request handled, from two `probe.totals` readings."""
    labels = {"handle": "request handling", "handle_request": "WSGI call and response", "answer": "answer()"}
    requests = after.get("handle", (0, 0.0))[0] - before.get("handle", (0, 0.0))[0]
    if requests <= 0:
        return "no samples"

    def per_request(key: str) -> float:
        return (after.get(key, (0, 0.0))[1] - before.get(key, (0, 0.0))[1]) / requests * 1e6

    parts = [f"{label} {per_request(key):4.0f} µs" for key, label in labels.items() if key in after]
    return " > ".join(parts) + f"; garbage collector {per_request('gc'):.1f} µs"


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, math.ceil(q / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


# --- orchestration -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, cafile: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            Connection(port, client_context(cafile)).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def spawn(command: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd)


def issue_certs(directory: Path, key_type: str = "ecdsa") -> Path:
    """A CA and a serving certificate (`ecdsa` P-256 or `rsa` 2048) in `directory`; returns ca.crt."""
    from webhook.admission import certs

    now = dt.datetime.now(dt.UTC)
    kind: Any = key_type
    ca = certs.new_ca("bench-ca", now, key=certs.new_key(kind))
    leaf = certs.new_serving_cert(ca, ["localhost", "gpu-webhook.gpu-system.svc"], now, key=certs.new_key(kind),
                                  ip_addresses=["127.0.0.1"])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(leaf.cert_pem())
    (directory / "tls.key").write_bytes(leaf.key_pem())
    (directory / "ca.crt").write_bytes(ca.cert_pem())
    return directory / "ca.crt"


def positive(text: str) -> float:
    """An argparse type: a number above zero."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--review", type=Path, default=DEFAULT_REVIEW, help="AdmissionReview to send")
    parser.add_argument("--path", default="/mutate", help="webhook endpoint (default /mutate)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--duration", type=positive, default=4.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternating closed-loop rounds per server")
    parser.add_argument("--processes", type=int, default=2, help="closed-loop client processes")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections per client process")
    parser.add_argument("--rate", type=positive, default=500.0, help="open-loop reviews per second (> 0)")
    parser.add_argument("--open-connections", type=int, default=8, help="open-loop connections")
    parser.add_argument("--log-level", default="INFO", help="webhook log level (INFO: one line per review)")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="also run the webhook of the checkout in DIR in the same rounds")
    parser.add_argument("--quiet-webhook", action="store_true",
                        help="also run the webhook at log level WARNING in the same rounds")
    parser.add_argument("--references", action="store_true",
                        help="also run the webhook answering every review once and twice (bench/variants.py)")
    parser.add_argument("--inside", action="store_true",
                        help="also measure thread CPU per request inside the workers, by stage (bench/probe.py)")
    parser.add_argument("--serve-floor", choices=("flask", "wsgi"), help=argparse.SUPPRESS)
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_floor:
        return serve_floor(args)

    document = json.loads(args.review.read_text())
    document["request"]["uid"] = UID_PLACEHOLDER
    template = json.dumps(document).encode()
    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-bench-"))
    cafile = str(issue_certs(work / "tls"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_WEBHOOK_", "PROMETHEUS_"))}
    env["PYTHONPATH"] = str(REPO)
    common = ["--workers", str(args.workers), "--threads", str(args.threads)]
    webhooks = [Webhook("webhook", args.log_level, REPO)]
    if args.quiet_webhook:
        webhooks.append(Webhook(QUIET, "WARNING", REPO))
    if args.baseline:
        webhooks.append(Webhook(BASELINE, args.log_level, args.baseline.resolve()))
    if args.references:
        webhooks += [Webhook(ONCE, args.log_level, REPO, "once"), Webhook(TWICE, args.log_level, REPO, "twice")]
    names = (*NAMES, *(w.name for w in webhooks[1:]))
    ports = {name: free_port() for name in names}
    probe_dirs = {name: work / f"probe-{name}" for name in names}

    def endpoint(name: str) -> str:
        """Where server `name` is called: the webhooks at --path, the floors at /."""
        return args.path if any(w.name == name for w in webhooks) else "/"

    def python(name: str, target: str, *target_args: str) -> list[str]:
        """The command line start of server `name`: `target` is a module name or a script path (then its args)."""
        if args.inside:
            return [sys.executable, str(REPO / "bench" / "probe.py"), str(probe_dirs[name]), target, *target_args]
        start = [sys.executable, target] if target.endswith(".py") else [sys.executable, "-m", target]
        return [*start, *target_args]

    servers = {}
    for name, level, checkout, variant in webhooks:
        target = ["webhook.cli.server"]
        if variant:
            target = [str(REPO / "bench" / "variants.py"), variant, *target]
        servers[name] = spawn(
            [*python(name, *target), "serve", "--tls-dir", str(work / "tls"),
             "--host", "127.0.0.1", "--port", str(ports[name]), "--metrics-host", "127.0.0.1",
             "--metrics-port", str(free_port()), "--log-level", level, *common],
            work / f"{name}.log", {**env, "PYTHONPATH": str(checkout)}, cwd=checkout)  # `-m` looks in cwd first
    for name, kind in (("floor", "flask"), ("bare", "wsgi")):
        servers[name] = spawn(
            [*python(name, str(Path(__file__).resolve())), "--serve-floor", kind, "--tls-dir", str(work / "tls"),
             "--port", str(ports[name]), "--metrics-port", str(free_port()), *common],
            work / f"{name}.log", env)
    try:
        for name, proc in servers.items():
            wait_ready(ports[name], cafile, proc)
        status, answer = Connection(ports["webhook"], client_context(cafile)).roundtrip(
            build_request(template, args.path)())
        response = json.loads(answer)["response"]
        print(f"review: {args.review.name} -> {args.path}: HTTP {status}, allowed={response['allowed']}, "
              f"patch={'yes' if 'patch' in response else 'no'}; body {len(template)} bytes")
        print(f"stack: gunicorn gthread {args.workers} workers x {args.threads} threads, TLS (ECDSA P-256), "
              f"keep-alive; cpus={os.cpu_count()}; webhook log level {args.log_level}")
        print("floors: 'Flask floor' = Flask app answering a constant allow (the webhook's stack);"
              " 'bare WSGI floor' = no framework")

        if args.inside:
            from probe import totals

            time.sleep(1)  # the probes write twice a second
            inside_before = {name: totals(probe_dirs[name]) for name in names}
        rps: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}  # server CPU seconds per request
        for _ in range(args.rounds):
            for name in names:
                path = endpoint(name)
                before = workers_cpu_seconds(servers[name].pid)
                rate = closed_loop(ports[name], cafile, template, path, args.processes, args.connections,
                                   args.duration)
                rps[name].append(rate)
                if before is not None and (after := workers_cpu_seconds(servers[name].pid)) is not None:
                    cpu[name].append((after - before) / (rate * args.duration))
        median = {name: statistics.median(values) for name, values in rps.items()}  # robust to a noisy round
        conns = args.processes * args.connections
        print(f"\nclosed loop, {conns} keep-alive connections, {args.rounds} alternating rounds x "
              f"{args.duration:g} s each (median of rounds):")
        for name in names:
            rounds = ", ".join(f"{r:.0f}" for r in rps[name])
            per_request = f"{statistics.median(cpu[name]) * 1e6:5.0f} µs" if cpu[name] else "  n/a"
            print(f"  {LABELS[name]:<{WIDTH}} {median[name]:8.0f} req/s   server CPU {per_request} per request   "
                  f"(rounds: {rounds})")
        print(f"  ratio webhook / Flask floor     = {median['webhook'] / median['floor']:.2f}   (target >= 0.80)")
        paired = statistics.median(w / f for w, f in zip(rps["webhook"], rps["floor"], strict=True))
        print(f"  the same, median of each round's ratio = {paired:.2f}   (the two run seconds apart: "
              "less moved by the host's drift)")
        print(f"  ratio webhook / bare WSGI floor = {median['webhook'] / median['bare']:.2f}")
        if BASELINE in median:
            paired = statistics.median(w / b for w, b in zip(rps["webhook"], rps[BASELINE], strict=True))
            print(f"  webhook / baseline webhook      = {median['webhook'] / median[BASELINE]:.2f}   "
                  f"(median of each round's ratio {paired:.2f})")
        if QUIET in median:
            print(f"  ratio webhook at WARNING / Flask floor = {median[QUIET] / median['floor']:.2f}   (the INFO line "
                  f"per review costs {(median[QUIET] - median['webhook']) / median['floor']:.2f} of the floor)")
        if args.references:
            print(f"  ratio webhook answering from its first answer / Flask floor = "
                  f"{median[ONCE] / median['floor']:.2f}   (the stack without the engine)")
            print(f"  ratio webhook answering twice / webhook = {median[TWICE] / median['webhook']:.2f}   (one more "
                  "answer() per review)")
            for name in (ONCE, TWICE):
                if cpu[name] and cpu["webhook"]:
                    extra = (statistics.median(cpu[name]) - statistics.median(cpu["webhook"])) * 1e6
                    print(f"  {LABELS[name]}: server CPU {extra:+.0f} µs per request against the webhook")
        if args.inside:
            time.sleep(1)
            print("\ninside the workers, thread CPU per request over all closed-loop rounds (bench/probe.py):")
            for name in names:
                print(f"  {LABELS[name]:<{WIDTH}} {inside(inside_before[name], totals(probe_dirs[name]))}")

        print(f"\nopen loop, {args.rate:g} reviews/s for {args.duration:g} s over {args.open_connections} "
              f"connections (latency from the scheduled send time):")
        p99 = {}
        for name in names:
            lat = open_loop(ports[name], cafile, template, endpoint(name), args.rate, args.duration,
                            args.open_connections)
            p99[name] = percentile(lat, 99) * 1000
            print(f"  {LABELS[name]:<{WIDTH}} n={len(lat)}  p50 {percentile(lat, 50) * 1000:.2f} ms  "
                  f"p99 {p99[name]:.2f} ms  p99.9 {percentile(lat, 99.9) * 1000:.2f} ms  "
                  f"max {lat[-1] * 1000:.2f} ms")
        print(f"  webhook p99 {p99['webhook']:.2f} ms (target < 5 ms)")
    finally:
        for proc in servers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in servers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
