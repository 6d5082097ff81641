"""Rule files: errors name the file, the document, the line and the field and say what was expected;
safe YAML only; deterministic merging; the loader's directory rules; the shipped rules lint clean."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from webhook.admission.loader import load_policy, packaged_rules_dir, read_sources, rule_files
from webhook.policy.rules import Policy, RuleError, parse_sources

REPO = Path(__file__).resolve().parents[2]

BASE = textwrap.dedent("""\
    apiVersion: gpu-webhook.io/v1alpha1
    kind: GPUPolicy
    metadata: {name: base}
    spec:
      gpuResources:
        nvidia.com/gpu: {}
      classes:
        axes:
          workload:
            label: gpu-webhook.io/workload
            default: inference
            values:
              inference: {nodeSelector: {workload: inference}}
              training: {nodeSelector: {workload: training}}
          gpu-type:
            label: gpu-webhook.io/gpu-type
            default: t4
            values:
              t4: {nodeSelector: {gpu-type: t4}}
              a100: {nodeSelector: {gpu-type: a100}}
    """)  # 20 lines


def doc(spec_yaml: str, name: str = "extra") -> str:
    """A GPUPolicy document whose spec is `spec_yaml` (indented two spaces); the spec starts on line 5."""
    return (f"apiVersion: gpu-webhook.io/v1alpha1\nkind: GPUPolicy\nmetadata: {{name: {name}}}\nspec:\n"
            + textwrap.indent(textwrap.dedent(spec_yaml), "  "))


def error(*sources: tuple[str, str]) -> str:
    with pytest.raises(RuleError) as err:
        parse_sources(list(sources))
    return str(err.value)


ERRORS = [
    pytest.param(
        [("20-extra.yaml", doc("exemptNamespace: [team-a]\n"))],
        ["20-extra.yaml: document 1", 'GPUPolicy "extra"', "line 5", "spec:",
         'unknown field "exemptNamespace" (did you mean "exemptNamespaces"?)', "allowed fields:"],
        id="unknown-field-did-you-mean"),
    pytest.param(
        [("20-extra.yaml", doc("gpuResources:\n  nvidia.com/gpu.shared: {maxPerContainer: one}\n"))],
        ["20-extra.yaml: document 1", "line 6", "spec.gpuResources.nvidia.com/gpu.shared.maxPerContainer",
         "expected integer, got a string ('one')"],
        id="wrong-type"),
    pytest.param(
        [("20-extra.yaml", doc("gpuResources:\n  nvidia.com/gpu.shared: {maxPerContainer: 0}\n"))],
        ["line 6", "maxPerContainer", "must be at least 1, got 0"],
        id="below-minimum"),
    pytest.param(
        [("20-extra.yaml", doc("exemptNamespaces: kube-system\n"))],
        ["line 5", "spec.exemptNamespaces", "expected array, got a string"],
        id="string-instead-of-list"),
    pytest.param(
        [("20-extra.yaml", doc("enforcement:\n  gpu-class-max: block\n"))],
        ["20-extra.yaml: document 1", "line 6", "spec.enforcement.gpu-class-max",
         "must be one of 'deny', 'warn', 'off', got 'block'"],
        id="bad-enforcement-value"),
    pytest.param(
        [("00-base.yaml", BASE), ("20-extra.yaml", doc("enforcement:\n  gpu-class-maximum: warn\n"))],
        ["20-extra.yaml: document 1", "line 6", "spec.enforcement.gpu-class-maximum",
         'unknown rule id "gpu-class-maximum" (did you mean "gpu-class-max"?)'],
        id="unknown-rule-id"),
    pytest.param(
        [("00-base.yaml", BASE), ("20-extra.yaml", doc("enforcement:\n  zzzz: warn\n"))],
        ['unknown rule id "zzzz"', "rule ids are: gpu-limits-required"],
        id="unknown-rule-id-lists-ids"),
    pytest.param(
        [("00-base.yaml", BASE.replace("default: inference", "default: batch"))],
        ["00-base.yaml: document 1", "line 11", "spec.classes.axes.workload.default",
         '"batch" is not one of the values: inference, training'],
        id="axis-default-not-a-value"),
    pytest.param(
        [("00-base.yaml", BASE), ("20-extra.yaml", doc("namespaces:\n  research:\n    defaults: {flavour: x}\n"))],
        ["20-extra.yaml: document 1", "line 7", "spec.namespaces.research.defaults.flavour",
         'no class axis "flavour"; axes are: workload, gpu-type'],
        id="namespace-default-unknown-axis"),
    pytest.param(
        [("00-base.yaml", BASE), ("20-extra.yaml", doc("namespaces:\n  research:\n    defaults: {gpu-type: h100}\n"))],
        ["20-extra.yaml", "line 7", "spec.namespaces.research.defaults.gpu-type",
         '"h100" is not a gpu-type value; choose from t4, a100'],
        id="namespace-default-unknown-value"),
    pytest.param(
        [("00-base.yaml", BASE),
         ("20-extra.yaml", doc("namespaces:\n  research:\n    allowed:\n      workload: [training, batch]\n"))],
        ["20-extra.yaml", "spec.namespaces.research.allowed.workload",
         '"batch" is not a workload value; choose from inference, training'],
        id="namespace-allowed-unknown-value"),
    pytest.param(
        [("00-base.yaml", BASE),
         ("20-extra.yaml", doc("classes:\n  axes:\n    workload:\n      label: gpu-webhook.io/workload\n"
                               "      default: training\n      values: {training: {}}\n"))],
        ["20-extra.yaml: document 1", "line 9", "spec.classes.axes.workload.default", "'training' here",
         "'inference' in", "define it once"],
        id="conflict-across-files"),
    pytest.param(
        [("00-base.yaml", BASE + "---\n" + doc("gpuResources:\n  nvidia.com/gpu: {maxPerContainer: x}\n"))],
        ["00-base.yaml: document 2", "line 27", "maxPerContainer", "expected integer"],
        id="second-document-counted"),
    pytest.param(
        [("20-extra.yaml", doc("gpuResources:\n  nvidia.com/gpu: [1, 2\n"))],
        ["20-extra.yaml: line", "not valid YAML", "fix the syntax"],
        id="invalid-yaml"),
    pytest.param(
        [("20-extra.yaml", doc("exemptNamespaces: !!python/object/apply:os.system ['echo pwned']\n"))],
        ["20-extra.yaml: line 5", "could not determine a constructor", "safe YAML only"],
        id="python-tag-refused"),
    pytest.param(
        [("20-extra.yaml", doc("{}\n").replace("gpu-webhook.io/v1alpha1", "gpu-webhook.io/v1"))],
        ["line 1", "apiVersion", "must be 'gpu-webhook.io/v1alpha1', got 'gpu-webhook.io/v1'"],
        id="wrong-api-version"),
    pytest.param(
        [("20-extra.yaml", doc("{}\n").replace("kind: GPUPolicy", "kind: Policy"))],
        ["line 2", "kind", "must be 'GPUPolicy'"],
        id="wrong-kind"),
    pytest.param(
        [("20-extra.yaml", "apiVersion: gpu-webhook.io/v1alpha1\nkind: GPUPolicy\n")],
        ["20-extra.yaml: document 1", "'spec' is a required property; add it"],
        id="missing-spec"),
    pytest.param(
        [("20-extra.yaml", doc("classes:\n  common:\n    nodeSelector: {gpu-type: 'not valid!'}\n"))],
        ["line 7", "spec.classes.common.nodeSelector.gpu-type", "not a valid name here"],
        id="bad-label-value"),
    pytest.param([("empty.yaml", "# nothing here\n")], ["no GPUPolicy documents found"], id="no-documents"),
]


@pytest.mark.parametrize(("sources", "parts"), ERRORS)
def test_rule_error_message(sources: list[tuple[str, str]], parts: list[str]) -> None:
    message = error(*sources)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


def test_conflict_names_both_files() -> None:
    message = error(("00-base.yaml", BASE), ("20-extra.yaml", doc(
        "classes:\n  axes:\n    workload:\n      label: gpu-webhook.io/workload\n      default: training\n"
        "      values: {training: {}}\n")))
    assert "20-extra.yaml: document 1" in message
    assert "00-base.yaml: document 1" in message


def test_python_tag_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = doc(f"exemptNamespaces: !!python/object/apply:os.system ['touch {marker}']\n")
    error(("x.yaml", text))
    assert not marker.exists()


def test_namespace_policy_on_every_axis() -> None:
    """Regression: namespace defaults/allowed were once checked against the last axis only."""
    policy = parse_sources([("00-base.yaml", BASE), ("20-extra.yaml", doc(
        "namespaces:\n  research:\n    defaults: {workload: training, gpu-type: a100}\n"
        "    allowed: {workload: [training], gpu-type: [a100, t4]}\n"))])
    assert dict(policy.namespaces["research"].defaults) == {"workload": "training", "gpu-type": "a100"}
    assert dict(policy.namespaces["research"].allowed) == {"workload": ("training",), "gpu-type": ("a100", "t4")}


# --------------------------------------------------------------------------------------------- merging

EXTRA = doc("""\
    exemptNamespaces: [b-ns, shared-ns]
    gpuRuntimeClasses: [nvidia-cdi]
    enforcement: {gpu-class-max: warn}
    classes:
      axes:
        gpu-type:
          label: gpu-webhook.io/gpu-type
          values:
            h100: {nodeSelector: {gpu-type: h100}}
    """)
FIRST = doc("""\
    exemptNamespaces: [a-ns, shared-ns]
    gpuRuntimeClasses: [nvidia]
    enforcement: {gpu-node-name-preset: "off"}
    """, name="first")


def test_merge_is_independent_of_input_order() -> None:
    sources = [("00-base.yaml", BASE), ("10-first.yaml", FIRST), ("20-extra.yaml", EXTRA)]
    forward = parse_sources(sources)
    backward = parse_sources(list(reversed(sources)))
    assert forward == backward
    assert forward.sources == ("00-base.yaml", "10-first.yaml", "20-extra.yaml")


def test_maps_merge_and_string_lists_union_first_seen_first() -> None:
    policy = parse_sources([("20-extra.yaml", EXTRA), ("00-base.yaml", BASE), ("10-first.yaml", FIRST)])
    axes = {axis.name: axis for axis in policy.axes}
    assert list(axes["gpu-type"].values) == ["t4", "a100", "h100"]
    assert list(axes) == ["workload", "gpu-type"]
    assert policy.exempt_namespaces == frozenset({"a-ns", "shared-ns", "b-ns"})
    assert policy.gpu_runtime_classes == frozenset({"nvidia", "nvidia-cdi"})
    assert policy.enforcement_of("gpu-class-max") == "warn"
    assert policy.enforcement_of("gpu-node-name-preset") == "off"
    assert policy.enforcement_of("gpu-whole-number") == "deny"


def test_equal_values_defined_twice_are_fine() -> None:
    again = doc("classes:\n  axes:\n    workload:\n      label: gpu-webhook.io/workload\n      default: inference\n"
                "      values: {inference: {nodeSelector: {workload: inference}}}\n")
    policy = parse_sources([("00-base.yaml", BASE), ("10-again.yaml", again)])
    base = parse_sources([("00-base.yaml", BASE)])
    assert policy.axes == base.axes and policy.digest == base.digest


def test_digest_follows_content_not_order() -> None:
    a = parse_sources([("00-base.yaml", BASE), ("10-first.yaml", FIRST)])
    b = parse_sources([("10-first.yaml", FIRST), ("00-base.yaml", BASE)])
    c = parse_sources([("00-base.yaml", BASE)])
    assert a.digest == b.digest != c.digest


# --------------------------------------------------------------------------------------------- loader


def _write(directory: Path, name: str, text: str) -> None:
    (directory / name).write_text(text, encoding="utf-8")


KUSTOMIZATION = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: []\n"


def test_loader_skips_kustomization_hidden_and_other_files(tmp_path: Path) -> None:
    _write(tmp_path, "20-extra.yaml", FIRST)
    _write(tmp_path, "00-base.yaml", BASE)
    _write(tmp_path, "kustomization.yaml", KUSTOMIZATION)
    _write(tmp_path, "kustomization.yml", KUSTOMIZATION)
    _write(tmp_path, "Kustomization", KUSTOMIZATION)
    _write(tmp_path, ".hidden.yaml", "not: [valid")
    _write(tmp_path, "README.md", "# notes\n")
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub", "nested.yaml", "not: [valid")
    assert [p.name for p in rule_files(tmp_path)] == ["00-base.yaml", "20-extra.yaml"]
    assert load_policy(tmp_path).exempt_namespaces == frozenset({"a-ns", "shared-ns"})


def test_loader_reads_a_mounted_configmap_layout(tmp_path: Path) -> None:
    """kubelet's atomic writer: ..<timestamp>/files, ..data -> ..<timestamp>, file -> ..data/file."""
    stamp = tmp_path / "..2026_12_02_10_00_00.123"
    stamp.mkdir()
    _write(stamp, "gpu-policy.yaml", BASE)
    _write(stamp, "kustomization.yaml", KUSTOMIZATION)
    os.symlink(stamp.name, tmp_path / "..data")
    os.symlink("..data/gpu-policy.yaml", tmp_path / "gpu-policy.yaml")
    os.symlink("..data/kustomization.yaml", tmp_path / "kustomization.yaml")
    assert [p.name for p in rule_files(tmp_path)] == ["gpu-policy.yaml"]
    assert [a.name for a in load_policy(tmp_path).axes] == ["workload", "gpu-type"]


def test_loader_names_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="not a directory"):
        load_policy(tmp_path / "nope")


def test_loader_errors_name_the_file_path(tmp_path: Path) -> None:
    _write(tmp_path, "gpu.yaml", doc("exemptNamespace: []\n"))
    with pytest.raises(RuleError) as err:
        load_policy(tmp_path)
    assert str(tmp_path / "gpu.yaml") in str(err.value)


# --------------------------------------------------------------------------------------------- shipped rules


def test_shipped_rules_load_and_match_the_packaged_copy() -> None:
    repo_policy = load_policy(REPO / "rules")
    packaged: Policy = load_policy()
    assert repo_policy.digest == packaged.digest
    assert [Path(name).name for name, _ in read_sources(packaged_rules_dir())] == ["gpu-policy.yaml"]
    assert {a.name: a.default for a in packaged.axes} == {"workload": "inference", "gpu-type": "t4"}


@pytest.mark.parametrize("directory", [pytest.param("rules", id="shipped"),
                                       pytest.param("tests/rule-cases/namespace-policy/rules", id="test-rules")])
def test_lint_is_clean(directory: str) -> None:
    result = subprocess.run([sys.executable, "-m", "webhook", "lint", directory], cwd=REPO, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")


def test_lint_fails_with_the_error(tmp_path: Path) -> None:
    _write(tmp_path, "gpu.yaml", doc("enforcement: {gpu-class-max: block}\n"))
    result = subprocess.run([sys.executable, "-m", "webhook", "lint", str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "gpu.yaml: document 1" in result.stderr and "line 5" in result.stderr and "'block'" in result.stderr
