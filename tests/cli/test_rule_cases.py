"""The rule cases kept as data (tests/rule-cases, run by `gpu-webhook test`): one pytest id per case.

Also: every rule id has a case in which it fires, and the real CLI passes on the cases and fails (exit 1,
the problem printed) on a deliberately wrong case directory.
"""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from webhook.cli.rule_tests import CaseOutcome, run_directory
from webhook.policy.rules import RULES

REPO = Path(__file__).resolve().parents[2]
# The checks the engine makes on an object alone. Ids added later (cluster-inventory checks need a node
# snapshot that GPUPolicyTest cannot give) are reported as skipped until a case exists for them.
# The rules judged from the object alone. The inventory rules (gpu-never-schedulable, gpu-class-no-node,
# gpu-runtime-class-missing, gpu-inventory-unavailable) need a cluster snapshot, which a GPUPolicyTest case
# cannot state; tests/policy/test_inventory.py covers them with snapshot tables.
ENGINE_RULES = frozenset({
    "gpu-limits-required", "gpu-requests-equal-limits", "gpu-whole-number", "gpu-quantity-invalid",
    "gpu-pod-level-resources", "gpu-per-container-max", "gpu-class-max", "gpu-class-unknown",
    "gpu-class-not-allowed", "gpu-class-conflict", "gpu-class-missing", "gpu-env-without-request",
    "gpu-runtime-without-request", "gpu-toleration-without-request", "gpu-node-name-preset", "gpu-class-skipped",
    "gpu-time-sliced-max",  # judged against the case's `nodes`
    # DRA claims and templates (tests/rule-cases/dra); dra-pod-max and dra-double-allocation against the case's
    # `nodes`, which also hold the ResourceClaimTemplates the Pods name
    "dra-claim-max", "dra-pod-max", "dra-allocation-all", "dra-admin-access", "dra-class-not-allowed",
    "dra-selector-conflict", "dra-double-allocation",
})
CASES = REPO / "tests" / "rule-cases"
FAILING = REPO / "tests" / "data" / "failing-rule-cases"


def _case_files() -> list[Path]:
    return sorted(p for p in CASES.rglob("*.yaml") if "kind: GPUPolicyTest" in p.read_text(encoding="utf-8"))


def _declared_cases() -> list[tuple[str, str, dict]]:
    """(where as run_directory names it, case name, case) for every case of every test file."""
    out = []
    for path in _case_files():
        body = yaml.safe_load(path.read_text(encoding="utf-8"))
        for index, case in enumerate(body["cases"], start=1):
            out.append((f"{path}#{index}", str(case.get("name") or f"case {index}"), case))
    return out


@cache
def _outcomes() -> dict[str, CaseOutcome]:
    return {o.where: o for o in run_directory(CASES)}


DECLARED = _declared_cases()


@pytest.mark.parametrize(
    "where",
    [pytest.param(where, id=f"{Path(where).relative_to(CASES)}:{name}") for where, name, _ in DECLARED],
)
def test_rule_case(where: str) -> None:
    outcome = _outcomes()[where]
    assert not outcome.problems, f"{outcome.where}: {outcome.name}\n" + "\n".join(outcome.problems)


def test_every_declared_case_ran() -> None:
    assert sorted(_outcomes()) == sorted(where for where, _, _ in DECLARED)


@pytest.mark.parametrize("rule", [pytest.param(r, id=r) for r in RULES if r in ENGINE_RULES])
def test_every_rule_id_has_a_case_where_it_fires(rule: str) -> None:
    firing = [name for _, name, case in DECLARED
              if rule in (case["expect"].get("violations") or []) or rule in (case["expect"].get("warnings") or [])]
    assert firing, f"no rule case expects {rule} to fire; add one under tests/rule-cases"


@pytest.mark.parametrize("rule", [pytest.param(r, id=r) for r in RULES if r in ENGINE_RULES])
def test_every_rule_id_has_a_case_where_it_does_not_fire(rule: str) -> None:
    """A case of the same area that is judged and passes (explicit empty violations/warnings, or allowed)."""
    fires = [case for _, _, case in DECLARED if rule in (case["expect"].get("violations") or [])
             or rule in (case["expect"].get("warnings") or [])]
    files = {where.split("#")[0] for where, _, case in DECLARED if case in fires}
    quiet = [case for where, _, case in DECLARED if where.split("#")[0] in files and case not in fires
             and case["expect"].get("allowed", True) and rule not in (case["expect"].get("warnings") or [])]
    assert quiet, f"no passing case beside the ones where {rule} fires"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)


def test_cli_runs_the_rule_cases() -> None:
    result = _cli("test", "tests/rule-cases")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(DECLARED)} passed, 0 failed" in result.stdout


def test_cli_reports_a_failing_case() -> None:
    result = _cli("test", str(FAILING.relative_to(REPO)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL" in result.stdout and "a fractional GPU wrongly expected to pass" in result.stdout
    assert "allowed: expected True, got False" in result.stdout
    assert "gpu-whole-number" in result.stdout
    assert "1 passed, 1 failed" in result.stdout


def test_cli_test_without_cases_is_a_usage_error(tmp_path: Path) -> None:
    result = _cli("test", str(tmp_path))
    assert result.returncode == 2
    assert "no GPUPolicyTest files" in result.stderr


def test_every_rule_is_covered_somewhere() -> None:
    """A rule id added to RULES must be placed: an object-only check with cases, or an inventory check."""
    inventory_rules = {"gpu-never-schedulable", "gpu-class-no-node", "gpu-runtime-class-missing",
                       "gpu-inventory-unavailable", "dra-unsatisfiable"}
    assert set(RULES) == ENGINE_RULES | inventory_rules


def test_every_warning_keeps_its_fix_in_kubectl() -> None:
    """Warnings go on the wire cut to 120 characters; what comes after the last "; " (the fix) survives."""
    from webhook.admission.loader import load_policy
    from webhook.admission.review import WARNING_MAX_CHARS, sanitize_warning
    from webhook.policy.engine import Context, evaluate

    policy = load_policy(None)
    warned = set()
    for _, _, case in DECLARED:
        obj = case.get("object")
        if not isinstance(obj, dict):
            continue
        for mode in ("mutate", "validate"):
            verdict = evaluate(policy, obj, Context(namespace="default", mode=mode))  # type: ignore[arg-type]
            for finding in verdict.warnings:
                text = finding.render()
                shown = sanitize_warning(text)
                assert len(shown) <= WARNING_MAX_CHARS
                assert shown.startswith(f"[{finding.rule}] ") and shown.endswith(text.rpartition("; ")[2]), shown
                warned.add(finding.rule)
    assert warned >= {"gpu-env-without-request", "gpu-runtime-without-request", "gpu-toleration-without-request",
                      "gpu-node-name-preset"}
