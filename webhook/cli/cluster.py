"""The `audit` and `doctor` subcommands (`register(subparsers)`): the engine against a live cluster.

Exit codes, like `check`:
  audit   0 nothing would be denied, 1 something would be denied, 2 usage or input error (rules, kubeconfig,
          API server unreachable or forbidden).
  doctor  0 nothing on the Pod's path is broken, 1 a step failed (the report says which), 2 usage or input
          error (no such Pod, rules, kubeconfig, API server unreachable or forbidden).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from webhook.admission.loader import load_policy
from webhook.cli import usage as usage_cli
from webhook.cli.main import EXIT_DENIED, EXIT_OK, EXIT_USAGE, resolve_rules, rules_arg
from webhook.cluster import audit, doctor

MARKS = {"ok": "ok  ", "info": "info", "warn": "WARN", "fail": "FAIL"}


def register(subparsers: Any) -> None:
    """Add `audit` and `doctor` to an argparse subparsers object (each sets `func`)."""
    p = subparsers.add_parser(
        "audit", help="judge what runs in the cluster with the current or a proposed rule directory",
        description="Evaluate running Pods and workload templates with the webhook's engine (as a CREATE) and "
        "report who the rules would deny or warn, grouped by namespace and rule. Exit 0: nothing denied, "
        "1: something denied, 2: usage or input error.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="one namespace (default: the kubeconfig context's)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("-o", "--output", choices=("human", "json"), default="human")
    _cluster_args(p)
    usage_cli.add_audit_args(p)
    p.set_defaults(func=run_audit)

    d = subparsers.add_parser(
        "doctor", help="explain where a GPU Pod's path breaks, with the evidence",
        description="Walk a GPU Pod's path (advertised resources, device plugin, matching nodes and free GPUs, "
        "placement, events, RuntimeClass, this webhook's decision). Exit 0: nothing broken, 1: a step "
        "failed, 2: usage or input error (no such Pod, API server unreachable).")
    d.add_argument("pod", metavar="POD", help="the Pod's name (pod/NAME is accepted)")
    d.add_argument("-n", "--namespace", help="the Pod's namespace (default: the kubeconfig context's)")
    d.add_argument("-o", "--output", choices=("human", "json"), default="human")
    _cluster_args(d)
    usage_cli.add_doctor_args(d)
    d.set_defaults(func=run_doctor)


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default: $KUBECONFIG, else "
                        "~/.kube/config, else the in-cluster ServiceAccount)")
    parser.add_argument("--context", help="kubeconfig context (default: the current context)")
    rules_arg(parser)


def _fail(command: str, message: str) -> int:
    print(f"gpu-webhook {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def run_audit(args: argparse.Namespace) -> int:
    from webhook.cluster import kube, reads  # imported on use: `gpu-webhook serve` builds this parser too

    policy = load_policy(resolve_rules(args.rules))
    try:
        api = kube.api_client(args.kubeconfig, context=args.context)
        namespace = None if args.all_namespaces else (args.namespace or kube.context_namespace(args.kubeconfig,
                                                                                              args.context))
        objects = reads.read_workloads(api, namespace)
        claims, notes = reads.read_claims(api, namespace)
        for note in notes:
            print(f"gpu-webhook audit: note: {note}", file=sys.stderr)
        try:
            snapshot = reads.read_snapshot(api)
        except kube.KubeError as err:
            if err.status != 403:
                raise
            print(f"gpu-webhook audit: note: inventory checks skipped ({err})", file=sys.stderr)
            snapshot = None
    except kube.KubeError as err:
        return _fail("audit", str(err))
    result = audit.audit(policy, [*objects, *claims], snapshot)
    try:
        measured = usage_cli.audit_usage(args, policy, namespace, objects)
    except usage_cli.Failure as err:
        return _fail("audit", str(err))
    if args.output == "json":
        json.dump({**result.to_json(), **({"usage": measured.to_json()} if measured else {})}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        audit.render(result, sys.stdout)
        if measured:
            sys.stdout.write("\n")
            usage_cli.render(measured, sys.stdout, usage_cli.prometheus_url(args, policy) or "")
    return EXIT_DENIED if result.denied else EXIT_OK


def run_doctor(args: argparse.Namespace) -> int:
    from webhook.cluster import kube, reads  # imported on use: `gpu-webhook serve` builds this parser too

    policy = load_policy(resolve_rules(args.rules))
    name = args.pod.split("/", 1)[1] if args.pod.lower().startswith(("pod/", "pods/")) else args.pod
    try:
        api = kube.api_client(args.kubeconfig, context=args.context)
        namespace = args.namespace or kube.context_namespace(args.kubeconfig, args.context)
        facts = reads.read_doctor_facts(api, namespace, name)
    except kube.KubeError as err:
        return _fail("doctor", str(err))
    if facts is None:
        return _fail("doctor", f'pods "{name}" not found in namespace {namespace}; if it was never created, look '
                     "for FailedCreate events on its ReplicaSet or Job: kubectl get events -n "
                     f"{namespace} --field-selector reason=FailedCreate")
    report = doctor.diagnose(policy, facts)
    measured = usage_cli.doctor_usage(args, policy, facts.pod, [*facts.owners, *facts.pods])
    if args.output == "json":
        json.dump({**report.to_json(), **({"usage": measured} if measured else {})}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_report(report, sys.stdout)
        sys.stdout.writelines(f"{line}\n" for line in measured)
    return EXIT_DENIED if report.broken else EXIT_OK


def render_report(report: doctor.Report, out: TextIO) -> None:
    out.write(f"Pod {report.pod}\n")
    for step in report.steps:
        out.write(f"[{MARKS[step.status]}] {step.title}: {step.summary}\n")
        for line in step.evidence:
            out.write(f"         {line}\n")
    out.write(f"\nConclusion: {report.conclusion}\n")
