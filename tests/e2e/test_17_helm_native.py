"""The Helm chart in native mode on the real API server: `helm install` with `mode: native` and the params that
`gpu-webhook policies render --format helm-values` computes from the rules, then the seed's `cuda-gpu-test` Pod
gets its class from the MutatingAdmissionPolicy and lands on a T4 node, and a Pod whose GPU requests differ from
its limits is refused, with no webhook registered.

The module starts its own control plane with the harness's `running_cluster` and unregisters the harness's webhook
there (as test_15_native does), so only the chart's policies decide; the session cluster is not touched. Helm
installs the chart's crds/ (the GPUClassMap CRD) before the templates, so one `helm install` is enough.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
from test_12_helm import CHART, RELEASE, HelmCli, _helm_binary
from test_15_native import remove_webhooks

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NS = "helm-native"


def native_values(out: Path) -> Path:
    """The values file a user renders from the shipped rules."""
    done = subprocess.run([sys.executable, "-m", "webhook", "policies", "render", "--rules", str(REPO / "rules"),
                           "--mode", "native", "--format", "helm-values"], check=True, capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    out.write_text(done.stdout)
    return out


@pytest.fixture(scope="module")
def native_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, HelmCli]]:
    """A control plane of its own with the webhook unregistered and the chart installed in native mode."""
    work = tmp_path_factory.mktemp("helm-native")
    with running_cluster(work / "cluster") as cluster:
        helm = HelmCli(_helm_binary(), cluster, work / "helm-home")
        remove_webhooks(cluster)
        helm("install", RELEASE, str(CHART), "--namespace", WEBHOOK_NAMESPACE, "--create-namespace",
             "-f", str(native_values(work / "native-values.yaml")), "--wait")
        cluster.ensure_namespace(NS)

        def active() -> bool:
            done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", NS, "-f", "-",
                                   input=json.dumps(gpu_pod("probe")), check=False)
            return done.returncode == 0 and "runtimeClassName" in json.loads(done.stdout)["spec"]

        wait_until(active, 60, "the API server to run the chart's admission policies", interval=0.5)
        yield cluster, helm
        helm("uninstall", RELEASE, "--namespace", WEBHOOK_NAMESPACE, "--wait", check=False)


def test_the_release_holds_only_the_policies(native_release: tuple[Cluster, HelmCli]) -> None:
    cluster, helm = native_release
    manifest = helm("get", "manifest", RELEASE, "--namespace", WEBHOOK_NAMESPACE).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(manifest) if d)
    assert kinds == ["GPUClassMap", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                     "ValidatingAdmissionPolicyBinding"]
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        assert not cluster.kubectl("get", kind, "-o", "name").stdout.strip(), f"{kind} registered in native mode"
    assert not cluster.kubectl("get", "deployments,services", "-n", WEBHOOK_NAMESPACE, "-o", "name").stdout.strip()
    crd = json.loads(cluster.kubectl("get", "crd", "gpuclassmaps.gpu-webhook.io", "-o", "json").stdout)
    assert crd["spec"]["group"] == "gpu-webhook.io"


def test_cuda_gpu_test_is_mutated_by_the_charts_policy(native_release: tuple[Cluster, HelmCli]) -> None:
    cluster, _ = native_release
    cluster.kubectl("create", "-n", NS, "-f", "-", input=json.dumps(gpu_pod("cuda-gpu-test")))
    node = wait_scheduled(cluster, NS, "cuda-gpu-test")
    assert SEED_NODES[node] and SEED_NODES[node][0] == "t4", node
    stored = json.loads(cluster.kubectl("get", "pod", "cuda-gpu-test", "-n", NS, "-o", "json").stdout)
    assert injected(stored) == SEED_POD_INJECTED


def test_requests_not_equal_to_limits_is_refused(native_release: tuple[Cluster, HelmCli]) -> None:
    cluster, _ = native_release
    pod = gpu_pod("mismatch", limits={"nvidia.com/gpu": "2"}, requests={"nvidia.com/gpu": "1"})
    done = cluster.kubectl("create", "-n", NS, "-f", "-", input=json.dumps(pod), check=False)
    assert done.returncode != 0
    # The API server's own validation answers before any validating policy (docs/native-policy.md).
    assert 'resources.requests: Invalid value: "1": must be equal to nvidia.com/gpu limit of 2' in done.stderr
    assert cluster.kubectl("get", "pod", "mismatch", "-n", NS, check=False).returncode != 0


def test_a_rule_checked_by_the_charts_validating_policy(native_release: tuple[Cluster, HelmCli]) -> None:
    """A class the rules do not know is refused with the rule's message, by the chart's ValidatingAdmissionPolicy."""
    cluster, _ = native_release
    pod = gpu_pod("unknown-class", labels={"gpu-webhook.io/workload": "batch"})
    done = cluster.kubectl("create", "--dry-run=server", "-n", NS, "-f", "-", input=json.dumps(pod), check=False)
    assert done.returncode != 0
    assert "ValidatingAdmissionPolicy 'gpu-webhook.io-deny'" in done.stderr, done.stderr
    assert '[gpu-class-unknown] metadata.labels[gpu-webhook.io/workload]: "batch" is not a workload class' in (
        done.stderr)
