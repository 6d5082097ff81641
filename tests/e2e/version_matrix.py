"""Run the core e2e scenarios against each Kubernetes release the project supports; print the matrix.

    python tests/e2e/version_matrix.py                 every release: tests/e2e/controlplane-*/ and the default
    python tests/e2e/version_matrix.py 1.30 default    these (MINOR of tests/e2e/controlplane-MINOR, or default)

For each release: tests/e2e/build.sh with GPU_WEBHOOK_E2E_K8S=MINOR (a cache folder per release; a cold build of
one release takes minutes), then one pytest session of the core scenarios against that control plane, its JUnit
report read back per scenario. Prints a Markdown table (release x scenario: pass, or fail with the count) and
exits 1 when any scenario failed or a build failed. `--junit-dir DIR` keeps each release's JUnit XML.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# The core scenarios, by test file.
SCENARIOS = {
    "test_01_placement.py": "placement",
    "test_02_denials.py": "denials",
    "test_03_dry_run.py": "dry-run",
    "test_06_failure_policy.py": "failure policy",
    "test_12_helm.py": "helm install",
    "test_23_versions.py": "version gates",
}


@dataclass
class Outcome:
    """One scenario's tests on one release."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def cell(self) -> str:
        if self.failed:
            return f"**fail** ({self.failed} of {self.passed + self.failed})"
        if not self.passed:
            return "skipped" if self.skipped else "not run"
        return f"pass ({self.passed})"


@dataclass
class Row:
    """One release: its version, how long it took, and each scenario's outcome."""

    release: str
    version: str = "?"
    seconds: float = 0.0
    error: str = ""
    outcomes: dict[str, Outcome] = field(default_factory=dict)


def releases() -> list[str]:
    found = sorted((p.name.removeprefix("controlplane-") for p in HERE.glob("controlplane-*/") if p.is_dir()),
                   key=lambda minor: tuple(int(part) for part in minor.split(".")))
    return [*found, "default"]


def pinned(release: str) -> str:
    go_mod = HERE / ("controlplane" if release == "default" else f"controlplane-{release}") / "go.mod"
    if not go_mod.is_file():
        raise SystemExit(f"version_matrix: {go_mod} is missing; releases here: {' '.join(releases())}")
    found = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", go_mod.read_text(), re.M)
    if not found:
        raise SystemExit(f"version_matrix: {go_mod} pins no k8s.io/kubernetes version")
    return found.group(1)


def outcomes(junit: Path) -> dict[str, Outcome]:
    by_file: dict[str, Outcome] = {name: Outcome() for name in SCENARIOS}
    for case in ET.parse(junit).iter("testcase"):
        # classname is the dotted module path (tests.e2e.test_01_placement), then the class if any.
        modules = [f"{part}.py" for part in (case.get("classname") or "").split(".") if f"{part}.py" in by_file]
        if not modules:
            continue
        outcome = by_file[modules[0]]
        if case.find("failure") is not None or case.find("error") is not None:
            outcome.failed += 1
        elif case.find("skipped") is not None:
            outcome.skipped += 1
        else:
            outcome.passed += 1
    return by_file


def run_release(release: str, junit_dir: Path) -> Row:
    row = Row(release, pinned(release))
    env = dict(os.environ)
    env.pop("GPU_WEBHOOK_E2E_K8S", None)
    if release != "default":
        env["GPU_WEBHOOK_E2E_K8S"] = release
    start = time.monotonic()
    build = subprocess.run(["bash", str(HERE / "build.sh")], env=env, capture_output=True, text=True, check=False)
    if build.returncode != 0:
        row.error = f"tests/e2e/build.sh exited {build.returncode}: {build.stderr[-2000:]}"
        return row
    junit = junit_dir / f"e2e-{row.version}.xml"
    files = [str(HERE / name) for name in SCENARIOS]
    print(f"version_matrix: {row.version}: pytest -m e2e {' '.join(SCENARIOS)}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "pytest", "-m", "e2e", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", *files], env=env, cwd=REPO, check=False)
    row.seconds = time.monotonic() - start
    if not junit.is_file():
        row.error = f"pytest wrote no JUnit report ({junit})"
        return row
    row.outcomes = outcomes(junit)
    return row


def table(rows: list[Row]) -> str:
    head = ["Kubernetes", *SCENARIOS.values(), "wall time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row.error:
            cells = ["**error**: " + row.error.splitlines()[0]] * len(SCENARIOS)
        else:
            cells = [row.outcomes[name].cell() for name in SCENARIOS]
        lines.append(f"| {row.version} | " + " | ".join(cells) + f" | {row.seconds:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("release", nargs="*", help="MINOR of tests/e2e/controlplane-MINOR, or default")
    parser.add_argument("--junit-dir", type=Path, help="keep each release's JUnit XML here")
    args = parser.parse_args(argv)
    chosen = args.release or releases()
    for release in chosen:
        pinned(release)
    with tempfile.TemporaryDirectory() as scratch:
        junit_dir = args.junit_dir or Path(scratch)
        junit_dir.mkdir(parents=True, exist_ok=True)
        rows = [run_release(release, junit_dir) for release in chosen]
    print(table(rows))
    bad = [row for row in rows if row.error or any(o.failed or not o.passed for o in row.outcomes.values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
