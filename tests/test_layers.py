"""The package layers (docs/architecture.md), as `lint-imports` enforces them from pyproject.toml in CI.

The contracts are shown to hold on the code as it is, and to fail on a deliberate violation made in a
temporary copy of the package: the pure core importing flask, the core importing the admission server, and
the cluster client importing the admission server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts, on the `webhook` package found in `root`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT_IMPORTS, "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def copy_of_package(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "webhook", tmp_path / "webhook", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_code_keeps_its_layers(copy_of_package: Path) -> None:
    result = lint(copy_of_package)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


VIOLATIONS = [
    pytest.param("policy/quantity.py", "import flask", "The policy core does no I/O",
                 "webhook.policy.quantity -> flask", id="core-imports-flask"),
    pytest.param("policy/pods.py", "from webhook.admission import settings", "Layers",
                 "webhook.policy.pods -> webhook.admission.settings", id="core-imports-the-server"),
    pytest.param("cluster/doctor.py", "from webhook.admission import review", "Layers",
                 "webhook.cluster.doctor -> webhook.admission.review", id="cluster-imports-the-server"),
    pytest.param("admission/review.py", "from webhook.cli import main", "Layers",
                 "webhook.admission.review -> webhook.cli.main", id="server-imports-the-cli"),
    pytest.param("cluster/kube.py", "import prometheus_client", "The cluster client serves no HTTP",
                 "webhook.cluster.kube -> prometheus_client", id="cluster-imports-metrics"),
]


@pytest.mark.parametrize(("module", "line", "contract", "chain"), VIOLATIONS)
def test_a_violation_is_caught(copy_of_package: Path, module: str, line: str, contract: str, chain: str) -> None:
    path = copy_of_package / "webhook" / module
    path.write_text(path.read_text() + f"\n{line}  # a deliberate violation\n")
    result = lint(copy_of_package)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout[result.stdout.index("Broken contracts"):]
    assert contract in broken
    assert chain in broken, broken
