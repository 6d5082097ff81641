"""The benchmark matrix of issue 5: realistic reviews, worker classes, key types, fixed-rate latency.

Every comparison runs its servers side by side in the same run, on the same stack (gunicorn, the webhook's
TLS context hook, 2 workers x 4 threads unless said otherwise), measured in alternating rounds; the median
round is kept (the machine is shared) and the spread of the rounds is printed. Clients run on the same
2-core machine, so absolute numbers include their cost; ratios are what carry over.

Sections (all by default; pick with --only):
  reviews   closed-loop keep-alive throughput of /mutate and /validate for a 1-container GPU Pod, a ~10 KB
            multi-container Pod and a Deployment, against the Flask floor and the bare WSGI floor of
            bench/load.py (ratio target: webhook >= 0.80 x Flask floor)
  openloop  fixed rate (500 reviews/s), open loop, p50/p99/p99.9 per review kind, webhook and floor
            (target: p99 < 5 ms)
  workers   gthread (keep-alive) vs gthread (new connection per review) vs sync (which closes every
            connection, so each review pays a handshake): throughput and latency, webhook and floor
  keys      RSA-2048 vs ECDSA P-256 serving certificates: handshakes/s, and review latency when every
            review opens a new connection

    python bench/matrix.py
    python bench/matrix.py --only reviews,openloop --duration 3 --rounds 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import load

SECTIONS = ("reviews", "openloop", "workers", "keys")


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.0f}, range {min(values):.0f}-{max(values):.0f}"


def ms(sorted_latencies: list[float], q: float) -> float:
    return load.percentile(sorted_latencies, q) * 1000


# --- clients that open a new connection per review (or per handshake) ----------------------------


def _new_conn_process(port: int, cafile: str, template: bytes, path: str, threads: int, start_at: float,
                      duration: float, send: bool, queue: Any) -> None:
    make = load.build_request(template, path)
    context = load.client_context(cafile)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def run() -> None:
        mine: list[float] = []
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + duration
        while time.time() < end:
            began = time.perf_counter()
            try:
                conn = load.Connection(port, context)  # TCP connect + TLS handshake
                try:
                    if send:
                        status, _ = conn.roundtrip(make())
                        if status != 200:
                            errors.append(str(status))
                finally:
                    conn.close()
            except Exception as exc:
                errors.append(repr(exc))
                continue
            mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    queue.put((latencies, errors[:10]))


def new_connections(port: int, cafile: str, template: bytes, path: str, duration: float, *, send: bool,
                    processes: int = 2, threads: int = 2) -> tuple[float, list[float]]:
    """(operations/s, sorted latencies) of back-to-back new connections (each with one review if `send`)."""
    queue: Any = multiprocessing.Queue()
    start_at = time.time() + 0.3
    procs = [multiprocessing.Process(target=_new_conn_process,
                                     args=(port, cafile, template, path, threads, start_at, duration, send, queue))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=duration + 60) for _ in procs]
    for proc in procs:
        proc.join(30)
    errors = [e for _, errs in results for e in errs]
    if errors:
        raise RuntimeError(f"{len(errors)} failed connections, e.g. {errors[:3]}")
    latencies = sorted(x for lat, _ in results for x in lat)
    return len(latencies) / duration, latencies


# --- sections ----------------------------------------------------------------------------------------


def section_reviews(args: argparse.Namespace, work: Path) -> None:
    tls = work / "ecdsa"
    servers = {"webhook": common.start("webhook", "webhook", tls, log_level=args.log_level),
               "floor": common.start("floor", "flask", tls), "bare": common.start("bare", "wsgi", tls)}
    try:
        print(f"\n== reviews: closed loop, {args.processes} x {args.connections} keep-alive connections, "
              f"{args.rounds} alternating rounds x {args.duration:g} s; req/s")
        print(f"{'review':<12}{'bytes':>7}  {'webhook /mutate':>22}  {'webhook /validate':>22}  "
              f"{'Flask floor':>22}  {'bare floor':>22}  ratio m/floor  v/floor  m/bare")
        for case, make in common.CASES.items():
            template = common.template_of(make())
            runs: dict[str, list[float]] = {k: [] for k in ("mutate", "validate", "floor", "bare")}
            for _ in range(args.rounds):
                for key in runs:
                    server = servers["webhook" if key in ("mutate", "validate") else key]
                    path = f"/{key}" if key in ("mutate", "validate") else "/"
                    runs[key].append(load.closed_loop(server.port, server.cafile, template, path, args.processes,
                                                      args.connections, args.duration))
            med = {k: statistics.median(v) for k, v in runs.items()}
            print(f"{case:<12}{len(template):>7}  " + "  ".join(f"{spread(runs[k]):>22}" for k in runs)
                  + f"  {med['mutate'] / med['floor']:13.2f}  {med['validate'] / med['floor']:7.2f}"
                  f"  {med['mutate'] / med['bare']:6.2f}", flush=True)
    finally:
        for server in servers.values():
            server.stop()


def section_openloop(args: argparse.Namespace, work: Path) -> None:
    tls = work / "ecdsa"
    servers = {"webhook": common.start("webhook", "webhook", tls, log_level=args.log_level),
               "floor": common.start("floor", "flask", tls)}
    try:
        print(f"\n== open loop: {args.rate:g} reviews/s for {args.open_duration:g} s over {args.open_connections} "
              f"keep-alive connections, latency from the scheduled send time, x{args.rounds} runs (ms)")
        for case, make in common.CASES.items():
            template = common.template_of(make())
            path = "/validate" if case == "deployment" else "/mutate"
            for name, server in servers.items():
                rows = []
                for _ in range(args.rounds):
                    lat = load.open_loop(server.port, server.cafile, template, path if name == "webhook" else "/",
                                         args.rate, args.open_duration, args.open_connections)
                    rows.append((ms(lat, 50), ms(lat, 99), ms(lat, 99.9), lat[-1] * 1000, len(lat)))
                label = f"{case} {path if name == 'webhook' else '(Flask floor)'}"
                cells = "  |  ".join(f"p50 {a:5.2f} p99 {b:6.2f} p99.9 {c:6.2f} max {d:6.1f}" for a, b, c, d, _ in rows)
                print(f"  {label:<26} n={rows[0][4]}  {cells}", flush=True)
    finally:
        for server in servers.values():
            server.stop()


def section_workers(args: argparse.Namespace, work: Path) -> None:
    tls = work / "ecdsa"
    template = common.template_of(common.gpu_pod_review())
    configs: list[tuple[str, str, str, bool]] = [  # label, kind, worker class, keep-alive client
        ("webhook gthread keep-alive", "webhook", "gthread", True),
        ("webhook gthread new conn", "webhook", "gthread", False),
        ("webhook sync", "webhook", "sync", False),
        ("Flask floor gthread keep-alive", "flask", "gthread", True),
        ("Flask floor sync", "flask", "sync", False),
    ]
    servers: dict[tuple[str, str], common.Running] = {}
    try:
        for _, kind, worker_class, _ in configs:
            if (kind, worker_class) not in servers:
                servers[(kind, worker_class)] = common.start(f"{kind}-{worker_class}", kind, tls,
                                                             worker_class=worker_class, log_level=args.log_level)
        print(f"\n== worker classes: 2 workers (gthread: x 4 threads), GPU Pod /mutate, {args.rounds} rounds x "
              f"{args.duration:g} s; closed loop (keep-alive: {args.processes} x {args.connections} connections; "
              f"new conn: 2 x 2 client threads)")
        results: dict[str, list[tuple[float, float, float]]] = {label: [] for label, *_ in configs}
        for _ in range(args.rounds):
            for label, kind, worker_class, keep in configs:
                server = servers[(kind, worker_class)]
                path = "/mutate" if kind == "webhook" else "/"
                if keep:
                    rps = load.closed_loop(server.port, server.cafile, template, path, args.processes,
                                           args.connections, args.duration)
                    results[label].append((rps, float("nan"), float("nan")))
                else:
                    rps, lat = new_connections(server.port, server.cafile, template, path, args.duration, send=True)
                    results[label].append((rps, ms(lat, 50), ms(lat, 99)))
        for label, rows in results.items():
            rates = [r for r, _, _ in rows]
            lat = "" if rows[0][1] != rows[0][1] else (
                "  latency/review p50 " + "/".join(f"{p:.1f}" for _, p, _ in rows)
                + " ms, p99 " + "/".join(f"{p:.1f}" for _, _, p in rows) + " ms")
            print(f"  {label:<32} {spread(rates)} req/s{lat}")
    finally:
        for server in servers.values():
            server.stop()


def section_keys(args: argparse.Namespace, work: Path) -> None:
    template = common.template_of(common.gpu_pod_review())
    servers = {kind: common.start(f"webhook-{kind}", "webhook", work / kind, log_level=args.log_level)
               for kind in ("ecdsa", "rsa")}
    try:
        version = common.tls_version(servers["ecdsa"].cafile, servers["ecdsa"].port)
        print(f"\n== serving key: webhook, 2 x 2 client threads opening connections back to back, "
              f"{args.rounds} rounds x {args.duration:g} s (TLS {version})")
        hs: dict[str, list[float]] = {k: [] for k in servers}
        req: dict[str, list[tuple[float, float, float]]] = {k: [] for k in servers}
        for _ in range(args.rounds):
            for kind, server in servers.items():
                rate, _ = new_connections(server.port, server.cafile, template, "/mutate", args.duration, send=False)
                hs[kind].append(rate)
                rate, lat = new_connections(server.port, server.cafile, template, "/mutate", args.duration, send=True)
                req[kind].append((rate, ms(lat, 50), ms(lat, 99)))
        for kind in servers:
            label = "ECDSA P-256" if kind == "ecdsa" else "RSA-2048"
            print(f"  {label:<12} handshakes/s {spread(hs[kind])};  new connection + review: "
                  f"{spread([r for r, _, _ in req[kind]])} req/s, p50 "
                  + "/".join(f"{p:.2f}" for _, p, _ in req[kind]) + " ms, p99 "
                  + "/".join(f"{p:.2f}" for _, _, p in req[kind]) + " ms")
        ratio = statistics.median(hs["ecdsa"]) / statistics.median(hs["rsa"])
        print(f"  handshakes/s ECDSA / RSA = {ratio:.2f}")
    finally:
        for server in servers.values():
            server.stop()


RUNNERS: dict[str, Callable[[argparse.Namespace, Path], None]] = {
    "reviews": section_reviews, "openloop": section_openloop, "workers": section_workers, "keys": section_keys,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--duration", type=load.positive, default=3.0, help="seconds per closed-loop measurement")
    parser.add_argument("--rounds", type=load.positive_int, default=3, help="alternating rounds (open loop: runs)")
    parser.add_argument("--processes", type=int, default=2, help="closed-loop client processes")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections per client process")
    parser.add_argument("--rate", type=load.positive, default=500.0, help="open-loop reviews per second (> 0)")
    parser.add_argument("--open-duration", type=load.positive, default=6.0, help="seconds per open-loop run")
    parser.add_argument("--open-connections", type=int, default=8)
    parser.add_argument("--log-level", default="INFO", help="webhook log level (INFO: a line per review)")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")
    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-matrix-"))
    load.issue_certs(work / "ecdsa", "ecdsa")
    load.issue_certs(work / "rsa", "rsa")
    print(f"cpus={os.cpu_count()} load average {os.getloadavg()[0]:.2f} at start; python {sys.version.split()[0]}")
    for section in chosen:
        RUNNERS[section](args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
