"""What each validation of the deny policy costs inside kube-apiserver. Prints numbers; not a test.

    python bench/native_profile.py [--creates 150]

Starts the e2e control plane, unregisters gpu-webhook and applies the native policies. It measures them as
rendered (the warn policy bound: what its matchCondition leaves to do for the Pod) and with the warn policy unbound,
alternately for `--level-rounds` rounds (`--levels-only`: then stops), and leaves the warn policy unbound.
`--against CHECKOUT` alternates instead the policies as rendered here and as another tree renders them.
`--map-shapes ROUNDS` alternates instead variants of the MutatingAdmissionPolicy: as rendered, with
`reinvocationPolicy: Never` (no second pass after it changed the Pod), with a no-op patch
(the same conditions and variables), with a constant patch of the operations it makes for this Pod (no variable
read), and ended by a false matchCondition.
Then it replaces the deny policy's validations with: all of them, none (`true`), and each one alone. For each
variant it makes `--creates` server-side dry-run creates of a one-GPU Pod and prints the growth of the API
server's `apiserver_admission_controller_admission_duration_seconds_sum` per Pod for the
ValidatingAdmissionPolicy and MutatingAdmissionPolicy plugins, and the client's mean wall time. The variants run
one after another, so machine load moves the figures; compare "all" with "none" from the same run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

import yaml
from cluster import Cluster, gpu_pod, running_cluster
from test_15_native import apply_native, remove_webhooks, render

PLUGIN_SUM = "apiserver_admission_controller_admission_duration_seconds_sum{name=\"%s\",operation=\"CREATE\""


def _plugin_seconds(cluster: Cluster) -> tuple[float, float]:
    """Summed seconds of the (validating, mutating) admission-policy plugins for CREATE so far."""
    _, text = cluster.raw_text("/metrics")
    totals = [0.0, 0.0]
    for line in text.splitlines():
        for index, name in enumerate(("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")):
            if line.startswith(PLUGIN_SUM % name):
                totals[index] += float(line.rsplit(" ", 1)[1])
    return totals[0], totals[1]


# What the MAP adds to the one-GPU Pod with the packaged rules, as constants: the class's nodeSelector, runtime class
# and the two annotations (the Pod already tolerates the GPU taint).
_CONSTANT_PATCH = (
    "[JSONPatch{op: 'add', path: '/spec/nodeSelector', value: {}}, "
    "JSONPatch{op: 'add', path: '/spec/nodeSelector/workload', value: 'inference'}, "
    "JSONPatch{op: 'add', path: '/spec/nodeSelector/gpu-type', value: 't4'}, "
    "JSONPatch{op: 'add', path: '/spec/runtimeClassName', value: 'nvidia'}, "
    "JSONPatch{op: 'add', path: '/metadata/annotations', value: {}}, "
    "JSONPatch{op: 'add', path: '/metadata/annotations/gpu-webhook.io~1class', "
    "value: 'workload=inference,gpu-type=t4'}, "
    "JSONPatch{op: 'add', path: '/metadata/annotations/gpu-webhook.io~1rules', value: 'constant'}]")


# A patch that changes nothing (a `test` of the kind): `[]` does not type-check as list(JSONPatch).
_NO_OP_PATCH = "[JSONPatch{op: 'test', path: '/kind', value: 'Pod'}]"


def _map_shapes(cluster: Cluster, core: Any, pod: dict[str, Any], rounds: int,
                measure: Callable[[str], None]) -> None:
    """Where the MutatingAdmissionPolicy's time goes: its variants alternated for `rounds` rounds."""
    policy: dict[str, Any] = yaml.safe_load(cluster.kubectl(
        "get", "mutatingadmissionpolicy", "gpu-webhook.io-class", "-o", "yaml").stdout)
    policy["metadata"] = {"name": policy["metadata"]["name"]}
    policy.pop("status", None)

    def patched(expression: str) -> dict[str, Any]:
        variant = copy.deepcopy(policy)
        variant["spec"]["mutations"][0]["jsonPatch"]["expression"] = expression
        return variant

    ended = copy.deepcopy(policy)
    ended["spec"]["matchConditions"].append({"name": "ended", "expression": "false"})
    never = copy.deepcopy(policy)
    never["spec"]["reinvocationPolicy"] = "Never"
    variants = [("MAP as rendered", policy), ("MAP, reinvocationPolicy Never", never),
                ("MAP, a no-op patch", patched(_NO_OP_PATCH)),
                ("MAP, constant patch", patched(_CONSTANT_PATCH)), ("MAP, ended by a false matchCondition", ended)]
    for _ in range(100):
        core.create_namespaced_pod("profile", pod, dry_run="All", _preload_content=False)
    for _ in range(rounds):
        for name, variant in variants:
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(variant))
            time.sleep(2.5)
            measure(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creates", type=int, default=150, help="dry-run creates per variant (default 150)")
    parser.add_argument("--level-rounds", type=int, default=1,
                        help="rounds of (warn policy bound, unbound) before the deny policy's variants (default 1)")
    parser.add_argument("--levels-only", action="store_true", help="stop after those rounds")
    parser.add_argument("--shapes", type=int, default=0, metavar="ROUNDS",
                        help="instead of each validation alone: all, all with constant messages, all in one "
                             "validation and none, for ROUNDS rounds")
    parser.add_argument("--map-shapes", type=int, default=0, metavar="ROUNDS",
                        help="instead: the MutatingAdmissionPolicy as rendered, with a no-op patch (the same "
                             "conditions and variables), with a constant patch of the same operations (no variable "
                             "read), and ended by a false matchCondition, for ROUNDS rounds")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="instead: alternate the policies of this checkout with those of CHECKOUT (another "
                             "commit's tree; its webhook package renders them), as rendered, for --level-rounds "
                             "rounds, on this checkout's params")
    args = parser.parse_args()

    from kubernetes import client

    with tempfile.TemporaryDirectory(prefix="native-profile-") as tmp, running_cluster(Path(tmp)) as cluster:
        remove_webhooks(cluster)
        apply_native(cluster)
        cluster.ensure_namespace("profile")
        core = client.CoreV1Api(cluster.api())
        pod = gpu_pod("unused")
        pod["metadata"] = {"generateName": "profile-"}

        def measure(name: str) -> None:
            for _ in range(20):
                core.create_namespaced_pod("profile", pod, dry_run="All", _preload_content=False)
            vap0, map0 = _plugin_seconds(cluster)
            started = time.perf_counter()
            for _ in range(args.creates):
                core.create_namespaced_pod("profile", pod, dry_run="All", _preload_content=False)
            wall = (time.perf_counter() - started) / args.creates
            vap1, map1 = _plugin_seconds(cluster)
            print(f"{name:<64} VAP {1000 * (vap1 - vap0) / args.creates:6.3f} ms/Pod   "
                  f"MAP {1000 * (map1 - map0) / args.creates:6.3f} ms/Pod   wall {1000 * wall:6.2f} ms", flush=True)

        if args.map_shapes:
            _map_shapes(cluster, core, pod, args.map_shapes, measure)
            return 0
        if args.against is not None:
            ours = [d for d in render() if d["kind"].endswith("AdmissionPolicy")]
            theirs = [d for d in json.loads(subprocess.run(
                [sys.executable, "-c", "import json; from webhook.policy import native_cel; "
                 "print(json.dumps(native_cel.policies()))"], cwd=args.against, check=True, capture_output=True,
                text=True, env={**os.environ, "PYTHONPATH": str(args.against)}).stdout)
                if d["kind"].endswith("AdmissionPolicy")]
            for _ in range(100):
                core.create_namespaced_pod("profile", pod, dry_run="All", _preload_content=False)
            for _ in range(args.level_rounds):
                for name, policies in (("this checkout", ours), (str(args.against), theirs)):
                    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(policies))
                    time.sleep(2.5)
                    measure(name)
            return 0
        binding: dict[str, Any] = yaml.safe_load(cluster.kubectl(
            "get", "validatingadmissionpolicybinding", "gpu-webhook.io-warn", "-o", "yaml").stdout)
        binding["metadata"] = {"name": binding["metadata"]["name"]}
        for _ in range(100):  # the first creates after the policies are loaded are slower
            core.create_namespaced_pod("profile", pod, dry_run="All", _preload_content=False)
        for round_ in range(args.level_rounds):  # alternated: the machine's load moves both alike
            if round_:
                cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(binding))
                time.sleep(2.5)
            measure("as rendered (deny and warn policies bound)")
            cluster.kubectl("delete", "validatingadmissionpolicybinding", "gpu-webhook.io-warn")
            time.sleep(2.5)
            measure("the warn policy unbound")
        if args.levels_only:
            return 0
        policy: dict[str, Any] = yaml.safe_load(cluster.kubectl(
            "get", "validatingadmissionpolicy", "gpu-webhook.io-deny", "-o", "yaml").stdout)
        policy["metadata"] = {"name": policy["metadata"]["name"]}
        policy.pop("status", None)
        every = policy["spec"]["validations"]
        variants = [("all", every), ("none", [{"expression": "true"}])] + [
            (f"only {i}: {v['messageExpression'][:48]}", [v]) for i, v in enumerate(every)]
        if args.shapes:  # the same checks, fewer programs: what the API server's per-expression work costs
            merged = " || ".join(v["expression"][1:] for v in every)  # each is !variables.failedN
            variants = [
                *[("all", every), ("all, constant messages", [{**v, "messageExpression": "'x'"} for v in every]),
                  ("all, one validation", [{"expression": f"!({merged})", "messageExpression": "'x'"}]),
                  ("none", [{"expression": "true"}])] * args.shapes]
        for name, validations in variants:
            variant = copy.deepcopy(policy)
            variant["spec"]["validations"] = validations
            cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(variant))
            time.sleep(2.5)  # the API server reloads the policy
            measure(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
