"""Memory per worker (RSS) before and after many reviews: does a gunicorn worker grow?

    python bench/memory.py                      # 1,000,000 reviews (long: ~10-20 min on 2 cores)
    python bench/memory.py --count 100000       # a quicker look
    python bench/memory.py --count 20000 --baseline ../before   # and another checkout's server, same run

RSS and PSS of every process of the server (the gunicorn master and its workers) are printed after the warm-up
and at the end: RSS is what dashboards show (pages shared by forked processes counted in each), PSS splits them.
With --baseline, both servers then run side by side for `--latency-rounds` alternating open-loop rounds
(bench/load.py's open loop: `--rate` GPU Pod /mutate reviews per second over 8 keep-alive connections, latency
from each request's scheduled time), so that a smaller footprint is not bought with slower answers.

One `gpu-webhook serve` (its default workers and threads unless given, TLS, INFO logging to /dev/null, packaged rules).
The mix cycles through the three realistic reviews of bench/common.py on /mutate and /validate, each with
a fresh uid, over keep-alive connections (plus a few new connections per checkpoint, so handshakes count).
A warm-up of `--warmup` reviews fills caches and lazily created objects first; "before" is measured after
it, "after" at the end; growth is (after - before) / before per worker. RSS is read from /proc/<pid>/status.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import load


def snapshot(server: common.Running) -> dict[int, int]:
    return {pid: common.rss_kib(pid) for pid in server.worker_pids()}


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def all_processes(server: common.Running) -> str:
    """RSS and PSS of the master and every worker, summed: the figures of docs/comparison.md."""
    pids = [server.proc.pid, *server.worker_pids()]
    rss = [common.rss_kib(pid) for pid in pids]
    pss = [pss_kib(pid) for pid in pids]
    return (f"{len(pids)} processes, RSS {sum(rss) / 1024:.0f} MiB (master {rss[0] / 1024:.0f}, workers "
            f"{', '.join(f'{v / 1024:.0f}' for v in rss[1:])}), PSS {sum(pss) / 1024:.0f} MiB")


def measure(args: argparse.Namespace, work: Path, checkout: Path) -> str:
    """One server of `checkout`: warm-up, checkpoints, growth per worker; returns the all-process figures."""
    requests = [(common.template_of(make()), path) for make in common.CASES.values()
                for path in ("/mutate", "/validate")]
    extra = [*(["--workers", str(args.workers)] if args.workers else []),
             *(["--threads", str(args.threads)] if args.threads else [])]
    server = common.start("webhook", "webhook", work / "tls", log_level=args.log_level, extra=extra,
                          checkout=checkout)
    try:
        sent, errors, _ = common.send_count(server.port, server.cafile, requests, args.warmup)
        if errors:
            raise RuntimeError(f"warm-up failed: {errors[:3]}")
        before = snapshot(server)
        print(f"\n{checkout}: {len(before)} gthread workers, log level {args.log_level}; "
              f"warm-up {sent} reviews; mix: gpu-pod, big-pod (10 KB), deployment x /mutate, /validate")
        start = all_processes(server)
        print(f"after the warm-up: {start}")
        print("RSS KiB per worker after warm-up: " + ", ".join(f"pid {p}: {v}" for p, v in before.items()))
        step = max(1, args.count // args.checkpoints)
        total, failures, seconds = 0, 0, 0.0
        first: dict[int, int] = {}
        while total < args.count:
            n = min(step, args.count - total)
            sent, errors, took = common.send_count(server.port, server.cafile, requests, n)
            for _ in range(20):  # new connections too: every checkpoint pays 20 more handshakes
                conn = load.Connection(server.port, load.client_context(server.cafile))
                conn.roundtrip(load.build_request(requests[0][0], "/mutate")())
                conn.close()
            total += sent
            failures += len(errors)
            seconds += took
            now = snapshot(server)
            first = first or now
            print(f"  after {total:>9,} reviews ({total / seconds:6.0f} reviews/s): "
                  + ", ".join(f"{v} KiB" for v in now.values()), flush=True)
        after = snapshot(server)
        end = all_processes(server)
        print(f"at the end: {end}")
        print(f"\nfailed requests: {failures}")
        for pid in before:
            growth = (after.get(pid, 0) - before[pid]) / before[pid] * 100
            later = (after.get(pid, 0) - first[pid]) / first[pid] * 100
            print(f"worker {pid}: {before[pid] / 1024:.1f} MiB -> {after.get(pid, 0) / 1024:.1f} MiB "
                  f"({growth:+.2f} %) after {total:,} reviews; {later:+.2f} % since the first checkpoint")
        if set(after) != set(before):
            print(f"WARNING: the worker set changed (restarted workers?): {sorted(before)} -> {sorted(after)}")
    finally:
        server.stop()
    return f"after the warm-up {start}; at the end {end}"


def latency(args: argparse.Namespace, work: Path, trees: dict[str, Path]) -> None:
    """Open-loop p50 and p99 of each tree's server (its default workers and threads), in alternating rounds."""
    template = common.template_of(common.CASES["gpu-pod"]())
    servers = {name: common.start("webhook", "webhook", work / "tls", log_level=args.log_level, checkout=tree)
               for name, tree in trees.items()}
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    try:
        for _ in range(args.latency_rounds):
            for name, server in servers.items():
                lat = load.open_loop(server.port, server.cafile, template, "/mutate", args.rate, 3.0, 8)
                rounds[name].append((lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3))
    finally:
        for server in servers.values():
            server.stop()
    print(f"\nopen loop, {args.rate:.0f} GPU Pod /mutate reviews/s, {args.latency_rounds} alternating rounds x 3 s:")
    for name, figures in rounds.items():
        p50 = sorted(f[0] for f in figures)
        p99 = sorted(f[1] for f in figures)
        print(f"  {name:14} p50 median {p50[len(p50) // 2]:.2f} ms (rounds {p50[0]:.2f}-{p50[-1]:.2f}), "
              f"p99 median {p99[len(p99) // 2]:.2f} ms (rounds {p99[0]:.2f}-{p99[-1]:.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000, help="reviews after the warm-up")
    parser.add_argument("--warmup", type=int, default=20_000, help="reviews before the first measurement")
    parser.add_argument("--checkpoints", type=int, default=10, help="RSS readings along the way")
    parser.add_argument("--workers", type=int, default=None, help="default: the server's own")
    parser.add_argument("--threads", type=int, default=None, help="default: the server's own")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="then run the server of the checkout in DIR the same way (`git worktree add DIR REV`)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--latency-rounds", type=int, default=5, help="with --baseline: alternating rounds")
    parser.add_argument("--rate", type=float, default=300.0, help="with --baseline: open-loop reviews per second")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-memory-"))
    load.issue_certs(work / "tls")
    summary = {"this checkout": measure(args, work, common.REPO)}
    if args.baseline:
        summary[f"baseline {args.baseline}"] = measure(args, work, args.baseline.resolve())
    print()
    for name, line in summary.items():
        print(f"{name}: {line}")
    if args.baseline and args.latency_rounds:
        latency(args, work, {"this checkout": common.REPO, "baseline": args.baseline.resolve()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
