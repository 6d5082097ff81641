"""`gpu-webhook`: serve | certs | check | lint | test | rules | audit | doctor | usage.

Exit codes (every command): 0 all allowed / valid, 1 something denied / invalid / a test failed,
2 usage or input errors (a file that cannot be read or parsed, named with its line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from webhook.admission.loader import load_policy
from webhook.cli import rule_tests
from webhook.policy import checking, native
from webhook.policy.manifests_io import ManifestError, read_manifests
from webhook.policy.rules import RULES, Policy, RuleError

EXIT_OK, EXIT_DENIED, EXIT_USAGE = 0, 1, 2
RULES_ENV = "GPU_WEBHOOK_RULES"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_USAGE
    try:
        code: int = args.func(args)
        return code
    except RuleError as err:
        print(f"gpu-webhook: invalid rules: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-webhook", description="GPU resource policy for Kubernetes.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_check(sub)
    _add_lint(sub)
    _add_test(sub)
    _add_rules(sub)
    for module in ("webhook.cli.server", "webhook.cli.cluster", "webhook.cli.usage", "webhook.cli.policies"):
        _register_optional(module, sub)
    return parser


def _register_optional(module: str, sub: Any) -> None:
    """Subcommands that live beside their own code (serve/certs, audit/doctor)."""
    import importlib

    try:
        importlib.import_module(module).register(sub)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise


def rules_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rules", type=Path, default=None, metavar="DIR",
                        help=f"rule directory (default: ${RULES_ENV}, else the rules shipped with gpu-webhook)")


def resolve_rules(path: Path | None) -> Path | None:
    """--rules, else $GPU_WEBHOOK_RULES, else None (the packaged rules)."""
    if path is not None:
        return path
    env = os.environ.get(RULES_ENV)
    return Path(env) if env else None


# --------------------------------------------------------------------------------------------- check


def _add_check(sub: Any) -> None:
    p = sub.add_parser("check", help="evaluate manifests offline with the webhook's engine",
                       description="Evaluate Pods and workload manifests exactly as the webhook would on CREATE.")
    p.add_argument("files", nargs="+", metavar="FILE", help="YAML or JSON manifests; - reads standard input")
    p.add_argument("-n", "--namespace", default=None,
                   help="namespace for objects that name none (default: the object's, else 'default')")
    p.add_argument("-o", "--output", choices=("human", "yaml", "json"), default="human")
    p.add_argument("--nodes", metavar="FILE", default=None,
                   help="the live nodes, as `kubectl get nodes -o json` (a List, or YAML; - reads standard input; "
                        "add runtimeclasses,namespaces to the dump to check those too): decide with the cluster-aware "
                        "checks on, as the server does with --cluster")
    rules_arg(p)
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    policy = load_policy(resolve_rules(args.rules))
    try:
        if args.nodes == "-" and "-" in args.files:
            raise ManifestError("standard input can be read once: give the manifests or --nodes as a file")
        dump = _read_nodes(policy, args.nodes) if args.nodes else None
        results = checking.check_sources(policy, _read_inputs(args.files), args.namespace,
                                         inventory=dump.snapshot if dump else None)
    except (ManifestError, OSError) as err:
        print(f"gpu-webhook check: {err}", file=sys.stderr)
        return EXIT_USAGE
    out = sys.stdout
    if dump is not None:
        (out if args.output == "human" else sys.stderr).write(_describe_nodes(policy, args.nodes, dump))
    if args.output == "json":
        json.dump([r.to_json() for r in results], out, indent=2)
        out.write("\n")
    elif args.output == "yaml":
        yaml.safe_dump_all([dict(r.patched) for r in results], out, sort_keys=False)
    else:
        _print_human(policy, results, out)
    return EXIT_OK if all(r.verdict.allowed for r in results) else EXIT_DENIED


def _read_inputs(names: Sequence[str]) -> list[tuple[str, str]]:
    sources = []
    for name in names:
        if name == "-":
            sources.append(("<stdin>", sys.stdin.read()))
            continue
        try:
            sources.append((name, Path(name).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as err:
            raise ManifestError(f"{name}: cannot be read ({err})") from None
    return sources


def _read_nodes(policy: Policy, name: str) -> checking.NodeDump:
    [(source, text)] = _read_inputs([name])
    objects = [m.obj for m in read_manifests(source, text)]
    return checking.snapshot_from_objects(policy, source, objects)


def _describe_nodes(policy: Policy, name: str, dump: checking.NodeDump) -> str:
    nodes = dump.snapshot.nodes
    ready = [n for n in nodes if n.ready]
    gpus = [n for n in ready if any(v > 0 and policy.gpu_resource(r) for r, v in n.allocatable.items())]
    lines = [f"nodes: {len(nodes)} from {'<stdin>' if name == '-' else name} ({len(ready)} Ready, {len(gpus)} of them "
             f"advertising GPUs)"]
    lines += [f"nodes: {note}" for note in dump.notes]
    return "\n".join(lines) + "\n"


# Kinds with no namespace, shown by name alone (the API server ignores a namespace given for them).
CLUSTER_SCOPED = frozenset({
    "Namespace", "Node", "RuntimeClass", "DeviceClass", "ResourceSlice", "PriorityClass", "StorageClass",
    "PersistentVolume", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
})


def _print_human(policy: Policy, results: Sequence[checking.Result], out: TextIO) -> None:
    denied = sum(not r.verdict.allowed for r in results)
    for r in results:
        status = "DENIED " if not r.verdict.allowed else ("WARN   " if r.verdict.warnings else "ALLOWED")
        gpu = f", {r.verdict.gpus} GPU" if r.verdict.gpus else ""
        gpu += f", class {r.verdict.gpu_class}" if r.verdict.gpu_class else ""
        where = r.name if r.kind in CLUSTER_SCOPED else f"{r.namespace}/{r.name}"
        out.write(f"{status} {r.kind} {where} ({r.manifest.where()}{gpu})\n")
        for line in r.verdict.choices:
            out.write(f"  class: {line}\n")
        for finding in r.verdict.violations:
            out.write(f"  deny: {finding.render()}\n")
        for finding in r.verdict.warnings:
            out.write(f"  warn: {finding.render()}\n")
        for line in checking.describe_edits(r.patch):
            out.write(f"  inject: {line}\n")
        for line in r.template_injections:
            out.write(f"  pods of this template get: {line}\n")
    out.write(f"\n{len(results)} object(s): {len(results) - denied} allowed, {denied} denied (rules {policy.digest})\n")


# --------------------------------------------------------------------------------------------- lint / rules


def _add_lint(sub: Any) -> None:
    p = sub.add_parser("lint", help="validate a rule directory",
                       description="Validate rule files against the schema and each other; exit 1 when invalid.")
    p.add_argument("dir", nargs="?", type=Path, default=None, help="rule directory (default: as for --rules)")
    p.set_defaults(func=run_lint)


def run_lint(args: argparse.Namespace) -> int:
    directory = resolve_rules(args.dir)
    try:
        policy = load_policy(directory)
    except RuleError as err:
        print(f"gpu-webhook lint: {err}", file=sys.stderr)
        return EXIT_DENIED
    axes = "; ".join(f"{a.name} ({a.label}): {', '.join(a.values)}" for a in policy.axes)
    print(f"ok: {len(policy.sources)} file(s), rules {policy.digest}; classes: {axes or '(none)'}")
    return EXIT_OK


def _add_rules(sub: Any) -> None:
    p = sub.add_parser("rules", help="list the rule ids and how the current rules enforce them")
    rules_arg(p)
    p.set_defaults(func=run_rules)


_RUNS = {"native": "in the API server", "webhook": "in the webhook only", "both": "in the API server and the webhook"}


def run_rules(args: argparse.Namespace) -> int:
    policy = load_policy(resolve_rules(args.rules))
    for rule, (default, what) in RULES.items():
        where, why = native.placement_of(rule)
        print(f"{rule:32} {policy.enforcement_of(rule):5} (default {default:4})  {what}\n"
              f"{'':32} native mode: {_RUNS[where]}: {why}")
    for line in _dra_lines(policy):
        print(line)
    return EXIT_OK


def _dra_lines(policy: Policy) -> list[str]:
    """The DRA part of the loaded rules: the GPU DeviceClasses with their limits, the selectors each class value
    adds to a claim's request, and the namespaces that may use adminAccess."""
    dra = policy.dra
    if not dra.device_classes:
        return ["", "DRA: no GPU DeviceClasses in the rules (gpuDeviceClasses, dra.deviceClasses): claims are not "
                    "judged"]
    lines = ["", "DRA: GPU DeviceClasses"]
    for name, rule in sorted(dra.device_classes.items()):
        said = [f"maxDevices {rule.max_devices}" if rule.max_devices is not None else "no maxDevices",
                "allocationMode All allowed" if rule.allow_all else "allocationMode All denied"]
        if rule.extended_resource_name:
            said.append(f"extendedResourceName {rule.extended_resource_name}")
        if not rule.classes:
            said.append("class map not applied")
        lines.append(f"  {name:30} {', '.join(said)}")
    selectors = [(axis.name, value, device_class, expression) for axis in policy.axes
                 for value, contribution in axis.values.items()
                 for device_class, expression in sorted(contribution.device_selectors.items())]
    if selectors:
        lines.append("DRA: selectors added to a claim's GPU request that has none (class value -> DeviceClass: CEL)")
        lines.extend(f"  {axis} {value} -> {device_class}: {expression}" for axis, value, device_class, expression
                     in selectors)
    admin = ", ".join(sorted(dra.admin_access_namespaces)) or "(none besides the exempt namespaces)"
    lines.append(f"DRA: adminAccess allowed in: {admin}")
    return lines


# --------------------------------------------------------------------------------------------- test


def _add_test(sub: Any) -> None:
    p = sub.add_parser("test", help="run rule test cases kept as data (like `kyverno test`)",
                       description="Run every *.yaml test file (kind GPUPolicyTest) under DIR.")
    p.add_argument("dir", type=Path, help="directory of GPUPolicyTest files (searched recursively)")
    p.add_argument("-v", "--verbose", action="store_true", help="print passing cases too")
    p.set_defaults(func=run_test)


def run_test(args: argparse.Namespace) -> int:
    try:
        outcomes = rule_tests.run_directory(args.dir)
    except (rule_tests.TestFileError, ManifestError) as err:
        print(f"gpu-webhook test: {err}", file=sys.stderr)
        return EXIT_USAGE
    failed = [o for o in outcomes if o.problems]
    for outcome in outcomes:
        if outcome.problems or args.verbose:
            print(f"{'FAIL' if outcome.problems else 'ok  '} {outcome.where}: {outcome.name}")
            for problem in outcome.problems:
                print(f"     {problem}")
            for line in outcome.chosen if args.verbose else ():
                print(f"     class: {line}")
    print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return EXIT_DENIED if failed else EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
