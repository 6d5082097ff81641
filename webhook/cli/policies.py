"""`gpu-webhook policies render`: the rules as Kubernetes admission policies (native mode), for GitOps.

Prints, like `helm template`, every object native mode needs in apply order: the `GPUClassMap` CRD, the
params object rendered from the rule directory, the MutatingAdmissionPolicy and the two
ValidatingAdmissionPolicies with their bindings (see `webhook.policy.native`). Apply the output with
`kubectl apply -f` (twice on a fresh cluster, or `--server-side` after the CRD is established: the params object
needs its CRD). A rule edit changes only the `GPUClassMap` object.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from webhook.admission.loader import load_policy
from webhook.policy import native

EXIT_OK, EXIT_DENIED = 0, 1


def register(sub: Any) -> None:
    p = sub.add_parser("policies", help="the rules as MutatingAdmissionPolicy/ValidatingAdmissionPolicy (native mode)")
    inner = p.add_subparsers(dest="policies_command", metavar="ACTION", required=True)
    render = inner.add_parser("render", help="print the native-mode objects as YAML (like `helm template`)",
                              description="Print the CRD, params, policies and bindings of native mode as YAML.")
    from webhook.cli.main import rules_arg

    rules_arg(render)
    render.add_argument("--mode", choices=["native"], default="native",
                        help="native: every rule that compiles runs in the API server (the only mode rendered so far)")
    render.set_defaults(func=run_render)


def run_render(args: argparse.Namespace) -> int:
    from webhook.cli.main import resolve_rules

    policy = load_policy(resolve_rules(args.rules))
    try:
        objects = native.render(policy, args.mode)
    except native.NativeError as err:
        print(f"gpu-webhook policies render: these rules cannot run natively: {err}", file=sys.stderr)
        return EXIT_DENIED
    header = (f"# gpu-webhook native-mode policies, rendered from rules {policy.digest} "
              f"({', '.join(policy.sources) or 'packaged rules'}); apply with kubectl apply -f\n")
    sys.stdout.write(header + yaml.safe_dump_all(objects, sort_keys=False, width=120))
    return EXIT_OK
