"""Shared fixtures. The tests are laid out like the code: tests/policy, tests/admission, tests/cluster and
tests/cli test the packages of the same name; tests/deploy the Dockerfile, manifests and chart; tests/e2e the
webhook under a real control plane (`pytest -m e2e tests/e2e`).

Shared helpers that are not fixtures (recorded AdmissionReview bodies, a real gunicorn server over real TLS, a
replayed Kubernetes API) are modules of tests/support, importable as `support.*` (pyproject: pythonpath).
Test data is in tests/data and the rule cases in tests/rule-cases.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> None:
    """Long variants run only when asked for (`-m slow`), whatever the default options."""
    expr = request.config.getoption("markexpr") or ""
    if "slow" not in expr or "not slow" in expr:
        pytest.skip("long variant: run with -m slow")
