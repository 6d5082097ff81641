"""Reviews during webhook rollouts, Pod deletions and `helm upgrade`s on the real node, counted; with the evidence
for each create that was refused or admitted unmutated. Prints numbers; not a test, not in CI.

    export PATH=$HOME/.cache/gpu-webhook-e2e/v1.36.3/bin:$PATH     # the e2e control plane (tests/e2e/build.sh)
    python bench/rollouts.py --rollouts 10 --deletions 3 --upgrades 3 --busy 2 --evidence /tmp/rollouts

Starts the e2e control plane and the real node (root, as `pytest -m e2e` does), installs the chart from the image
(tests/e2e/test_21_installed.py's way), then, one operation at a time, runs a create loop (server-side dry runs of
the seed's one-GPU Pod: both webhooks are called, nothing is stored) while `kubectl rollout restart`, a webhook Pod
deleted or evicted (what `kubectl drain` does to each Pod), or a `helm upgrade` that edits the rules replaces the
webhook's Pods. `--busy N` keeps N processes
spinning on the CPU throughout, so that the control plane, the kubelet and the webhook compete for the cores.
`--stale N` adds N rollouts during which the EndpointSlice controller cannot update the webhook Service's slices
for `--stale-seconds` (a ValidatingAdmissionPolicy refuses the writes, and the controller retries with its
backoff): the API server keeps resolving the Service to the old Pods after their deletion, as in the CI run where
kube-controller-manager logged "EndpointSlice informer cache is out of date" before a review went unanswered.

With `--evidence DIR` it also records, with wall-clock times: every TCP packet on port 8443 of the node's bridge
(tcpdump), the webhook Service's EndpointSlice as the API server serves it (polled every 100 ms), the
webhook Pods' phases, readiness and deletion, and the API server's "Failed calling webhook" lines; for each failed
call it prints the SYNs, FINs and RSTs of the 5 s before and what the EndpointSlice said then.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from cluster import WEBHOOK_NAMESPACE, Cluster, CreateLoop, running_cluster, wait_until  # noqa: E402
from installed import CHART, RELEASE, InstalledWebhook, endpoint_slices_frozen  # noqa: E402
from realnode import BRIDGE, RealNode, build_node_binaries  # noqa: E402

NAMESPACE = "bench-rollouts"
SPIN = "import time\nwhile True:\n    pass\n"
FAILED_CALL = re.compile(r"^[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d+).*Failed calling webhook.*")


class Recorder:
    """Polls the webhook Service's EndpointSlices and Pods, writing each change as one JSON line with its time."""

    def __init__(self, cluster: Cluster, out: Path) -> None:
        self.cluster, self.out = cluster, out
        self.slices: list[tuple[float, dict[str, dict[str, bool]]]] = []  # (time, {ip: conditions})
        self._stop = threading.Event()
        self._followed: dict[str, subprocess.Popen[bytes]] = {}
        self._threads = [threading.Thread(target=self._poll, args=(what,), daemon=True) for what in ("slice", "pods")]

    def _state(self, what: str) -> Any:
        if what == "slice":
            path = (f"/apis/discovery.k8s.io/v1/namespaces/{WEBHOOK_NAMESPACE}/endpointslices"
                    f"?labelSelector=kubernetes.io/service-name={RELEASE}")
            status, body = self.cluster.raw("GET", path)
            return {ep["addresses"][0]: {k: bool(v) for k, v in ep.get("conditions", {}).items()}
                    for item in body.get("items", []) for ep in item.get("endpoints") or []} if status == 200 else None
        status, body = self.cluster.raw("GET", f"/api/v1/namespaces/{WEBHOOK_NAMESPACE}/pods"
                                               "?labelSelector=app.kubernetes.io/name=gpu-webhook")
        if status != 200:
            return None
        return {pod["metadata"]["name"]: {
            "ip": pod.get("status", {}).get("podIP"), "phase": pod.get("status", {}).get("phase"),
            "deleting": "deletionTimestamp" in pod["metadata"],
            "ready": [c["status"] for c in pod.get("status", {}).get("conditions", []) if c["type"] == "Ready"],
            "containers": [sorted(c.get("state", {})) for c in pod.get("status", {}).get("containerStatuses", [])],
        } for pod in body.get("items", [])}

    def _poll(self, what: str) -> None:
        last: Any = None
        with (self.out / f"{what}.jsonl").open("w") as sink:
            while not self._stop.is_set():
                state = self._state(what)
                if state is not None and state != last:
                    now = time.time()
                    sink.write(json.dumps({"t": now, what: state}) + "\n")
                    sink.flush()
                    if what == "slice":
                        self.slices.append((now, state))
                    else:
                        self._follow_logs(state)
                    last = state
                time.sleep(0.1)

    def _follow_logs(self, pods: dict[str, Any]) -> None:
        """`kubectl logs -f` of each webhook Pod once it runs: an old Pod's log is gone with the Pod."""
        for name, pod in pods.items():
            if name not in self._followed and pod["phase"] == "Running":
                with (self.out / f"{name}.log").open("wb") as sink:
                    self._followed[name] = subprocess.Popen(
                        [str(self.cluster.kubectl_path), "--kubeconfig", str(self.cluster.kubeconfig), "logs", "-f",
                         name, "-n", WEBHOOK_NAMESPACE], stdout=sink, stderr=subprocess.STDOUT)

    def slice_at(self, when: float) -> dict[str, dict[str, bool]]:
        before = [state for t, state in self.slices if t <= when]
        return before[-1] if before else {}

    def __enter__(self) -> Recorder:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        for proc in self._followed.values():
            proc.terminate()


@contextlib.contextmanager
def packets(out: Path | None) -> Iterator[None]:
    """tcpdump of port 8443 on the node's bridge, one line a packet with its epoch time."""
    if out is None or shutil.which("tcpdump") is None:
        yield
        return
    with (out / "tcp.txt").open("w") as sink:
        proc = subprocess.Popen(["tcpdump", "-i", BRIDGE, "-nn", "-tt", "-l", "-s", "128", "tcp port 8443"],
                                stdout=sink, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def replaced(installed: InstalledWebhook, before: set[str]) -> Callable[[], bool]:
    """Whether none of the Pods `before` is left and the rollout is complete."""
    return lambda: not before & installed.pod_names() and installed.rolled_out()


def operation(kind: str, number: int, cluster: Cluster, installed: InstalledWebhook, home: Path,
              stale_seconds: float) -> None:
    before = installed.pod_names()
    if kind == "rollout":
        cluster.kubectl("rollout", "restart", f"deployment/{RELEASE}", "-n", WEBHOOK_NAMESPACE)
        wait_until(replaced(installed, before), 300, "the rollout", interval=1)
    elif kind == "deletion":
        victim = sorted(before)[0]
        cluster.kubectl("delete", "pod", victim, "-n", WEBHOOK_NAMESPACE, "--wait=false")
        wait_until(replaced(installed, {victim}), 300, "the replacement", interval=1)
    elif kind == "eviction":
        # What `kubectl drain` does to each Pod of a node: the Eviction API, which honours the PodDisruptionBudget.
        victim = sorted(before)[0]
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": victim, "namespace": WEBHOOK_NAMESPACE}}
        status, answer = cluster.raw("POST", f"/api/v1/namespaces/{WEBHOOK_NAMESPACE}/pods/{victim}/eviction",
                                     eviction)
        if status != 201:
            raise RuntimeError(f"evicting {victim}: {status} {answer}")
        wait_until(replaced(installed, {victim}), 300, "the replacement", interval=1)
    elif kind == "stale":
        # `kubectl rollout restart` while the EndpointSlice controller cannot write the Service's slices for
        # `stale_seconds` (a ValidatingAdmissionPolicy refuses them; the controller retries with its backoff, as
        # it logs "Error syncing endpoint slices for service, retrying"): the API server's resolver lists the old
        # Pods as Ready after their deletion, as on a control plane whose slice updates lag.
        with endpoint_slices_frozen(cluster):
            cluster.kubectl("rollout", "restart", f"deployment/{RELEASE}", "-n", WEBHOOK_NAMESPACE)
            time.sleep(stale_seconds)
        wait_until(replaced(installed, before), 300, "the rollout", interval=1)
    else:
        values = home / f"upgrade-{number}.yaml"
        values.write_text(f"rules:\n  gpu-policy.yaml:\n    spec:\n      enforcement:\n        gpu-limits-required: "
                          f"{'warn' if number % 2 else 'deny'}\n")
        installed.helm("upgrade", RELEASE, str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--reuse-values",
                       "-f", str(values), "--wait", "--timeout", "300s", timeout=360)
        wait_until(replaced(installed, before), 300, "the upgrade", interval=1)


def failed_calls(cluster: Cluster, since: float) -> list[tuple[float, str]]:
    """The API server's "Failed calling webhook" lines after `since`, with their times (klog: UTC, no year)."""
    year = dt.datetime.now(dt.UTC).year
    found = []
    for line in (cluster.logdir / "kube-apiserver.log").read_text(errors="replace").splitlines():
        match = FAILED_CALL.match(line)
        if not match:
            continue
        stamp = dt.datetime.strptime(f"{year}{match[1]} {match[2]}", "%Y%m%d %H:%M:%S.%f")
        when = stamp.replace(tzinfo=dt.UTC).timestamp()
        if when >= since:
            found.append((when, line))
    return found


def dialled(tcp: Path, start: float, end: float) -> list[str]:
    """The SYNs the node's bridge saw from the API server (the node IP) to port 8443 in [start, end]."""
    if not tcp.exists():
        return []
    out = []
    for line in tcp.read_text().splitlines():
        try:
            when = float(line.split()[0])
        except (ValueError, IndexError):
            continue
        if start <= when <= end and re.search(r"Flags \[[SFR]", line):
            out.append(line)
    return out


def timelines(evidence: Path) -> list[str]:
    """One line per webhook Pod IP: seconds from its Pod's deletion to its EndpointSlice entry turning not ready,
    to the last SYN the API server sent it, and to the last packet it got or sent."""
    deleted: dict[str, float] = {}
    for line in (evidence / "pods.jsonl").read_text().splitlines():
        record = json.loads(line)
        for pod in record["pods"].values():
            if pod["deleting"] and pod["ip"] and pod["ip"] not in deleted:
                deleted[pod["ip"]] = record["t"]
    not_ready: dict[str, float] = {}
    for line in (evidence / "slice.jsonl").read_text().splitlines():
        record = json.loads(line)
        for ip in deleted:
            gone = not record["slice"].get(ip, {}).get("ready", False)
            if ip not in not_ready and gone and record["t"] >= deleted[ip] - 1:
                not_ready[ip] = record["t"]
    last_syn: dict[str, float] = {}
    last_packet: dict[str, float] = {}
    tcp = evidence / "tcp.txt"
    for line in tcp.read_text().splitlines() if tcp.exists() else []:
        parts = line.split()
        if len(parts) < 5 or parts[1] != "IP":
            continue
        ends = [part.rstrip(":").rsplit(".", 1)[0] for part in (parts[2], parts[4])]
        ip = ends[1] if parts[4].rstrip(":").endswith(".8443") else ends[0]
        last_packet[ip] = float(parts[0])
        if "Flags [S]" in line:
            last_syn[ip] = float(parts[0])
    out = []
    def since(table: dict[str, float], ip: str, when: float) -> str:
        return f"{table[ip] - when:+7.2f} s" if ip in table else "      -  "

    for ip, when in sorted(deleted.items(), key=lambda item: item[1]):
        out.append(f"{ip:15s} deleted {dt.datetime.fromtimestamp(when, dt.UTC):%H:%M:%S.%f}  slice not ready "
                   f"{since(not_ready, ip, when)}  last SYN {since(last_syn, ip, when)}  "
                   f"last packet {since(last_packet, ip, when)}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=10)
    parser.add_argument("--deletions", type=int, default=3)
    parser.add_argument("--upgrades", type=int, default=3)
    parser.add_argument("--evictions", type=int, default=0, help="webhook Pods evicted, as a node drain does")
    parser.add_argument("--stale", type=int, default=0,
                        help="rollouts while the webhook's EndpointSlices cannot be updated")
    parser.add_argument("--stale-seconds", type=float, default=12, help="how long they cannot")
    parser.add_argument("--busy", type=int, default=2, help="CPU-spinning processes during the operations")
    parser.add_argument("--evidence", type=Path, help="a folder for tcpdump, EndpointSlice and Pod timelines")
    parser.add_argument("--set", action="append", default=[], help="extra helm --set for the install")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the real node needs root (containerd, the kubelet, a bridge)", file=sys.stderr)
        return 2
    evidence = args.evidence
    if evidence:
        evidence.mkdir(parents=True, exist_ok=True)
    plan = (["rollout"] * args.rollouts + ["deletion"] * args.deletions + ["upgrade"] * args.upgrades
            + ["eviction"] * args.evictions + ["stale"] * args.stale)
    totals = {"mutated": 0, "unmutated": 0, "refused": 0}
    with tempfile.TemporaryDirectory(prefix="rollouts-") as tmp, running_cluster(Path(tmp) / "cluster") as cluster:
        node = RealNode(cluster=cluster, bindir=build_node_binaries(), workdir=Path(tmp) / "node")
        node.start()
        for name in ("gpu-t4-0", "gpu-t4-1"):
            cluster.kubectl("cordon", name)
        installed = InstalledWebhook(cluster=cluster, node=node, home=Path(tmp) / "installed")
        try:
            installed.prepare()
            installed.install(None, *[f"--set={value}" for value in args.set])
            cluster.wait_webhook_active(timeout=60)
            cluster.ensure_namespace(NAMESPACE)
            start = time.time()
            record = Recorder(cluster, evidence) if evidence else contextlib.nullcontext()
            with packets(evidence), record, busy(args.busy):
                for number, kind in enumerate(plan, 1):
                    began = time.time()
                    with CreateLoop(cluster, NAMESPACE) as loop:
                        time.sleep(2)
                        operation(kind, number, cluster, installed, Path(tmp), args.stale_seconds)
                        time.sleep(5)
                    counts = loop.counts()
                    for key in totals:
                        totals[key] += counts[key]
                    print(f"{number:3d} {kind:9s} {time.time() - began:5.0f} s  {counts}  {loop.summary()}",
                          flush=True)
                    for status, what in loop.results:
                        if status != 201 or what != "mutated":
                            print(f"      {status} {what[:300]}", flush=True)
            failures = failed_calls(cluster, start)
            print(f"\ntotal over {len(plan)} operations (--busy {args.busy}): {totals}")
            print(f"API server 'Failed calling webhook' lines: {len(failures)}")
            for when, line in failures:
                print(f"\n{line[:400]}")
                if evidence and isinstance(record, Recorder):
                    print(f"  EndpointSlice 5 s before: {json.dumps(record.slice_at(when - 5))}")
                    print(f"  EndpointSlice at the failure: {json.dumps(record.slice_at(when))}")
                    for packet in dialled(evidence / "tcp.txt", when - 5.5, when):
                        print(f"  {packet}")
            if evidence:
                print("\nold webhook Pods, from their deletion:")
                for line in timelines(evidence):
                    print(f"  {line}")
                shutil.copy(cluster.logdir / "kube-apiserver.log", evidence / "kube-apiserver.log")
                shutil.copy(cluster.logdir / "kube-controller-manager.log", evidence / "kube-controller-manager.log")
                with contextlib.suppress(OSError):
                    shutil.copytree(node.logdir, evidence / "node-logs", dirs_exist_ok=True)
        finally:
            installed.uninstall()
            node.stop()
    return 0 if totals["refused"] == 0 and totals["unmutated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
