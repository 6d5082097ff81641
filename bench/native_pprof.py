"""Where kube-apiserver's CPU goes for a GPU Pod in native mode: a CPU profile of the API server. Prints numbers;
not a test.

    python bench/native_pprof.py [--seconds 25] [--out /tmp/native.pprof]

Starts the e2e control plane with `--profiling=true` (the suite runs it with profiling off), unregisters
gpu-webhook, applies the native policies, and makes server-side dry-run creates of a one-GPU Pod from a thread
while it takes a `--seconds` CPU profile from `/debug/pprof/profile`. It prints the API server's CPU per create
(profile samples over the creates made while it ran) in the parts of admission that the policies own, read with
`go tool pprof -top -cum` (cumulative: each line includes the lines it calls), and keeps the profile for
`go tool pprof` (`-peek`, `-top`). A sampling profile of a shared host: read the parts against each other within
one run, not against another run's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

import yaml
from cluster import Cluster, gpu_pod, running_cluster
from test_15_native import apply_native, remove_webhooks

# (what it is, the function whose cumulative time it is, by the name `go tool pprof` prints)
PARTS = (
    ("mutating admission, all plugins", "admission.chainAdmissionHandler.Admit"),
    ("the MutatingAdmissionPolicy, all", "mutating.(*Plugin).Admit"),
    ("  its JSONPatch: the CEL, encode, apply, decode", "patch.(*jsonPatcher).Patch"),
    ("    the patch's CEL (variables and expression)", "patch.(*jsonPatcher).evaluatePatchExpression"),
    ("validating admission, all plugins", "admission.chainAdmissionHandler.Validate"),
    ("the ValidatingAdmissionPolicies, all", "validating.(*validator).Validate"),
    ("the matchConditions of every policy", "matchconditions.(*matcher).Match"),
    ("the activations (object, params, request)", "cel.newActivation"),
    ("  the Pod converted by reflection", "runtime.(*unstructuredConverter).ToUnstructured"),
    ("CEL evaluation, all programs", "cel.(*prog).ContextEval"),
    ("garbage collection (background marking)", "runtime.gcBgMarkWorker"),
)


def _cumulative(binary: Path, profile: Path) -> dict[str, float]:
    """Seconds of cumulative CPU per function of the profile."""
    text = subprocess.run(["go", "tool", "pprof", "-top", "-cum", "-nodecount=100000", str(binary), str(profile)],
                          check=True, capture_output=True, text=True).stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and re.fullmatch(r"[0-9.]+m?s", fields[3]):
            value = fields[3]
            seconds = float(value[:-2]) / 1000 if value.endswith("ms") else float(value[:-1])
            out[fields[5].strip()] = out.get(fields[5].strip(), 0.0) + seconds
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=25, help="length of the CPU profile (default 25)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "native.pprof",
                        help="where to keep the profile (default /tmp/native.pprof)")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="profile the policies as CHECKOUT (another commit's tree) renders them instead, on this "
                             "checkout's params")
    args = parser.parse_args()

    from kubernetes import client

    plain_args = Cluster.apiserver_args
    Cluster.apiserver_args = lambda self: [  # type: ignore[method-assign]
        "--profiling=true" if a == "--profiling=false" else a for a in plain_args(self)]
    with tempfile.TemporaryDirectory(prefix="native-pprof-") as tmp, running_cluster(Path(tmp)) as cluster:
        remove_webhooks(cluster)
        apply_native(cluster)
        if args.against is not None:
            theirs = json.loads(subprocess.run(
                [sys.executable, "-c", "import json; from webhook.policy import native_cel; "
                 "print(json.dumps(native_cel.policies()))"], cwd=args.against, check=True, capture_output=True,
                text=True, env={**os.environ, "PYTHONPATH": str(args.against)}).stdout)
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(
                d for d in theirs if d["kind"].endswith("AdmissionPolicy")))
            time.sleep(2.5)  # the API server reloads the policies
        cluster.ensure_namespace("profile")
        core = client.CoreV1Api(cluster.api())
        pod = gpu_pod("unused")
        pod["metadata"] = {"generateName": "profile-"}
        for _ in range(150):  # the first creates after the policies are loaded are slower
            core.create_namespaced_pod("profile", pod, dry_run="All", _preload_content=False)
        done = threading.Event()
        creates = [0]

        def create() -> None:
            while not done.is_set():
                core.create_namespaced_pod("profile", pod, dry_run="All", _preload_content=False)
                creates[0] += 1

        worker = threading.Thread(target=create)
        worker.start()
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        try:
            with args.out.open("wb") as sink:
                subprocess.run([str(cluster.kubectl_path), "get", "--raw",
                                f"/debug/pprof/profile?seconds={args.seconds}"], stdout=sink, env=env, check=True)
        finally:
            done.set()
            worker.join()
        binary = cluster.bindir / "kube-apiserver"
        seconds = _cumulative(binary, args.out)
    policies = f"as {args.against} renders them" if args.against else "as rendered here"
    print(f"{creates[0]} dry-run creates of a one-GPU Pod in {args.seconds} s, policies {policies}; kube-apiserver "
          "CPU per create:")
    for what, function in PARTS:
        total = sum(s for name, s in seconds.items() if name.endswith(function))
        print(f"  {what:<52} {1000 * total / max(creates[0], 1):6.3f} ms")
    print(f"profile: {args.out} (go tool pprof -top -cum {binary} {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
