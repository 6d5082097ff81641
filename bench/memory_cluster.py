"""RSS and PSS of every gpu-webhook process with cluster awareness on, as bench/peers/run.py measures it.

    python bench/memory_cluster.py                           # this checkout, 20 Pod creates
    python bench/memory_cluster.py --baseline ../before      # and another checkout's server, in the same run

Starts the e2e control plane (tests/e2e/cluster.py: its binaries must be built, `bash tests/e2e/build.sh`, and on
PATH) with the harness's `gpu-webhook serve --cluster` (the server's default workers and threads), sends
`--creates` GPU Pod creates through it (`kubectl create --dry-run=server`: both webhooks are called), and prints
the RSS and PSS of the master and each worker after start and at the end. RSS is the figure dashboards show and
docs/comparison.md compares (pages shared by forked processes count in each); PSS splits shared pages. Each
checkout gets a control plane of its own, one after the other. Prints text; not a test, not CI.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from cluster import running_cluster  # noqa: E402


def processes(pid: int) -> list[int]:
    """`pid` and its descendants."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [p for child in (task / "children").read_text().split() for p in processes(int(child))]
        except OSError:
            continue
    return found


def memory_mib(pid: int) -> tuple[float, float]:
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss / 1024, pss / 1024


def figures(pid: int) -> str:
    each = [memory_mib(p) for p in processes(pid)]
    return (f"{len(each)} processes, RSS {sum(r for r, _ in each):.0f} MiB "
            f"(master {each[0][0]:.0f}, workers {', '.join(f'{r:.0f}' for r, _ in each[1:])}), "
            f"PSS {sum(p for _, p in each):.0f} MiB")


def measure(checkout: Path, creates: int) -> tuple[str, str]:
    """(after start, at the end) for the webhook of `checkout`."""
    os.environ["PYTHONPATH"] = str(checkout)  # the harness runs `python -m webhook` with this environment
    with running_cluster(Path(tempfile.mkdtemp(prefix="gpu-webhook-memory-cluster-"))) as cluster:
        pid = cluster.procs["gpu-webhook"].popen.pid
        context = ssl.create_default_context(cafile=str(cluster.webhook_tls / "ca.crt"))
        for _ in range(100):  # the figures of a worker whose inventory has listed the cluster
            with urllib.request.urlopen(f"{cluster.webhook_url}/readyz", context=context) as answer:
                if json.load(answer)["checks"].get("inventory", {}).get("synced"):
                    break
            time.sleep(0.3)
        else:
            raise RuntimeError("the webhook's inventory did not sync in 30 s")
        start = figures(pid)
        for i in range(creates):
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"memory-{i}", "namespace": "default",
                                "labels": {"gpu-webhook.io/gpu-class": "inference"}},
                   "spec": {"containers": [{"name": "main", "image": "registry.example/infer:1",
                                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
            cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(pod),
                            check=False)
        return start, figures(pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creates", type=int, default=20, help="Pod creates (dry run) through the webhooks")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="also the webhook of the checkout in DIR")
    args = parser.parse_args(argv)
    trees = {"this checkout": REPO, **({f"baseline {args.baseline}": args.baseline.resolve()} if args.baseline
                                       else {})}
    for name, checkout in trees.items():
        start, end = measure(checkout, args.creates)
        print(f"{name}: after start {start}; after {args.creates} creates {end}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
