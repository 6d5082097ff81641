"""Rule test cases kept as data (`gpu-webhook test DIR`), in the spirit of `kyverno test` and `gator verify`.

A test file is YAML of kind `GPUPolicyTest`:

    apiVersion: gpu-webhook.io/v1alpha1
    kind: GPUPolicyTest
    rules: ../../rules            # optional, relative to this file; default: the packaged rules
    cases:
      - name: plain GPU pod gets the default class
        namespace: team-a         # optional (default: the object's own, else "default")
        operation: CREATE         # optional: CREATE | UPDATE | DELETE | CONNECT
        mode: mutate              # optional: mutate | validate
        object: {...}             # the manifest inline, or
        file: pods/plain.yaml     # a manifest file relative to this test file (its first object)
        nodes: nodes/h200.json    # optional: the live cluster (`kubectl get nodes -o json`, relative to this
                                  # file, or a list of Node objects): the cluster-aware checks then run, as in
                                  # `check --nodes` (RuntimeClasses the rules name are taken to exist)
        expect:
          allowed: true
          violations: [rule-id]   # the exact set of denying rule ids (default: none)
          warnings: [rule-id]     # the exact set of warning rule ids, when given
          class: workload=inference,gpu-type=t4
          chosen: [gpu-type=a100 from the Pod's own selection]  # each a part of one line of how the class was chosen
          patched: {...}          # must be contained in the object after the patch (lists: each item found)
          absent: [/spec/affinity]  # JSON Pointers that must not exist after the patch
          patch: false            # true: a patch is expected; false: none

Every case is also re-evaluated on its own patched output: a second patch is a failure (idempotence).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

import jsonpointer
import yaml

from webhook.admission.loader import load_policy
from webhook.policy.checking import decide, namespace_of, snapshot_from_objects
from webhook.policy.findings import Mode, Operation
from webhook.policy.inventory import Snapshot
from webhook.policy.manifests_io import ManifestError, read_manifests
from webhook.policy.rules import Policy, RuleError

KIND = "GPUPolicyTest"


class TestFileError(ValueError):
    """A test file that cannot be run; the message names the file and the case."""

    __test__ = False


@dataclass(frozen=True)
class CaseOutcome:
    where: str
    name: str
    problems: tuple[str, ...]
    chosen: tuple[str, ...] = ()  # how each class axis was chosen (`test -v` prints it)


def run_directory(directory: Path) -> list[CaseOutcome]:
    """Run every GPUPolicyTest file below `directory`, in path order."""
    files = sorted(p for p in directory.rglob("*.y*ml") if _is_test_file(p))
    if not files:
        raise TestFileError(f"{directory}: no {KIND} files found (YAML files with kind: {KIND})")
    outcomes: list[CaseOutcome] = []
    policies: dict[Path | None, Policy] = {}
    for path in files:
        outcomes.extend(run_file(path, policies))
    return outcomes


def _is_test_file(path: Path) -> bool:
    try:
        head = path.read_text(encoding="utf-8")[:2000]
    except (OSError, UnicodeDecodeError):
        return False
    return f"kind: {KIND}" in head


def run_file(path: Path, policies: dict[Path | None, Policy] | None = None) -> list[CaseOutcome]:
    policies = {} if policies is None else policies
    try:
        body = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise TestFileError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(body, Mapping) or body.get("kind") != KIND or not isinstance(body.get("cases"), list):
        raise TestFileError(f"{path}: expected kind {KIND} with a list of cases")
    rules_dir = (path.parent / str(body["rules"])).resolve() if body.get("rules") else None
    if rules_dir not in policies:
        try:
            policies[rules_dir] = load_policy(rules_dir)
        except RuleError as err:
            raise TestFileError(f"{path}: rules: {body['rules']!r}: {err}") from None
    policy = policies[rules_dir]
    return [_run_case(policy, path, index, case) for index, case in enumerate(body["cases"], start=1)]


def _run_case(policy: Policy, path: Path, index: int, case: Any) -> CaseOutcome:
    if not isinstance(case, Mapping) or not isinstance(case.get("expect"), Mapping):
        raise TestFileError(f"{path}: case {index}: needs a mapping with `expect`")
    name = str(case.get("name") or f"case {index}")
    obj = _case_object(path, index, case)
    namespace = str(case.get("namespace") or namespace_of(obj, None))  # as `check` does without --namespace
    operation, mode = case.get("operation", "CREATE"), case.get("mode", "mutate")
    if operation not in get_args(Operation) or mode not in get_args(Mode):
        raise TestFileError(f"{path}: case {index}: operation must be one of {', '.join(get_args(Operation))} and "
                            f"mode one of {', '.join(get_args(Mode))}; got {operation!r}, {mode!r}")
    nodes = _case_nodes(policy, path, index, case)
    outcome = decide(policy, obj, namespace, operation, mode, inventory=nodes)
    problems = _compare(case["expect"], outcome.verdict, outcome.patch, outcome.patched)
    if outcome.patch:
        again = decide(policy, outcome.patched, namespace, operation, mode, inventory=nodes)
        if again.patch:
            problems.append(f"not idempotent: a second pass patches again: {again.patch}")
    return CaseOutcome(f"{path}#{index}", name, tuple(problems), outcome.verdict.choices)


def _case_nodes(policy: Policy, path: Path, index: int, case: Mapping[str, Any]) -> Snapshot | None:
    nodes = case.get("nodes")
    if nodes is None:
        return None
    where = f"{path}: case {index}: nodes"
    if isinstance(nodes, list):
        objects = [n for n in nodes if isinstance(n, Mapping)]
    else:
        target = path.parent / str(nodes)
        try:
            objects = [m.obj for m in read_manifests(str(target), target.read_text(encoding="utf-8"))]
        except (OSError, UnicodeDecodeError) as err:
            raise TestFileError(f"{where}: {target} cannot be read ({err}); `nodes` is relative to the test "
                                "file") from None
    try:
        return snapshot_from_objects(policy, where, objects).snapshot
    except ManifestError as err:
        raise TestFileError(str(err)) from None


def _case_object(path: Path, index: int, case: Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(case.get("object"), Mapping):
        return cast(Mapping[str, Any], case["object"])
    if case.get("file"):
        target = path.parent / str(case["file"])
        try:
            text = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TestFileError(f"{path}: case {index}: file {target} cannot be read ({err}); `file` is relative "
                                "to the test file") from None
        manifests = read_manifests(str(target), text)
        if manifests:
            return manifests[0].obj
        raise TestFileError(f"{path}: case {index}: file {target} holds no Kubernetes object")
    raise TestFileError(f"{path}: case {index}: give the manifest as `object` or `file`")


def _compare(expect: Mapping[str, Any], verdict: Any, patch: list[dict[str, Any]],
             patched: Mapping[str, Any]) -> list[str]:
    problems = []
    if "allowed" in expect and bool(expect["allowed"]) != verdict.allowed:
        problems.append(f"allowed: expected {expect['allowed']}, got {verdict.allowed} ({verdict.message()})")
    got_violations = sorted({f.rule for f in verdict.violations})
    if sorted(set(expect.get("violations") or [])) != got_violations:
        problems.append(f"violations: expected {sorted(expect.get('violations') or [])}, got {got_violations}")
    if "warnings" in expect:
        got_warnings = sorted({f.rule for f in verdict.warnings})
        if sorted(set(expect["warnings"] or [])) != got_warnings:
            problems.append(f"warnings: expected {sorted(expect['warnings'] or [])}, got {got_warnings}")
    if "class" in expect and expect["class"] != verdict.gpu_class:
        problems.append(f"class: expected {expect['class']}, got {verdict.gpu_class}")
    for told in expect.get("chosen") or []:
        if not any(str(told) in line for line in verdict.choices):
            problems.append(f"chosen: no line contains {told!r}; the class was chosen: {'; '.join(verdict.choices)}")
    if "patch" in expect and bool(expect["patch"]) != bool(patch):
        problems.append(f"patch: expected {'one' if expect['patch'] else 'none'}, got {patch}")
    if "patched" in expect and not contains(patched, expect["patched"]):
        problems.append(f"patched object does not contain {expect['patched']}")
    for pointer in expect.get("absent") or []:
        if jsonpointer.resolve_pointer(patched, pointer, None) is not None:
            problems.append(f"{pointer} should be absent after the patch")
    return problems


def contains(actual: Any, expected: Any) -> bool:
    """Whether `expected` is a part of `actual`: maps by key, lists item by item (in any order)."""
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(k in actual and contains(actual[k], v) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(actual, list) and all(any(contains(a, e) for a in actual) for e in expected)
    return bool(actual == expected)
