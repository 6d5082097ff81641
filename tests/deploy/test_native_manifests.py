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


def test_the_hybrid_component_narrows_both_webhooks_as_the_compiler_says() -> None:
    component = yaml.safe_load((REPO / "manifests" / "components" / "hybrid" / "kustomization.yaml").read_text())
    assert component["resources"] == ["../../native"]
    mutating, validating = component["patches"]
    wanted = [("MutatingWebhookConfiguration", native.hybrid_match_conditions(load_policy(REPO / "rules"))),
              ("ValidatingWebhookConfiguration", native.hybrid_validating_conditions())]
    for patch, (kind, conditions) in zip((mutating, validating), wanted, strict=True):
        assert patch["target"] == {"kind": kind, "name": "gpu-webhook"}
        (operation,) = yaml.safe_load(patch["patch"])
        assert operation["path"] == "/webhooks/0/matchConditions/-"
        assert [operation["value"]] == conditions, (
            f"manifests/components/hybrid is stale: put the compiler's conditions in its {kind} patch")
