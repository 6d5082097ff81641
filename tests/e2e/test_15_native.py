"""Native mode on the real API server: the rules compiled to a MutatingAdmissionPolicy and
ValidatingAdmissionPolicies (`gpu-webhook policies render`), the seed's scenarios, and a differential run of the
same manifests through the webhook and through the native policies.

The module starts its own control plane with the harness's `running_cluster` (the session cluster keeps its
webhook registered for the other scenarios). On it, the differential first runs every manifest through the
registered webhook, then removes the webhook configurations, applies the native policies and runs them again.
Set GPU_WEBHOOK_NATIVE_TABLE=FILE to write the comparison as a Markdown table (docs/native-policy.md has it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import SEED_NODES, SEED_POD_INJECTED, Cluster, gpu_pod, injected, running_cluster, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
REAL = REPO.parent / "shared" / "fixtures" / "real-manifests"
CORPUS = sorted((REPO / "tests" / "data" / "manifests").glob("*.y*ml")) + sorted(
    (REPO / "tests" / "rule-cases" / "manifests").glob("*.yaml"))
KINDS = {"Pod", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicationController",
         "PodTemplate"}
RULE = re.compile(r"\[(gpu-[a-z-]+)\]")
NS = "native-diff"


def render(rules: Path = REPO / "rules") -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "webhook", "policies", "render", "--rules", str(rules)],
                          check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def apply_native(cluster: Cluster) -> None:
    """Apply the rendered objects: the CRD, once established the params, then the policies; wait until active."""
    objects = render()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(objects[0]))
    cluster.kubectl("wait", "--for=condition=Established", "crd/" + objects[0]["metadata"]["name"], "--timeout=60s")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects[1:]))
    cluster.ensure_namespace("native-probe")

    def active() -> bool:
        done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", "native-probe", "-f", "-",
                               input=json.dumps(gpu_pod("probe")), check=False)
        return done.returncode == 0 and "runtimeClassName" in json.loads(done.stdout)["spec"]

    wait_until(active, 60, "the API server to run the native policies", interval=0.5)


def remove_webhooks(cluster: Cluster) -> None:
    """Unregister gpu-webhook (the configurations manifests/base names `gpu-webhook`) and stop it."""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, "gpu-webhook")
    cluster.stop_webhook()


def narrow_for_hybrid(cluster: Cluster) -> None:
    """Patch the registered webhook configurations as manifests/components/hybrid does (both of its patches)."""
    component = yaml.safe_load((REPO / "manifests" / "components" / "hybrid" / "kustomization.yaml").read_text())
    for patch in component["patches"]:
        cluster.kubectl("patch", patch["target"]["kind"].lower(), patch["target"]["name"], "--type=json",
                        "-p", json.dumps(yaml.safe_load(patch["patch"])))


@pytest.fixture(scope="module")
def native_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[dict[str, Any]]]]:
    """A second control plane: the corpus through the webhook, then in hybrid mode (the webhook narrowed as
    manifests/components/hybrid does, and the native policies), then native policies only (its results kept)."""
    with running_cluster(tmp_path_factory.mktemp("native")) as cluster:
        cluster.ensure_namespace(NS)
        docs = corpus()
        through_webhook = [outcome(cluster, doc) for _, doc in docs]
        narrow_for_hybrid(cluster)
        apply_native(cluster)
        time.sleep(1)
        through_hybrid = [outcome(cluster, doc) for _, doc in docs]
        remove_webhooks(cluster)
        time.sleep(1)
        through_native = [outcome(cluster, doc) for _, doc in docs]
        rows = [{"source": source, "doc": doc, "webhook": w, "hybrid": h, "native": n}
                for (source, doc), w, h, n in zip(docs, through_webhook, through_hybrid, through_native, strict=True)]
        yield cluster, rows


def corpus() -> list[tuple[str, dict[str, Any]]]:
    """Every document of a kind the API server serves without CRDs: the repo's corpus and the real manifests."""
    files = [*CORPUS, *(sorted(REAL.glob("*.yaml")) if REAL.is_dir() else [])]
    out = []
    for path in files:
        try:
            documents = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError:
            continue  # the corpus's deliberately broken file
        for doc in documents:
            items = doc.get("items", []) if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
            for item in items:
                if isinstance(item, dict) and item.get("kind") in KINDS:
                    item.setdefault("metadata", {}).pop("namespace", None)
                    where = f"{path.parent.name}/{path.name}" if path.parent == REAL else str(path.relative_to(REPO))
                    out.append((f"{where} {item['kind']}/{item['metadata'].get('name') or '?'}", item))
    return out + rule_case_objects()


def rule_case_objects() -> list[tuple[str, dict[str, Any]]]:
    """The inline objects of the rule test cases that run on the packaged rules (CREATE at /mutate, no namespace
    of their own)."""
    out = []
    for path in sorted((REPO / "tests" / "rule-cases").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for case in (doc or {}).get("cases") or []:
                obj = case.get("object")
                if (not isinstance(obj, dict) or obj.get("kind") not in KINDS or case.get("mode", "mutate") != "mutate"
                        or case.get("operation", "CREATE") != "CREATE" or case.get("namespace")):
                    continue
                obj = json.loads(json.dumps(obj))
                obj.setdefault("metadata", {}).pop("namespace", None)
                out.append((f"tests/rule-cases/{path.name}: {case.get('name', '?')}", obj))
    return out


def outcome(cluster: Cluster, doc: dict[str, Any]) -> dict[str, Any]:
    """The API server's answer to a dry-run create: allowed, rule ids denied and warned, and the placement."""
    done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", NS, "-f", "-", input=json.dumps(doc),
                           check=False)
    warned = sorted({r for line in done.stderr.splitlines() if line.startswith("Warning:") for r in RULE.findall(line)})
    if done.returncode != 0:
        denied = sorted({r for line in done.stderr.splitlines() if not line.startswith("Warning:")
                         for r in RULE.findall(line)})
        error = next((line for line in done.stderr.splitlines() if not line.startswith("Warning:")), "")
        return {"allowed": False, "denied": denied or ["(api-server)"], "warned": warned, "error": error[:200]}
    stored = json.loads(done.stdout)
    placement = injected(stored) if stored.get("kind") == "Pod" else None
    if placement is not None:
        placement["affinity"] = stored["spec"].get("affinity")
    return {"allowed": True, "denied": [], "warned": warned, "placement": placement}


# Differences that are intended, each with its reason (docs/native-policy.md).
def intended(doc: dict[str, Any], webhook: dict[str, Any], native: dict[str, Any]) -> str | None:
    from webhook.admission.loader import load_policy
    from webhook.policy import native as compiled
    from webhook.policy import pods

    if not webhook["allowed"] and not native["allowed"] and native["denied"] == ["(api-server)"]:
        return ("refused in both; in native mode the API server's own validation answers first (it runs after "
                "the mutating stage and before the validating one), so its message has no rule id")
    policy = load_policy(REPO / "rules")
    for ref in pods.pod_specs(doc):
        spec = ref.spec
        if ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution"):
            return "deferred to the webhook: " + compiled.DEFERRED["affinity"]
        families = set()
        requested_only = False  # a GPU resource in some container's requests and not in its limits
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            limits = (c.get("resources") or {}).get("limits") or {}
            requests = (c.get("resources") or {}).get("requests") or {}
            families |= {r.pattern for n in {**limits, **requests}
                         if (r := policy.gpu_resource(n)) is not None and r.valid_for}
            requested_only = requested_only or any(policy.gpu_resource(n) is not None and n not in limits
                                                   for n in requests)
        if len(families) > 1:
            return "deferred to the webhook: " + compiled.DEFERRED["validFor"]
        if (requested_only and not webhook["allowed"] and not native["allowed"] and native["denied"]
                and set(native["denied"]) <= set(webhook["denied"])):
            return "refused in both; " + compiled.COUNTED_FROM_LIMITS
    only = set(compiled.WEBHOOK_ONLY)
    said = set(webhook["denied"]) | set(webhook["warned"])
    if said & only and not webhook["allowed"] and not set(webhook["denied"]) - only:
        return f"webhook-only ({', '.join(sorted(said & only))}: needs the live cluster)"
    if (webhook["allowed"], [r for r in webhook["denied"] if r not in only], [r for r in webhook["warned"] if r not in
            only], webhook.get("placement")) == (native["allowed"], native["denied"], native["warned"],
                                                 native.get("placement")):
        return f"webhook-only ({', '.join(sorted(said & only))}: needs the live cluster)"
    return None


def test_cuda_gpu_test_lands_on_a_t4_node_with_the_class_injected(native_cluster: tuple[Cluster, list]) -> None:
    cluster, _ = native_cluster
    cluster.ensure_namespace("native-seed")
    cluster.kubectl("create", "-n", "native-seed", "-f", "-", input=json.dumps(gpu_pod("cuda-gpu-test")))
    node = wait_until(lambda: json.loads(cluster.kubectl("get", "pod", "cuda-gpu-test", "-n", "native-seed", "-o",
                                                         "json").stdout)["spec"].get("nodeName"), 60, "scheduling")
    assert SEED_NODES[node] and SEED_NODES[node][0] == "t4", node
    stored = json.loads(cluster.kubectl("get", "pod", "cuda-gpu-test", "-n", "native-seed", "-o", "json").stdout)
    assert injected(stored) == SEED_POD_INJECTED
    assert not cluster.kubectl("get", "mutatingwebhookconfigurations", "-o", "name").stdout.strip()


def test_a100_job_lands_on_an_a100_node(native_cluster: tuple[Cluster, list]) -> None:
    cluster, _ = native_cluster
    from test_01_placement import A100_JOB

    cluster.ensure_namespace("native-a100")
    cluster.kubectl("apply", "-n", "native-a100", "-f", "-", input=A100_JOB)

    def bound() -> str | None:
        items = json.loads(cluster.kubectl("get", "pods", "-n", "native-a100", "-l", "job-name=a100-job", "-o",
                                           "json").stdout)["items"]
        return items[0]["spec"].get("nodeName") if items else None

    node = wait_until(bound, 90, "the a100-job Pod to be scheduled")
    assert SEED_NODES[node] and SEED_NODES[node][0] == "a100", node
    pod = json.loads(cluster.kubectl("get", "pods", "-n", "native-a100", "-l", "job-name=a100-job", "-o",
                                     "json").stdout)["items"][0]
    assert pod["spec"]["nodeSelector"] == {"accelerator": "nvidia-a100", "workload": "training"}
    assert pod["metadata"]["annotations"]["gpu-webhook.io/class"] == "workload=training,gpu-type=a100"


def test_dry_run_shows_the_injection(native_cluster: tuple[Cluster, list]) -> None:
    cluster, _ = native_cluster
    cluster.ensure_namespace("native-dry")
    done = cluster.kubectl("apply", "--dry-run=server", "-o", "yaml", "-n", "native-dry", "-f", "-",
                           input=yaml.safe_dump(gpu_pod("dry")))
    assert injected(yaml.safe_load(done.stdout)) == SEED_POD_INJECTED
    assert cluster.kubectl("get", "pod", "dry", "-n", "native-dry", check=False).returncode != 0


def test_requests_not_equal_to_limits_is_refused(native_cluster: tuple[Cluster, list]) -> None:
    cluster, _ = native_cluster
    pod = gpu_pod("mismatch", limits={"nvidia.com/gpu": "2"}, requests={"nvidia.com/gpu": "1"})
    done = cluster.kubectl("create", "-n", NS, "-f", "-", input=json.dumps(pod), check=False)
    assert done.returncode != 0
    # The API server's own validation answers before any validating policy (see docs/native-policy.md).
    assert 'resources.requests: Invalid value: "1": must be equal to nvidia.com/gpu limit of 2' in done.stderr


def test_a_workload_template_gets_the_rules_message(native_cluster: tuple[Cluster, list]) -> None:
    cluster, _ = native_cluster
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "infer"}, "spec": {
        "selector": {"matchLabels": {"app": "infer"}}, "template": {
            "metadata": {"labels": {"app": "infer", "gpu-webhook.io/workload": "batch"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    done = cluster.kubectl("create", "--dry-run=server", "-n", NS, "-f", "-", input=json.dumps(deployment), check=False)
    assert done.returncode != 0
    assert ('[gpu-class-unknown] spec.template.metadata.labels[gpu-webhook.io/workload]: "batch" is not a workload '
            "class; choose one of: inference, training") in done.stderr


def test_a_pod_at_the_size_limits_gets_an_answer_not_a_cost_error(native_cluster: tuple[Cluster, list]) -> None:
    cluster, _ = native_cluster
    pod = gpu_pod("wide")
    container = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**container, "name": f"c{i}"} for i in range(60)]
    pod["spec"]["tolerations"] = [{"key": f"k{i}", "operator": "Exists", "effect": "NoSchedule"} for i in range(200)]
    done = cluster.kubectl("create", "--dry-run=server", "-n", NS, "-f", "-", input=json.dumps(pod), check=False)
    assert "cost" not in done.stderr.lower(), done.stderr
    assert done.returncode != 0 and "[gpu-class-max] the Pod needs 60 GPUs" in done.stderr


NAMESPACE_RULES = """\
apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata: {name: research}
spec:
  namespaces:
    native-research:
      defaults: {workload: training}
      allowed: {gpu-type: [a100]}
"""


def research_rules(directory: Path) -> Path:
    """A rule directory: the shipped rules plus NAMESPACE_RULES (native-research: training on a100 only)."""
    rules = directory / "rules"
    rules.mkdir()
    (rules / "00-platform.yaml").write_text((REPO / "rules" / "gpu-policy.yaml").read_text())
    (rules / "10-research.yaml").write_text(NAMESPACE_RULES)
    return rules


def test_a_rule_edit_is_a_re_render_and_an_apply_of_the_params_only(native_cluster: tuple[Cluster, list],
                                                                     tmp_path: Path) -> None:
    cluster, _ = native_cluster
    rules = research_rules(tmp_path)
    cluster.ensure_namespace("native-research")
    # A t4 Deployment admitted under the old rules (0 replicas: only its template matters here).
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "old-t4"}, "spec": {
        "replicas": 0, "selector": {"matchLabels": {"app": "old-t4"}}, "template": {
            "metadata": {"labels": {"app": "old-t4", "gpu-webhook.io/gpu-type": "t4"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    cluster.kubectl("create", "-n", "native-research", "-f", "-", input=json.dumps(deployment))
    try:
        rendered = yaml.safe_dump_all(render(rules))
        # What the edit changes on the server (`kubectl apply` says "configured" for every policy even when
        # nothing changes, as it always sends their lists): only the params object.
        diff = cluster.kubectl("diff", "-f", "-", input=rendered, check=False)
        assert diff.returncode == 1, diff.stderr
        changed = sorted({line.split()[-1].rsplit("/", 1)[-1] for line in diff.stdout.splitlines()
                          if line.startswith("diff ")})
        assert changed == ["gpu-webhook.io.v1alpha1.GPUClassMap..gpu-webhook"], diff.stdout[:2000]
        cluster.kubectl("apply", "-f", "-", input=rendered)

        def placed() -> dict[str, Any]:
            done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", "native-research", "-f", "-",
                                   input=json.dumps(gpu_pod("plain")))
            return dict(json.loads(done.stdout))

        pod = wait_until(lambda: (p := placed())["metadata"]["annotations"]["gpu-webhook.io/class"] ==
                         "workload=training,gpu-type=a100" and p, 30, "the new params to be used")
        assert pod["spec"]["nodeSelector"] == {"workload": "training", "gpu-type": "a100"}
        t4 = gpu_pod("t4", labels={"gpu-webhook.io/gpu-type": "t4"})
        done = cluster.kubectl("create", "--dry-run=server", "-n", "native-research", "-f", "-", input=json.dumps(t4),
                               check=False)
        assert done.returncode != 0
        assert ("[gpu-class-not-allowed] namespace native-research may not use gpu-type t4 (from the label "
                "gpu-webhook.io/gpu-type); set the label gpu-webhook.io/gpu-type to one of: a100") in done.stderr
        # Scaling the old Deployment is not judged by the newer rule (its template is unchanged) ...
        cluster.kubectl("scale", "deployment", "old-t4", "-n", "native-research", "--replicas=0")
        cluster.kubectl("label", "deployment", "old-t4", "-n", "native-research", "team=ml")
        # ... a change to its template is.
        done = cluster.kubectl("set", "env", "deployment/old-t4", "-n", "native-research", "MODE=new", check=False)
        assert done.returncode != 0 and "[gpu-class-not-allowed]" in done.stderr, done.stderr
    finally:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(render()))


def test_differential_webhook_vs_native(native_cluster: tuple[Cluster, list]) -> None:
    _, rows = native_cluster
    assert len(rows) >= 20
    lines = ["| manifest | webhook | native | same? |", "|---|---|---|---|"]
    unexplained = []
    for row in rows:
        w, n = row["webhook"], row["native"]
        same = (w["allowed"], w["denied"], w["warned"], w.get("placement")) == (
            n["allowed"], n["denied"], n["warned"], n.get("placement"))
        why = None if same else intended(row["doc"], w, n)
        if not same and why is None:
            unexplained.append(f"{row['source']}:\n  webhook {w}\n  native  {n}")
        lines.append(f"| {row['source']} | {_cell(w)} | {_cell(n)} | {'yes' if same else why or '**no**'} |")
    table = os.environ.get("GPU_WEBHOOK_NATIVE_TABLE")
    if table:
        Path(table).write_text("\n".join(lines) + "\n")
    assert not unexplained, "\n".join(unexplained)


def _verdict(result: dict[str, Any]) -> tuple[Any, ...]:
    return result["allowed"], result["denied"], result["warned"], result.get("placement")


def test_differential_hybrid_is_the_webhook_or_what_native_mode_answers_first(
        native_cluster: tuple[Cluster, list]) -> None:
    """Hybrid mode gives the webhook's verdict. Where it does not, it gives native mode's, for the reasons native
    mode differs: the API server's own validation or a native refusal answers before the validating webhook (its
    live-cluster findings then go unsaid). Never for a Pod native mode defers to the webhook."""
    _, rows = native_cluster
    unexplained = []
    for row in rows:
        w, h, n = row["webhook"], row["hybrid"], row["native"]
        if _verdict(h) == _verdict(w):
            continue
        why = intended(row["doc"], w, n)
        if _verdict(h) != _verdict(n) or why is None or why.startswith("deferred"):
            unexplained.append(f"{row['source']}:\n  webhook {w}\n  hybrid  {h}\n  native  {n}")
    assert not unexplained, "\n".join(unexplained)


def _cell(result: dict[str, Any]) -> str:
    verdict = "allowed" if result["allowed"] else "denied " + ", ".join(result["denied"])
    if result["warned"]:
        verdict += "; warns " + ", ".join(result["warned"])
    placement = result.get("placement")
    if placement and placement.get("class"):
        verdict += f"; class {placement['class']}"
    return verdict
