"""What the CEL expressions of the native policies cost by themselves, one at a time. Prints numbers; not a test.

    python bench/native_cel_micro.py [--against CHECKOUT]

Builds bench/native_cel (Go: kube-apiserver's CEL libraries, k8s.io/apiserver v0.36.3, from the Go module cache:
GOPROXY=file://$GOMODCACHE/cache/download, which tests/e2e/build.sh has filled) and times every matchCondition,
variable, validation and message of the MutatingAdmissionPolicy (on a one-GPU Pod as created) and of the two
ValidatingAdmissionPolicies (on that Pod after the MAP: the class's nodeSelector, runtimeClassName and toleration),
each expression on its own with the variables before it precomputed, 2,000 evaluations each. That is the
expressions' own share; the API server adds the activations, the conversion of the object and the params, the
JSONPatch and the cost tracking (bench/native_profile.py measures the whole). `--against CHECKOUT` also times
another tree's policies (rendered by its webhook package) for a side-by-side.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GEN = r'''
import json, sys
from pathlib import Path
from webhook.admission.loader import load_policy
from webhook.policy import native, native_cel
pre, post = json.loads(sys.argv[2]), json.loads(sys.argv[3])
policies = {p["metadata"]["name"]: p for p in native_cel.policies() if p["kind"].endswith("AdmissionPolicy")}
runs = []
for name, obj in ((native_cel.MUTATING_NAME, pre), *((n, post) for n in native_cel.VALIDATING_NAMES.values())):
    spec = policies[name]["spec"]
    runs.append({"name": name, "object": obj, "conds": [c["expression"] for c in spec["matchConditions"]],
                 "vars": [(v["name"], v["expression"]) for v in spec.get("variables", [])],
                 "exprs": [e for v in spec.get("validations", []) for e in (v["expression"], v["messageExpression"])]})
params = native.params(load_policy(Path(sys.argv[1])))
print(json.dumps({"params": {"spec": params}, "runs": runs}))
'''


def _pods() -> tuple[dict, dict]:
    tolerations = [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 300}, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pre = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "profile"},
           "spec": {"restartPolicy": "Never", "schedulerName": "default-scheduler", "tolerations": tolerations,
                    "containers": [{"name": "cuda", "image": "x", "resources": {
                        "limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}}
    post = copy.deepcopy(pre)
    post["spec"].update({"runtimeClassName": "nvidia", "nodeSelector": {"workload": "inference", "gpu-type": "t4"}})
    post["metadata"]["annotations"] = {"gpu-webhook.io/class": "workload=inference,gpu-type=t4"}
    return pre, post


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, metavar="CHECKOUT", help="also time another tree's policies")
    args = parser.parse_args()
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": f"file://{cache}/cache/download", "GOSUMDB": "off"}
    with tempfile.TemporaryDirectory(prefix="native-cel-") as tmp:
        binary = Path(tmp) / "native_cel"
        subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / "native_cel", env=env, check=True)
        pre, post = _pods()
        for tree in [HERE.parent, *([args.against] if args.against else [])]:
            rendered = subprocess.run([sys.executable, "-c", GEN, str(HERE.parent / "rules"), json.dumps(pre),
                                       json.dumps(post)], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                      capture_output=True, text=True, check=True).stdout
            (Path(tmp) / "input.json").write_text(rendered)
            print(f"### policies of {tree}", flush=True)
            subprocess.run([str(binary), str(Path(tmp) / "input.json")], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
