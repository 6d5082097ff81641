"""`gpu-webhook policies render`: the rules as Kubernetes admission policies (native mode), for GitOps.

Prints, like `helm template`, every object native mode needs in apply order: the `GPUClassMap` CRD, the
params object rendered from the rule directory, the MutatingAdmissionPolicy and the two
ValidatingAdmissionPolicies with their bindings (see `webhook.policy.native`). Apply the output with
`kubectl apply -f` (twice on a fresh cluster, or `--server-side` after the CRD is established: the params object
needs its CRD). A rule edit changes only the `GPUClassMap` object.

Hybrid mode (`--mode hybrid`) runs the same objects, plus the webhook narrowed to what native mode defers: the
mutating webhook gets the match conditions of `native.hybrid_match_conditions`. Those are not objects of their
own, so two other formats carry them:

- `--format helm-values`: a values file for the Helm chart (`mode`, `native.params`: the GPUClassMap, and
  `native.hybridMatchConditions`), passed with `helm install -f`. The chart holds the static objects (CRD,
  policies, bindings) itself; what depends on the rules comes from this file.
- `--format webhook-patch`: the JSON patch (RFC 6902) that adds the conditions to the MutatingWebhookConfiguration,
  for a kustomize overlay's `patches:` (what manifests/components/hybrid holds for the shipped rules).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from webhook.admission.loader import load_policy
from webhook.policy import native
from webhook.policy.rules import Policy

EXIT_OK, EXIT_DENIED = 0, 1
FORMATS = ("manifests", "helm-values", "webhook-patch")
# Where the conditions go: after the webhook's own (not-a-mirror-pod), on its one webhook.
WEBHOOK_PATCH_PATH = "/webhooks/0/matchConditions/-"
# The header's second line: what to do with the output.
USE = {
    "manifests": "# edit the rule files and render again (only the GPUClassMap changes). "
                 "See docs/native-policy.md.\n",
    "helm-values": "# pass it to the chart: helm upgrade --install gpu-webhook charts/gpu-webhook -f <this file>;\n"
                   "# render it again after every rule edit. See docs/native-policy.md.\n",
    "webhook-patch": "# a kustomize overlay's patches: [{path: <this file>, target: "
                     "{kind: MutatingWebhookConfiguration, name: gpu-webhook}}].\n",
}


def register(sub: Any) -> None:
    p = sub.add_parser("policies", help="the rules as MutatingAdmissionPolicy/ValidatingAdmissionPolicy (native mode)")
    inner = p.add_subparsers(dest="policies_command", metavar="ACTION", required=True)
    render = inner.add_parser("render", help="print the native-mode objects as YAML (like `helm template`)",
                              description="Print the CRD, params, policies and bindings of native mode as YAML, "
                                          "or the Helm values / kustomize patch of native and hybrid mode.")
    from webhook.cli.main import rules_arg

    rules_arg(render)
    render.add_argument("--mode", choices=["native", "hybrid"], default="native",
                        help="native: every rule that compiles runs in the API server, no webhook; hybrid: the "
                             "same, plus the webhook for the cluster-aware rules and the Pods native mode defers")
    render.add_argument("--format", choices=FORMATS, default="manifests", dest="output_format",
                        help="manifests: the objects, for kubectl apply (the default); helm-values: a values file "
                             "for the chart (helm install -f); webhook-patch: the JSON patch that narrows the "
                             "mutating webhook in hybrid mode (for a kustomize overlay)")
    render.set_defaults(func=run_render)


def helm_values(policy: Policy, mode: native.Mode) -> dict[str, Any]:
    """The chart's values for `mode`: the params object and (hybrid) the mutating webhook's extra conditions."""
    conditions = native.hybrid_match_conditions(policy) if mode == "hybrid" else []
    return {"mode": mode, "native": {"params": native.params_object(policy), "hybridMatchConditions": conditions}}


def webhook_patch(policy: Policy) -> list[dict[str, Any]]:
    """RFC 6902 operations adding the hybrid conditions to the (single) mutating webhook."""
    return [{"op": "add", "path": WEBHOOK_PATCH_PATH, "value": condition}
            for condition in native.hybrid_match_conditions(policy)]


def run_render(args: argparse.Namespace) -> int:
    from webhook.cli.main import resolve_rules

    policy = load_policy(resolve_rules(args.rules))
    if args.output_format == "webhook-patch" and args.mode != "hybrid":
        print("gpu-webhook policies render: --format webhook-patch narrows the mutating webhook of hybrid mode; "
              "add --mode hybrid (native mode has no webhook)", file=sys.stderr)
        return EXIT_DENIED
    try:
        if args.output_format == "helm-values":
            body = yaml.safe_dump(helm_values(policy, args.mode), sort_keys=False, width=120)
        elif args.output_format == "webhook-patch":
            body = yaml.safe_dump(webhook_patch(policy), sort_keys=False, width=120)
        else:
            body = yaml.safe_dump_all(native.render(policy, args.mode), sort_keys=False, width=120)
    except native.NativeError as err:
        print(f"gpu-webhook policies render: these rules cannot run natively: {err}", file=sys.stderr)
        return EXIT_DENIED
    use = USE[args.output_format]
    if args.output_format == "manifests" and args.mode == "hybrid":
        use += ("# Hybrid mode also narrows the mutating webhook: --format webhook-patch (kustomize) or "
                "--format helm-values (the chart).\n")
    header = (f"# Generated by `gpu-webhook policies render` from rules {policy.digest}: do not edit by hand;\n"
              + use)
    sys.stdout.write(header + body)
    return EXIT_OK
