"""Rule files that must be refused: the check shared by the rule-error tables of several test modules."""

from __future__ import annotations

import pytest

from webhook.policy.rules import RuleError, parse_sources


def assert_refused(text: str, parts: list[str]) -> None:
    """`text` as gpu-policy.yaml is refused with a message holding every one of `parts` (file, field, fix)."""
    with pytest.raises(RuleError) as err:
        parse_sources([("gpu-policy.yaml", text)])
    for part in parts:
        assert part in str(err.value)
