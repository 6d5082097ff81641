"""What cluster awareness costs as the cluster grows, on the pure core. Prints numbers; not a test.

    python bench/scale.py                         # N = 10, 1,000, 7,500, 65,000, 100,000 nodes
    python bench/scale.py --nodes 10 1000         # other sizes

For each N, a fleet of N nodes as the API server sends them (a quarter T4, a quarter A100, half CPU-only; the
GPU nodes with GPU Feature Discovery's labels and the nvidia.com/gpu taint, every node with the well-known
Kubernetes labels and a dozen Node Feature Discovery labels), and:

- `evaluate()` µs per review (the thread's CPU time, so that the time the host gives other work is left out),
  with the packaged rules and the snapshot the live caches hand a review: the seed's one-GPU Pod
  (tests/data/admission-reviews/pod-create-from-replicaset-gpu.json) and a pinned A100 Pod (its own nodeSelector
  gpu-type=a100, class label gpu-type=a100, 4 GPUs); best of several rounds;
- µs per Node update (CPU time too): a Node event (label, Ready condition or GPU count changed on a GPU node)
  parsed and applied to the index, then the next view published, as the watch thread and the next review do it;
- bytes per node held: tracemalloc's count of what the parsed Nodes and the index allocate, divided by N;
- build from a full list: the seconds to parse N Node objects (JSON as the API server sends it) and build the
  index, as a relist does;
- during a relist: reviews answered from the current snapshot while another thread parses and indexes N Nodes
  beside it (the reflector's relist): their median and worst latency, and how many were answered meanwhile.

With `--dra`, the DRA inventory instead (webhook/policy/dra_inventory.py): N nodes x 8 GPUs published in
ResourceSlices shaped like NVIDIA's DRA driver's (one slice per node; half H100, a quarter A100, a quarter T4), and:

- µs per review of the DRA lookup (CPU time; best of several rounds): the snapshot's DRA view, then the nodes with 4
  devices matching the packaged rules' t4 selector ANDed with NVIDIA's DeviceClass selector, and the product
  names with how many nodes hold each: what a `dra-unsatisfiable` check asks;
- µs per slice event (a node's slice replaced, then the next view published), bytes per device held, build s;
- with `--claims C`: the bytes tracemalloc counts for C ResourceClaims parsed and indexed (and per claim).

    python bench/scale.py --dra --nodes 10 7500 --claims 10000

Deterministic instruction counts, for a noisy host: run one size's reviews alone under valgrind, with and
without the loop, and subtract (the interpreter itself, not a shim):

    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        "$(python -c 'import sys; print(sys.executable)')" bench/scale.py --only 100000 --count 2000
                                                               # and again with --count 0; then --only 10
    ... bench/scale.py --only 7500 --what updates --count 3000     # Node events: parsed, applied, published;
    ... bench/scale.py --only 7500 --what events --count 3000      # minus the same events only made
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import sys
import threading
import time
import timeit
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from webhook.admission.loader import load_policy  # noqa: E402
from webhook.policy import device_selectors, dra_inventory, inventory  # noqa: E402
from webhook.policy.engine import Context, evaluate  # noqa: E402
from webhook.policy.node_index import NodeIndex, bulk_load  # noqa: E402

SIZES = (10, 1_000, 7_500, 65_000, 100_000)
SEED_POD = REPO / "tests" / "data" / "admission-reviews" / "pod-create-from-replicaset-gpu.json"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")
POOLS = {  # pool: (share of the fleet, GPU count, product, instance type, extra labels)
    "t4": (0.25, 1, "Tesla-T4", "g4dn.xlarge", {"gpu-type": "t4", "workload": "inference"}),
    "a100": (0.25, 8, "NVIDIA-A100-SXM4-80GB", "p4d.24xlarge", {"gpu-type": "a100", "workload": "training"}),
    "cpu": (0.5, 0, "", "m7i.4xlarge", {}),
}
NFD = [f"feature.node.kubernetes.io/cpu-cpuid.{f}" for f in (
    "AVX", "AVX2", "AVX512F", "AVX512BW", "AMXBF16", "FMA3", "SHA", "VAES", "VPCLMULQDQ", "X87")] + [
    "feature.node.kubernetes.io/kernel-version.full", "feature.node.kubernetes.io/system-os_release.ID"]


def node_json(index: int, pool: str, resource_version: int = 1) -> dict[str, Any]:
    """One Node as the API server sends it (trimmed of nothing the webhook parses)."""
    _, gpus, product, instance, extra = POOLS[pool]
    name = f"{pool}-{index:06d}"
    labels = {
        "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": instance, "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": ZONES[index % len(ZONES)],
        **{k: ("6.8.0-1024-aws" if "kernel" in k else "ubuntu" if "os_release" in k else "true") for k in NFD},
        **extra,
    }
    taints = []
    allocatable = {"cpu": "95500m", "memory": "1056561096Ki", "ephemeral-storage": "1438028263499", "pods": "110"}
    if gpus:
        labels.update({
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": "81920" if gpus == 8 else "15360", "nvidia.com/gpu.family": "ampere",
            "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.machine": instance, "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": str(gpus == 8).lower(),
            "nvidia.com/mig.strategy": "none", "nvidia.com/cuda.driver-version.major": "550",
            "nvidia.com/cuda.driver-version.minor": "127", "nvidia.com/cuda.driver-version.revision": "05",
            "nvidia.com/cuda.driver-version.full": "550.127.05", "nvidia.com/cuda.runtime-version.major": "12",
            "nvidia.com/cuda.runtime-version.minor": "4", "nvidia.com/cuda.runtime-version.full": "12.4",
            "nvidia.com/gfd.timestamp": "1748736000",
        })
        taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"00000000-0000-4000-8000-{index:012d}",
                     "resourceVersion": str(resource_version), "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": "10.244.0.0/24", "taints": taints},
        "status": {"capacity": dict(allocatable), "allocatable": allocatable,
                   "conditions": [{"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                                  {"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                   "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "containerd://2.1.4"}},
    }


def fleet(size: int) -> Iterator[dict[str, Any]]:
    """`size` Nodes in pool proportions (at least one of each pool)."""
    counts = {pool: max(1, round(size * share)) for pool, (share, *_) in POOLS.items()}
    counts["cpu"] = max(size - counts["t4"] - counts["a100"], 0)
    for pool, count in counts.items():
        for i in range(count):
            yield node_json(i, pool)


def pods() -> dict[str, dict[str, Any]]:
    seed = json.loads(SEED_POD.read_text())["request"]["object"]
    pinned = copy.deepcopy(seed)
    pinned["metadata"]["labels"] = {**pinned["metadata"].get("labels", {}), "gpu-webhook.io/gpu-type": "a100"}
    pinned["spec"]["nodeSelector"] = {"gpu-type": "a100"}
    pinned["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"},
                                                    "requests": {"nvidia.com/gpu": "4"}}
    return {"seed Pod": seed, "pinned A100 Pod": pinned}


def build(size: int, *, measure: bool = True) -> tuple[NodeIndex, float, int]:
    """The index of a fleet: (index, seconds to parse and build, bytes held; 0 without `measure`)."""
    if not measure:
        with bulk_load():
            return NodeIndex.build(inventory.node_from_api(obj) for obj in fleet(size)), 0.0, 0
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.take_snapshot()
    elapsed = 0.0
    parsed = []
    with bulk_load():  # as ClusterInventory's relist of Nodes does
        for page in _pages(fleet(size), 500):  # as a relist reads it: one page of JSON at a time
            began = time.perf_counter()
            parsed.extend(inventory.node_from_api(obj) for obj in page)
            elapsed += time.perf_counter() - began
        began = time.perf_counter()
        index = NodeIndex.build(parsed)
        elapsed += time.perf_counter() - began
    del parsed, page
    gc.collect()
    held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(start, "filename"))
    tracemalloc.stop()
    return index, elapsed, held


def _pages(items: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    page: list[dict[str, Any]] = []
    for item in items:
        page.append(item)
        if len(page) == size:
            yield page
            page = []
    if page:
        yield page


def reviews(index: NodeIndex) -> dict[str, Callable[[], Any]]:
    """Each Pod's review against the live snapshot, after a first review has made the index track its query."""
    policy = load_policy()
    calls = {}
    for name, obj in pods().items():
        ctx = Context("ml", mode="mutate", inventory=inventory.Snapshot(index.view().node_list))
        evaluate(policy, obj, ctx)  # the first review of a placement asks; the writer tracks it from here on
        ctx = Context("ml", mode="mutate", inventory=inventory.Snapshot(index.view().node_list))
        calls[name] = lambda obj=obj, ctx=ctx: evaluate(policy, obj, ctx)
    return calls


def relist_stall(size: int, call: Callable[[], Any]) -> tuple[float, float, int]:
    """Reviews on the current snapshot while a relist parses and indexes `size` Nodes beside it, in another
    thread (as the reflector does): (p50 µs, max µs, reviews answered during the relist)."""
    done = threading.Event()
    pages = list(_pages(fleet(size), 500))

    def relist() -> None:
        with bulk_load():  # as ClusterInventory's relist of Nodes does
            NodeIndex.build(inventory.node_from_api(obj) for page in pages for obj in page)
        done.set()

    seen: list[float] = []
    worker = threading.Thread(target=relist)
    worker.start()
    while not seen or not done.is_set():
        began = time.perf_counter()
        call()
        seen.append(time.perf_counter() - began)
    worker.join()
    seen.sort()
    return seen[len(seen) // 2] * 1e6, seen[-1] * 1e6, len(seen)


def updates(index: NodeIndex, size: int, count: int, *, apply: bool = True) -> float:
    """µs per Node event applied (parse, put, next view); `apply` False: only make the events."""
    rng = random.Random(size)
    gpu_nodes = [name for name in index.view().nodes if not name.startswith("cpu-")]
    events = []
    for i in range(count):
        name = rng.choice(gpu_nodes)
        pool, number = name.rsplit("-", 1)
        obj = node_json(int(number), pool, i + 2)
        change = i % 3
        if change == 0:
            obj["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = str(1748736000 + i)
        elif change == 1:
            obj["status"]["conditions"][1]["status"] = "False" if (i // 3) % 2 == 0 else "True"
        else:
            obj["status"]["allocatable"]["nvidia.com/gpu"] = str(rng.randint(0, 8))
        events.append(obj)
    if not apply:
        return 0.0
    began = time.thread_time()
    for obj in events:
        index.put(inventory.node_from_api(obj))
        index.view()
    return (time.thread_time() - began) / count * 1e6


# --------------------------------------------------------------------------------------------- DRA

DRA_POOLS = (("h100", 0.5, "NVIDIA H100 80GB HBM3", "Hopper", "81559Mi"),
             ("a100", 0.25, "NVIDIA A100-SXM4-80GB", "Ampere", "81920Mi"),
             ("t4", 0.25, "Tesla T4", "Turing", "15360Mi"))
NVIDIA_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def slice_json(index: int, pool: str, generation: int = 1) -> dict[str, Any]:
    """One node's ResourceSlice as NVIDIA's DRA driver publishes it: 8 whole GPUs (DRA-FACTS §3.3)."""
    _, _, product, architecture, memory = next(p for p in DRA_POOLS if p[0] == pool)
    node = f"{pool}-{index:06d}"
    devices = [{"name": f"gpu-{minor}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{index:08x}-{minor:04x}-4e2a-9b1c-{generation:012x}"},
        "productName": {"string": product}, "brand": {"string": "Nvidia"}, "architecture": {"string": architecture},
        "cudaComputeCapability": {"version": "9.0.0"}, "driverVersion": {"version": "580.159.4"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{minor + 0x18:02x}:00.0"}},
        "capacity": {"memory": {"value": memory}}} for minor in range(8)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-x7k2q", "resourceVersion": str(generation)},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "devices": devices}}


def dra_fleet(size: int) -> Iterator[tuple[int, str]]:
    for pool, share, *_ in DRA_POOLS:
        yield from ((i, pool) for i in range(max(1, round(size * share))))


def dra_build(size: int) -> tuple[dra_inventory.DraIndex, float, int, int]:
    """(index, seconds to parse and index, bytes held, devices)."""
    objects = [slice_json(i, pool) for i, pool in dra_fleet(size)]
    gc.collect()
    tracemalloc.start()
    began = time.perf_counter()
    index = dra_inventory.DraIndex()
    index.replace("resourceslices", (dra_inventory.slice_from_api(obj) for obj in objects))
    index.view()
    seconds = time.perf_counter() - began
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return index, seconds, held, sum(len(obj["spec"]["devices"]) for obj in objects)


def dra_lookup(index: dra_inventory.DraIndex) -> Callable[[], Any]:
    """One review's DRA questions, once asked (so tracked from then on, as in the server)."""
    policy = load_policy()
    t4 = next(axis.values["t4"] for axis in policy.axes if "t4" in axis.values)
    query = device_selectors.DeviceQuery.of([NVIDIA_CLASS, *dict(t4.device_selectors).values()])
    assert query is not None

    def lookup() -> Any:
        view = index.view()
        return view.nodes_with(query, 4), view.values("gpu.nvidia.com", "productName")

    lookup()
    lookup()
    return lookup


def dra_updates(index: dra_inventory.DraIndex, size: int, count: int) -> float:
    """µs per slice event (a node's slice republished with new UUIDs, parsed, put, next view)."""
    nodes = list(dra_fleet(size))
    rng = random.Random(size)
    events = [slice_json(*rng.choice(nodes), generation=i + 2) for i in range(count)]
    began = time.thread_time()
    for obj in events:
        index.put(dra_inventory.slice_from_api(obj))
        index.view()
    return (time.thread_time() - began) / count * 1e6


def claim_json(index: int) -> dict[str, Any]:
    """A ResourceClaim as the resource-claim controller makes one from a template: 2 GPUs, allocated, reserved."""
    node = f"h100-{index % 3750:06d}"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
        "name": f"trainer-{index:06d}-gpus-x7k2q", "namespace": f"team-{index % 50}", "uid": f"uid-{index:012d}",
        "resourceVersion": str(index + 10), "generateName": f"trainer-{index:06d}-gpus-",
        "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": f"trainer-{index:06d}",
                             "uid": f"pod-{index:012d}", "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2,
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].productName == '
                                                 '"NVIDIA H100 80GB HBM3"'}}]}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": f"gpu-{d}"} for d in (0, 1)]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": f"trainer-{index:06d}", "uid": f"pod-{index:012d}"}]}}


def claims_held(count: int) -> int:
    """Bytes tracemalloc counts for `count` ResourceClaims parsed into the index (the JSON itself excluded)."""
    objects = [claim_json(i) for i in range(count)]
    gc.collect()
    tracemalloc.start()
    index = dra_inventory.DraIndex()
    index.replace("resourceclaims", (dra_inventory.resource_claim_from_api(obj) for obj in objects))
    index.view()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held


def dra_main(args: argparse.Namespace) -> int:
    print(f"DRA inventory; 8 GPUs per node; best of {args.rounds} rounds x {args.number} lookups; "
          f"{args.updates} slice events per size")
    header = (f"{'nodes':>8} | {'devices':>8} | {'lookup µs':>9} | {'event µs':>8} | {'bytes/device':>12} | "
              f"{'build s':>8} | answer")
    print(header)
    print("-" * len(header))
    for size in args.nodes:
        index, seconds, held, devices = dra_build(size)
        lookup = dra_lookup(index)
        per_review = min(timeit.repeat(lookup, number=args.number, repeat=args.rounds, timer=time.thread_time)) \
            / args.number * 1e6
        per_event = dra_updates(index, size, args.updates)
        summary, products = lookup()
        print(f"{size:>8,} | {devices:>8,} | {per_review:>9.1f} | {per_event:>8.1f} | {held / devices:>12,.0f} | "
              f"{seconds:>8.2f} | t4 x4: {f'{summary.nodes:,} nodes' if summary else 'undecided'}; products: "
              + ", ".join(f"{p.value} on {p.nodes:,}" for p in products), flush=True)
        del index
    if args.claims:
        held = claims_held(args.claims)
        print(f"{args.claims:,} ResourceClaims held: {held / 2**20:.1f} MiB "
              f"({held / args.claims:,.0f} bytes per claim)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=list(SIZES), help="cluster sizes")
    parser.add_argument("--number", type=int, default=2000, help="reviews per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per review (the best is kept)")
    parser.add_argument("--updates", type=int, default=3000, help="Node events applied per size")
    parser.add_argument("--only", type=int, help="build this size, then run both reviews --count times, print nothing")
    parser.add_argument("--count", type=int, default=0, help="with --only: reviews (or Node events) to run")
    parser.add_argument("--what", choices=("reviews", "updates", "events"), default="reviews",
                        help="with --only: both reviews --count times, --count Node events made and applied, or "
                             "only made (the baseline to subtract from updates)")
    parser.add_argument("--dra", action="store_true", help="measure the DRA inventory (ResourceSlices) instead")
    parser.add_argument("--claims", type=int, default=0, help="with --dra: also the memory of this many claims")
    args = parser.parse_args(argv)
    if args.dra:
        return dra_main(args)

    if args.only is not None:
        index, _, _ = build(args.only, measure=False)
        calls = list(reviews(index).values())
        if args.what != "reviews":
            updates(index, args.only, 200)
            updates(index, args.only, args.count, apply=args.what == "updates")
            return 0
        for call in calls:
            for _ in range(200):
                call()
        for _ in range(args.count):
            for call in calls:
                call()
        return 0

    names = list(pods())
    print(f"packaged rules, cluster-aware; best of {args.rounds} rounds x {args.number} reviews; "
          f"{args.updates} Node events per size")
    header = (f"{'nodes':>8} | " + " | ".join(f"{n + ' µs':>20}" for n in names)
              + f" | {'update µs':>9} | {'bytes/node':>10} | {'build s':>8} | during a relist: review p50 / max µs")
    print(header)
    print("-" * len(header))
    for size in args.nodes:
        index, seconds, held = build(size)
        calls = reviews(index)
        for call in calls.values():
            for _ in range(200):
                call()
        timings = [min(timeit.repeat(call, number=args.number, repeat=args.rounds, timer=time.thread_time))
                   / args.number * 1e6 for call in calls.values()]
        per_update = updates(index, size, args.updates)
        p50, worst, answered = relist_stall(size, calls["seed Pod"])
        print(f"{size:>8,} | " + " | ".join(f"{t:>20.1f}" for t in timings)
              + f" | {per_update:>9.1f} | {held / size:>10,.0f} | {seconds:>8.2f} | "
              f"{p50:.0f} / {worst:,.0f} ({answered:,} reviews)", flush=True)
        del index, calls
    return 0


if __name__ == "__main__":
    sys.exit(main())
