"""manifests/native: the rendered native-mode objects are current with the shipped rules."""

from __future__ import annotations

from pathlib import Path

import yaml

from webhook.admission.loader import load_policy
from webhook.policy import native

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_native_policies_are_the_render_of_the_shipped_rules() -> None:
    committed = [d for d in yaml.safe_load_all((REPO / "manifests" / "native" / "policies.yaml").read_text()) if d]
    assert committed == native.render(load_policy(REPO / "rules")), (
        "manifests/native/policies.yaml is stale: run `gpu-webhook policies render --rules rules/ > "
        "manifests/native/policies.yaml`")
