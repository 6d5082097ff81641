"""The Helm chart's native and hybrid modes on the real API server.

Native: `helm install` with `mode: native` and the params that `gpu-webhook policies render --format helm-values`
computes from the rules. The seed's `cuda-gpu-test` Pod gets its class from the chart's MutatingAdmissionPolicy and
lands on a T4 node; a Pod whose GPU requests differ from its limits is refused, and so is an unknown class (by
the chart's ValidatingAdmissionPolicy), with no webhook registered.

Hybrid: the same release upgraded to `mode: hybrid`, in url mode (the chart's webhook configurations call the
harness's gpu-webhook, as test_12_helm does): a plain GPU Pod gets its class natively and never reaches the
mutating webhook, which the chart narrowed with the rendered match condition; a Pod placed by required node
affinity gets its class from the webhook.

The module starts its own control plane with the harness's `running_cluster` and deletes the harness's webhook
configurations there (helm does not adopt objects it did not create), so only the chart's objects decide; the
session cluster is not touched. Helm installs the chart's crds/ (the GPUClassMap CRD) before the templates, so
one `helm install` is enough.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import (
    SEED_NODES,
    SEED_POD_INJECTED,
    WEBHOOK_NAMESPACE,
    Cluster,
    gpu_pod,
    injected,
    running_cluster,
    wait_scheduled,
    wait_until,
)
from test_12_helm import CHART, HOOK_KINDS, RELEASE, HelmCli, _helm_binary
from test_15_native import research_rules
from test_15_native_hybrid import _reviews

from webhook.admission.loader import load_policy
from webhook.policy import native

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NS = "helm-native"
NATIVE_KINDS = ["GPUClassMap", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicyBinding"]


def rendered_values(out: Path, mode: str, rules: Path = REPO / "rules") -> Path:
    """The values file a user renders from the rules (the shipped ones by default)."""
    done = subprocess.run([sys.executable, "-m", "webhook", "policies", "render", "--rules", str(rules),
                           "--mode", mode, "--format", "helm-values"], check=True, capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    out.write_text(done.stdout)
    return out


def _create(cluster: Cluster, pod: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", *flags, "-n", NS, "-f", "-", input=json.dumps(pod), check=False)


def _wait_policies_active(cluster: Cluster) -> None:
    """Until the API server runs both the mutating policy (a probe gets its runtimeClassName) and the validating
    one (a probe with an unknown class is refused): each policy's binding reaches the admission plugin on its own
    informer, so one being active says nothing of the other."""
    def active() -> bool:
        done = _create(cluster, gpu_pod("probe"), "--dry-run=server", "-o", "json")
        if done.returncode != 0 or "runtimeClassName" not in json.loads(done.stdout)["spec"]:
            return False
        refused = _create(cluster, gpu_pod("probe", labels={"gpu-webhook.io/workload": "no-such-class"}),
                          "--dry-run=server")
        return refused.returncode != 0 and "gpu-webhook.io-deny" in refused.stderr

    wait_until(active, 60, "the API server to run the chart's admission policies", interval=0.5)


def _release_kinds(helm: HelmCli) -> list[str]:
    manifest = helm("get", "manifest", RELEASE, "--namespace", WEBHOOK_NAMESPACE).stdout
    return sorted(d["kind"] for d in yaml.safe_load_all(manifest) if d)


@pytest.fixture(scope="module")
def chart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, HelmCli, Path]]:
    """A control plane of its own, its harness webhook configurations deleted (the webhook server keeps running)."""
    work = tmp_path_factory.mktemp("helm-native")
    with running_cluster(work / "cluster") as cluster:
        for kind in HOOK_KINDS:
            cluster.kubectl("delete", kind, RELEASE, "--wait=true")
        cluster.ensure_namespace(NS)
        helm = HelmCli(_helm_binary(), cluster, work / "helm-home")
        try:
            yield cluster, helm, work
        finally:
            helm("uninstall", RELEASE, "--namespace", WEBHOOK_NAMESPACE, "--wait", check=False)


@pytest.fixture(scope="class")
def native_release(chart_cluster: tuple[Cluster, HelmCli, Path]) -> Iterator[tuple[Cluster, HelmCli]]:
    cluster, helm, work = chart_cluster
    helm("install", RELEASE, str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--create-namespace",
         "-f", str(rendered_values(work / "native-values.yaml", "native")), "--wait")
    _wait_policies_active(cluster)
    yield cluster, helm
    helm("uninstall", RELEASE, "--namespace", WEBHOOK_NAMESPACE, "--wait")


class TestNative:
    """Scoped to the class: the release is uninstalled before TestHybrid installs its own."""

    def test_the_release_holds_only_the_policies(self, native_release: tuple[Cluster, HelmCli]) -> None:
        cluster, helm = native_release
        assert _release_kinds(helm) == NATIVE_KINDS
        for kind in HOOK_KINDS:
            assert not cluster.kubectl("get", kind, "-o", "name").stdout.strip(), f"{kind} registered in native mode"
        assert not cluster.kubectl("get", "deployments,services", "-n", WEBHOOK_NAMESPACE, "-o", "name").stdout.strip()
        crd = json.loads(cluster.kubectl("get", "crd", "gpuclassmaps.gpu-webhook.io", "-o", "json").stdout)
        assert crd["spec"]["group"] == "gpu-webhook.io"

    def test_cuda_gpu_test_is_mutated_by_the_charts_policy(self, native_release: tuple[Cluster, HelmCli]) -> None:
        cluster, _ = native_release
        done = _create(cluster, gpu_pod("cuda-gpu-test"))
        assert done.returncode == 0, done.stderr
        node = wait_scheduled(cluster, NS, "cuda-gpu-test")
        assert SEED_NODES[node] and SEED_NODES[node][0] == "t4", node
        stored = json.loads(cluster.kubectl("get", "pod", "cuda-gpu-test", "-n", NS, "-o", "json").stdout)
        assert injected(stored) == SEED_POD_INJECTED

    def test_requests_not_equal_to_limits_is_refused(self, native_release: tuple[Cluster, HelmCli]) -> None:
        cluster, _ = native_release
        done = _create(cluster, gpu_pod("mismatch", limits={"nvidia.com/gpu": "2"}, requests={"nvidia.com/gpu": "1"}))
        assert done.returncode != 0
        # The API server's own validation answers before any validating policy (docs/native-policy.md).
        assert 'resources.requests: Invalid value: "1": must be equal to nvidia.com/gpu limit of 2' in done.stderr
        assert cluster.kubectl("get", "pod", "mismatch", "-n", NS, check=False).returncode != 0

    def test_an_unknown_class_is_refused_by_the_charts_validating_policy(
            self, native_release: tuple[Cluster, HelmCli]) -> None:
        cluster, _ = native_release
        done = _create(cluster, gpu_pod("unknown-class", labels={"gpu-webhook.io/workload": "batch"}),
                       "--dry-run=server")
        assert done.returncode != 0
        assert "ValidatingAdmissionPolicy 'gpu-webhook.io-deny'" in done.stderr, done.stderr
        assert '[gpu-class-unknown] metadata.labels[gpu-webhook.io/workload]: "batch" is not a workload class' in (
            done.stderr)

    def test_a_rule_edit_is_a_re_render_and_a_helm_upgrade(self, native_release: tuple[Cluster, HelmCli],
                                                           tmp_path: Path) -> None:
        """Only the GPUClassMap of the release changes, and the policies use the new rules."""
        cluster, helm = native_release
        rules = research_rules(tmp_path)
        cluster.ensure_namespace("native-research")
        chart = [RELEASE, str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--wait"]
        before = helm("get", "manifest", RELEASE, "--namespace", WEBHOOK_NAMESPACE).stdout
        try:
            helm("upgrade", *chart, "-f", str(rendered_values(tmp_path / "edited.yaml", "native", rules)))
            after = helm("get", "manifest", RELEASE, "--namespace", WEBHOOK_NAMESPACE).stdout
            old, new = ([d for d in yaml.safe_load_all(text) if d] for text in (before, after))
            changed = [n["kind"] for o, n in zip(old, new, strict=True) if o != n]
            assert changed == ["GPUClassMap"]

            def placed() -> dict[str, Any]:
                done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", "native-research", "-f",
                                       "-", input=json.dumps(gpu_pod("plain")))
                return dict(json.loads(done.stdout))

            pod = wait_until(lambda: (p := placed())["metadata"]["annotations"]["gpu-webhook.io/class"] ==
                             "workload=training,gpu-type=a100" and p, 30, "the upgraded params to be used")
            assert pod["spec"]["nodeSelector"] == {"workload": "training", "gpu-type": "a100"}
        finally:
            helm("upgrade", *chart, "-f", str(rendered_values(tmp_path / "shipped.yaml", "native")))


@pytest.fixture(scope="class")
def hybrid_release(chart_cluster: tuple[Cluster, HelmCli, Path]) -> Iterator[tuple[Cluster, HelmCli]]:
    cluster, helm, work = chart_cluster
    helm("upgrade", "--install", RELEASE, str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--create-namespace",
         "-f", str(rendered_values(work / "hybrid-values.yaml", "hybrid")),
         "--set", f"webhook.url={cluster.webhook_url}", "--set", "certificates.mode=provided",
         "--set-file", f"certificates.provided.caCert={cluster.webhook_tls / 'ca.crt'}", "--wait")
    cluster.wait_webhook_active()
    _wait_policies_active(cluster)
    yield cluster, helm
    helm("uninstall", RELEASE, "--namespace", WEBHOOK_NAMESPACE, "--wait")


class TestHybrid:
    def test_the_release_holds_the_policies_and_the_webhook_configurations(
            self, hybrid_release: tuple[Cluster, HelmCli]) -> None:
        cluster, helm = hybrid_release
        assert _release_kinds(helm) == sorted([*NATIVE_KINDS, "MutatingWebhookConfiguration",
                                               "ValidatingWebhookConfiguration"])
        stored = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration", RELEASE, "-o", "json").stdout)
        (hook,) = stored["webhooks"]
        assert hook["matchConditions"][-1:] == native.hybrid_match_conditions(load_policy(REPO / "rules"))
        stored = json.loads(cluster.kubectl("get", "validatingwebhookconfiguration", RELEASE, "-o", "json").stdout)
        (hook,) = stored["webhooks"]
        assert hook["matchConditions"][-1:] == native.hybrid_validating_conditions()

    def test_a_plain_gpu_pod_gets_its_class_natively(self, hybrid_release: tuple[Cluster, HelmCli]) -> None:
        cluster, _ = hybrid_release
        mutate, validate = _reviews(cluster, "mutate"), _reviews(cluster, "validate")
        done = _create(cluster, gpu_pod("plain"), "--dry-run=server", "-o", "json")
        assert done.returncode == 0, done.stderr
        assert injected(json.loads(done.stdout)) == SEED_POD_INJECTED
        wait_until(lambda: _reviews(cluster, "validate") > validate, 10, "the validating webhook's review")
        assert _reviews(cluster, "mutate") == mutate, "a plain GPU Pod must not reach the mutating webhook"

    def test_a_pod_placed_by_required_node_affinity_gets_its_class_from_the_webhook(
            self, hybrid_release: tuple[Cluster, HelmCli]) -> None:
        cluster, _ = hybrid_release
        mutate = _reviews(cluster, "mutate")
        pod = gpu_pod("aks-a100")
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                         "values": ["Standard_NC24ads_A100_v4"]}]}]}}}
        done = _create(cluster, pod, "--dry-run=server", "-o", "json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["metadata"]["annotations"]["gpu-webhook.io/class"] == (
            "workload=training,gpu-type=a100")
        wait_until(lambda: _reviews(cluster, "mutate") > mutate, 10, "the mutating webhook's review")
