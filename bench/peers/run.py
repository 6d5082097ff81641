"""gpu-webhook side by side with Kyverno and Gatekeeper on one real API server. Prints markdown; not a test, not CI.

    python bench/peers/run.py [--engines gpu-webhook,gpu-webhook-native,kyverno,gatekeeper] [--creates 300]
                              [--rounds 2]
                              [--skip outcomes,messages,cost] [--keep-logs DIR]

Starts the e2e control plane (tests/e2e/cluster.py: etcd, kube-apiserver, controller-manager, scheduler, kwok and
gpu-webhook on 127.0.0.1), builds the peers with bench/peers/build.sh (cached), and runs each peer the way its own
developer docs run it out of cluster: the project's manifests applied without the controller's Deployment, the
controller started here with the admin kubeconfig and its webhook on 127.0.0.1.

- Kyverno v1.19: its Helm chart from the module (charts/kyverno, background/cleanup/reports controllers off) and its
  CRDs (config/crds); `kyverno` (the admission controller) with the chart's arguments plus --serverIP, as
  DEVELOPMENT.md "Debugging local code" says; it makes its own certificates and webhook configurations. Admission
  reports are off: no reports controller runs to consume them.
- Gatekeeper v3.23: the release manifest of the module (deploy/gatekeeper.yaml) without its Deployments; the
  controller manager with the webhook Deployment's arguments (operations webhook and mutation-webhook) plus the
  audit Deployment's generate, status and mutation-status (the audit scan itself is off), --disable-cert-rotation
  and a certificate made here; a stand-in Pod object for POD_NAME (Gatekeeper owns its status objects by it); its
  two webhook configurations are registered with a URL, like gpu-webhook's.
- gpu-webhook native: the same rules as admission policies (`gpu-webhook policies render`), run by the API server
  itself; no process of its own, so its cost is the API server's CPU (the column "engine and API server CPU over no
  policy" compares it with the others).

Only one engine is registered at a time: gpu-webhook and Gatekeeper by applying or deleting their webhook
configurations, native mode by applying or deleting its policy bindings, Kyverno by applying or deleting its
ClusterPolicies (Kyverno owns its webhook configurations and derives their rules from the policies). Every engine's
processes run for the whole run.

Three parts, each printed as markdown for docs/comparison.md:
- outcomes: every document of tests/data/manifests and of ../shared/fixtures/real-manifests (read from there,
  never copied), and two Pods defined here whose own node selection meets the class map, through
  `kubectl create --dry-run=server` with each engine and with none: allowed or denied, and the final object's
  placement (nodeSelector, GPU tolerations, runtimeClassName);
- messages: what `kubectl apply` prints for three typical mistakes, per engine;
- cost: one interleaved run (rounds x engines in rotating order, same Pod mix): Pod-create p50/p99 through the API
  server, CPU seconds per 1,000 admissions of each engine's processes and of the API server (/proc), RSS and PSS
  at the end, and the API server's apiserver_admission_webhook_admission_duration_seconds per engine.
All traffic goes to 127.0.0.1; every loop is bounded.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from cluster import (  # noqa: E402
    LOOPBACK,
    Cluster,
    Proc,
    free_port,
    new_ca,
    new_leaf,
    running_cluster,
    spawn,
    wait_until,
)

Json = dict[str, Any]
GPU = "nvidia.com/gpu"
POLICIES = HERE / "policies"
REAL_MANIFESTS = REPO.parent / "shared" / "fixtures" / "real-manifests"
CORPUS = REPO / "tests" / "data" / "manifests"
HELM_SCRIPT = REPO / "tests" / "e2e" / "build_helm.sh"
OUTCOME_NAMESPACE = "outcomes"
BENCH_NAMESPACE = "bench"
WORKLOAD, GPU_TYPE = "gpu-webhook.io/workload", "gpu-webhook.io/gpu-type"


class EngineError(RuntimeError):
    """A peer could not be built, started or given its policy; str() is the exact error."""


# --------------------------------------------------------------------------------------------- helpers


def _run(argv: list[str], what: str, timeout: float = 3600, **kwargs: Any) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if done.returncode != 0:
        raise EngineError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{done.stderr[-4000:]}")
    return str(done.stdout)


def build(engine: str) -> Path:
    """bench/peers/build.sh ENGINE; returns the binary."""
    out = _run(["bash", str(HERE / "build.sh"), engine], f"building {engine}")
    return Path(out.strip().splitlines()[-1]) / engine


def module_dir(engine: str) -> Path:
    """The engine's module source in the Go module cache, at the version its go.mod pins."""
    module = {"kyverno": "github.com/kyverno/kyverno", "gatekeeper": "github.com/open-policy-agent/gatekeeper/v3"}
    out = _run(["go", "list", "-m", "-f", "{{.Dir}}", module[engine]], f"locating {engine}'s module",
               cwd=HERE / engine)
    return Path(out.strip())


def group_pids(proc: Proc) -> list[int]:
    """Every live process in the process group `proc` leads (spawn() starts a new session per process)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == proc.popen.pid:
            pids.append(int(entry.name))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (children that exited are not counted; none of these fork per request)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def memory_mib(pids: list[int]) -> tuple[float, float]:
    """(sum of RSS, sum of PSS) in MiB: RSS counts pages shared by forked workers once per worker, PSS splits them."""
    rss = pss = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
    return rss / 1024, pss / 1024


def histogram(text: str, metric: str) -> dict[str, tuple[float, float, dict[float, float]]]:
    """{webhook name: (sum, count, {le: cumulative count})} of a Prometheus histogram, summed over other labels."""
    out: dict[str, list[Any]] = {}
    for line in text.splitlines():
        if not line.startswith(metric) or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name_part, _, labels = head.partition("{")
        labels_map = dict(part.split("=", 1) for part in _split_labels(labels.rstrip("}")))
        webhook = labels_map.get("name", "").strip('"')
        entry = out.setdefault(webhook, [0.0, 0.0, {}])
        if name_part.endswith("_sum"):
            entry[0] += float(value)
        elif name_part.endswith("_count"):
            entry[1] += float(value)
        elif name_part.endswith("_bucket"):
            le = float(labels_map["le"].strip('"'))
            entry[2][le] = entry[2].get(le, 0.0) + float(value)
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def _split_labels(text: str) -> list[str]:
    parts, current, quoted = [], "", False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    if current:
        parts.append(current)
    return parts


def _docs(text: str) -> list[Json]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


# --------------------------------------------------------------------------------------------- engines


@dataclass
class Engine:
    """One policy engine: how to start it once, register it, unregister it, and which processes are its own."""

    name: str
    webhook_match: str  # a substring of its webhook names in the API server's metrics
    version: str = ""
    procs: list[Proc] = field(default_factory=list)
    error: str = ""  # why it is not in the run (the exact error), or ""

    def start(self, cluster: Cluster, work: Path) -> None:
        """Start the engine's processes (unregistered)."""

    def activate(self, cluster: Cluster) -> None:
        """Make the API server call this engine."""

    def deactivate(self, cluster: Cluster) -> None:
        """Make the API server stop calling this engine."""

    def pids(self) -> list[int]:
        """The engine's live processes."""
        return [pid for proc in self.procs for pid in group_pids(proc)]


class NoPolicy(Engine):
    """The API server alone (its built-in admission only)."""


class GpuWebhook(Engine):
    """This project: the harness's `gpu-webhook serve --cluster`, registered by its shipped configurations."""

    configs: list[Json]

    def start(self, cluster: Cluster, work: Path) -> None:
        self.procs = [cluster.procs["gpu-webhook"]]
        self.configs = cluster.rendered_webhook_configurations()
        self.version = "this checkout"
        self.deactivate(cluster)

    def activate(self, cluster: Cluster) -> None:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.configs))

    def deactivate(self, cluster: Cluster) -> None:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "gpu-webhook",
                        "--ignore-not-found")


class GpuWebhookNative(Engine):
    """This project in native mode: its rules as a MutatingAdmissionPolicy and ValidatingAdmissionPolicies
    (`gpu-webhook policies render`), which the API server runs itself. No process of its own: its cost is in the
    API server's CPU. The CRD, params and policies are applied once; registering it applies the bindings."""

    bindings: list[Json]

    def start(self, cluster: Cluster, work: Path) -> None:
        from webhook.admission.loader import load_policy
        from webhook.policy import native

        crd, *rest = native.render(load_policy(REPO / "rules"))
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd))
        cluster.kubectl("wait", "--for=condition=Established", "crd/" + crd["metadata"]["name"], "--timeout=60s")
        self.bindings = [d for d in rest if d["kind"].endswith("Binding")]
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(d for d in rest if d not in self.bindings))
        self.version = "this checkout"

    def activate(self, cluster: Cluster) -> None:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.bindings))

    def deactivate(self, cluster: Cluster) -> None:
        for binding in self.bindings:
            cluster.kubectl("delete", binding["kind"].lower(), binding["metadata"]["name"], "--ignore-not-found")


class Kyverno(Engine):
    """Kyverno's admission controller out of cluster (DEVELOPMENT.md, "Debugging local code")."""

    policy = POLICIES / "kyverno" / "gpu-policy.yaml"

    def start(self, cluster: Cluster, work: Path) -> None:
        binary = build("kyverno")
        source = module_dir("kyverno")
        self.version = source.name.split("@", 1)[1]
        chart = work / "kyverno-chart"
        shutil.copytree(source / "charts" / "kyverno", chart)
        for path in chart.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        # The chart's remote dependencies (kyverno-api, openreports, reports-server) cannot be fetched here: their
        # CRDs come from the module's config/crds instead, and reports-server is off by default anyway.
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        meta["dependencies"] = [d for d in meta.get("dependencies", []) if "repository" not in d]
        (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
        (chart / "Chart.lock").unlink(missing_ok=True)
        helm_dir = _run(["bash", str(HELM_SCRIPT)], "building helm").strip().splitlines()[-1]
        rendered = _docs(_run([f"{helm_dir}/helm", "template", "kyverno", str(chart), "--namespace", "kyverno",
                               "--kube-version", "1.36.3",
                               "--set", "backgroundController.enabled=false,cleanupController.enabled=false,"
                                        "reportsController.enabled=false,crds.install=false,"
                                        "openreports.installCrds=false,reportsServer.enabled=false"],
                              "helm template charts/kyverno"))
        deployment = next(d for d in rendered if d["kind"] == "Deployment"
                          and d["metadata"]["name"] == "kyverno-admission-controller")
        keep = [d for d in rendered if d["kind"] not in ("Deployment", "Job", "Pod")]
        crds = [d for p in sorted((source / "config" / "crds").rglob("*.yaml")) for d in _docs(p.read_text())]
        cluster.ensure_namespace("kyverno")
        cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds), timeout=120)
        cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(keep), timeout=120)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        port = free_port()
        args = [a for a in container["args"] if not a.startswith(("--webhookServerPort=", "--metricsPort=",
                                                                  "--controllerRuntimeMetricsAddress=",
                                                                  "--admissionReports="))]
        args += [f"--kubeconfig={cluster.kubeconfig}", f"--serverIP={LOOPBACK}:{port}",
                 f"--webhookServerHost={LOOPBACK}", f"--webhookServerPort={port}",
                 f"--metricsHost={LOOPBACK}", f"--metricsPort={free_port()}",
                 f"--controllerRuntimeMetricsAddress={LOOPBACK}:{free_port()}", "--admissionReports=false",
                 "--backgroundServiceAccountName=system:serviceaccount:kyverno:kyverno-background-controller",
                 "--reportsServiceAccountName=system:serviceaccount:kyverno:kyverno-reports-controller"]
        env = dict(os.environ)
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
        env |= {"KYVERNO_NAMESPACE": "kyverno", "KYVERNO_POD_NAME": "kyverno-out-of-cluster",
                "TUF_ROOT": str(work / "kyverno-sigstore"), "HOME": str(work)}
        self.procs = [spawn("kyverno", [str(binary), *args], cluster.logdir, env=env, cwd=work)]
        cluster.procs["kyverno"] = self.procs[0]

        def registered() -> bool:
            if not self.procs[0].alive():
                raise EngineError(f"kyverno exited {self.procs[0].popen.returncode}:\n{self.procs[0].log_tail()}")
            done = cluster.kubectl("get", "validatingwebhookconfiguration", "kyverno-policy-validating-webhook-cfg",
                                   check=False)
            return bool(done.returncode == 0)

        wait_until(registered, 180, "Kyverno to register its webhook configurations")

    def activate(self, cluster: Cluster) -> None:
        def applied() -> bool:
            done = cluster.kubectl("apply", "-f", str(self.policy), check=False)
            if done.returncode != 0:
                raise EngineError(f"kubectl apply -f {self.policy.relative_to(REPO)}:\n{done.stderr}")
            return True

        wait_until(applied, 60, "the Kyverno policies to be accepted", interval=1)
        cluster.kubectl("wait", "--for=condition=Ready", "clusterpolicy", "--all", "--timeout=120s", timeout=130)

    def deactivate(self, cluster: Cluster) -> None:
        cluster.kubectl("delete", "clusterpolicy", "--all", "--ignore-not-found", timeout=120)


STAND_IN_POD: Json = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "gatekeeper-out-of-cluster", "namespace": "gatekeeper-system",
                 "labels": {"app": "gatekeeper-stand-in"},
                 "annotations": {"description": "stand-in for Gatekeeper run out of cluster by bench/peers/run.py"}},
    "spec": {"schedulerName": "stand-in-never-scheduled",
             "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
             "containers": [{"name": "manager", "image": "openpolicyagent/gatekeeper-stand-in:none",
                             "securityContext": {"allowPrivilegeEscalation": False,
                                                 "capabilities": {"drop": ["ALL"]}}}]},
}


class Gatekeeper(Engine):
    """Gatekeeper's controller manager out of cluster (its Makefile's `run`, with the webhook Deployment's flags)."""

    configs: list[Json]

    def start(self, cluster: Cluster, work: Path) -> None:
        binary = build("gatekeeper")
        source = module_dir("gatekeeper")
        self.version = source.name.split("@", 1)[1]
        release = _docs((source / "deploy" / "gatekeeper.yaml").read_text())
        deployment = next(d for d in release if d["kind"] == "Deployment"
                          and d["metadata"]["name"] == "gatekeeper-controller-manager")
        hooks = [d for d in release if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")]
        keep = [d for d in release if d not in hooks and d["kind"] not in ("Deployment",)]
        cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(keep), timeout=120)
        # Gatekeeper owns its status objects by its own Pod (POD_NAME), which must exist: a stand-in Pod object for
        # the process running here, which never schedules (no such scheduler).
        cluster.kubectl("apply", "-f", "-", input=json.dumps(STAND_IN_POD))
        port = free_port()
        certs = work / "gatekeeper-certs"
        certs.mkdir()
        ca, ca_key, ca_cert = new_ca("gatekeeper-out-of-cluster-ca")
        leaf = new_leaf(ca_key, ca_cert, "gatekeeper-webhook-service.gatekeeper-system.svc", server=True,
                        dns=["gatekeeper-webhook-service.gatekeeper-system.svc"], ips=[LOOPBACK])
        (certs / "ca.crt").write_bytes(ca.cert)
        (certs / "tls.crt").write_bytes(leaf.cert)
        (certs / "tls.key").write_bytes(leaf.key)
        bundle = base64.b64encode(ca.cert).decode()
        self.configs = []
        for hook_config in hooks:
            hook_config = copy.deepcopy(hook_config)
            for hook in hook_config["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://{LOOPBACK}:{port}{path}", "caBundle": bundle}
            self.configs.append(hook_config)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        health = free_port()
        args = [a for a in container["args"] if not a.startswith("--port=")]
        # The release runs these in its audit Deployment: creating each template's constraint CRD (generate) and
        # the status objects. One process here, without the periodic audit (not part of admission).
        args += ["--operation=generate", "--operation=status", "--operation=mutation-status"]
        args += [f"--port={port}", f"--host={LOOPBACK}", f"--cert-dir={certs}", "--disable-cert-rotation",
                 f"--health-addr={LOOPBACK}:{health}", f"--metrics-addr={LOOPBACK}:{free_port()}"]
        env = dict(os.environ) | {"POD_NAMESPACE": "gatekeeper-system", "POD_NAME": "gatekeeper-out-of-cluster",
                                  "NAMESPACE": "gatekeeper-system", "CONTAINER_NAME": "manager",
                                  "KUBECONFIG": str(cluster.kubeconfig), "HOME": str(work)}
        self.procs = [spawn("gatekeeper", [str(binary), *args], cluster.logdir, env=env, cwd=work)]
        cluster.procs["gatekeeper"] = self.procs[0]

        def ready() -> bool:
            if not self.procs[0].alive():
                raise EngineError(f"gatekeeper exited {self.procs[0].popen.returncode}:\n{self.procs[0].log_tail()}")
            import urllib.request

            try:
                with urllib.request.urlopen(f"http://{LOOPBACK}:{health}/readyz", timeout=5) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(ready, 180, "Gatekeeper to be ready", interval=1)
        # The policy stays installed; registering the webhooks switches Gatekeeper on.
        cluster.kubectl("apply", "-f", str(POLICIES / "gatekeeper" / "01-template.yaml"))

        def template_created() -> bool:
            done = cluster.kubectl("get", "constrainttemplate", "k8sgpupolicy", "-o", "json", check=False)
            if done.returncode != 0:
                return False
            status = json.loads(done.stdout).get("status", {})
            for pod_status in status.get("byPod", []):
                if pod_status.get("errors"):
                    raise EngineError(f"ConstraintTemplate k8sgpupolicy: {pod_status['errors']}")
            return bool(status.get("created"))

        wait_until(template_created, 120, "the ConstraintTemplate to create its CRD", interval=1)
        wait_until(lambda: cluster.kubectl("get", "k8sgpupolicy", check=False).returncode == 0, 60,
                   "the K8sGpuPolicy kind to be served")
        for name in ("02-constraint.yaml", "03-mutators.yaml"):
            cluster.kubectl("apply", "-f", str(POLICIES / "gatekeeper" / name))

    def activate(self, cluster: Cluster) -> None:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.configs))

    def deactivate(self, cluster: Cluster) -> None:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                        "gatekeeper-mutating-webhook-configuration", "gatekeeper-validating-webhook-configuration",
                        "--ignore-not-found")


# --------------------------------------------------------------------------------------------- probes


def probe_pod(name: str, labels: dict[str, str], gpus: int = 1) -> Json:
    """A Pod that every engine places when it is registered (a class label, so Gatekeeper's mutators match)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"restartPolicy": "Never", "schedulerName": "bench-nobody",
                     "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                                     "resources": {"limits": {GPU: str(gpus)}} if gpus else {}}]}}


def dry_run(cluster: Cluster, obj: Json, namespace: str) -> tuple[bool, Json | None, str]:
    """(allowed, the object the API server would store, stderr) of `kubectl create --dry-run=server`."""
    done = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-",
                           input=json.dumps(obj), check=False)
    if done.returncode == 0:
        return True, json.loads(done.stdout), done.stderr
    return False, None, done.stderr


def engine_answers(cluster: Cluster) -> bool:
    """True when the probe Pod comes back placed (some engine's mutation ran)."""
    allowed, obj, _ = dry_run(cluster, probe_pod("probe", {WORKLOAD: "inference"}), BENCH_NAMESPACE)
    return bool(allowed and obj and obj["spec"].get("runtimeClassName") == "nvidia")


def switch(cluster: Cluster, engines: list[Engine], active: Engine) -> None:
    """Register `active` alone and wait until the API server calls it (or calls nothing, for the baseline)."""
    for engine in engines:
        if engine is not active:
            engine.deactivate(cluster)
    if not isinstance(active, NoPolicy):
        active.activate(cluster)
    want = not isinstance(active, NoPolicy)
    wait_until(lambda: engine_answers(cluster) == want, 120,
               f"the API server to {'call ' + active.name if want else 'call no engine'}", interval=0.5)
    time.sleep(2)  # both configurations (mutating, validating) are loaded by the same informer; let it settle


# --------------------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Document:
    """One object of a manifest file, as a user would apply it."""

    source: str  # file name and document index
    obj: Json


def corpus() -> list[Document]:
    """Every document of the repo's corpus and of the real-manifests fixtures (read in place)."""
    files = sorted(CORPUS.glob("*.yaml")) + sorted(CORPUS.glob("*.json"))
    if REAL_MANIFESTS.is_dir():
        files += sorted(REAL_MANIFESTS.glob("*.yaml"))
    out = []
    for path in files:
        label = f"{path.parent.name}/{path.name}"
        try:
            docs = _docs(path.read_text())
        except yaml.YAMLError as exc:
            out.append(Document(f"{label} (unparseable: {str(exc).splitlines()[0]})", {}))
            continue
        expanded: list[Json] = []
        for doc in docs:
            expanded += doc.get("items", []) if doc.get("kind", "").endswith("List") else [doc]
        for index, doc in enumerate(expanded):
            suffix = f"#{index}" if len(expanded) > 1 else ""
            name = (doc.get("metadata") or {}).get("name") or (doc.get("metadata") or {}).get("generateName", "")
            out.append(Document(f"{label}{suffix} {doc.get('kind', '?')}/{name}", doc))
    return out + placement_cases()


def placement_cases() -> list[Document]:
    """Pods the corpus lacks, where the Pod's own node selection meets the class map (defined here, in the harness):
    one selects the training nodes by their node label and says nothing else; one is labelled training but selects
    a T4 by the well-known `accelerator` label."""
    by_node_label = probe_pod("selects-training", {}, 1)
    by_node_label["spec"]["nodeSelector"] = {"workload": "training"}
    contradicting = probe_pod("training-on-t4", {WORKLOAD: "training"}, 1)
    contradicting["spec"]["nodeSelector"] = {"accelerator": "nvidia-tesla-t4"}
    for pod in (by_node_label, contradicting):
        pod["spec"].pop("schedulerName")
    return [Document("harness: nodeSelector workload=training, no labels", by_node_label),
            Document("harness: label workload=training, nodeSelector accelerator=nvidia-tesla-t4", contradicting)]


def pod_spec(obj: Json) -> Json | None:
    """The pod spec an object carries (a Pod's, a template's, a CronJob's job template's), or None."""
    spec: Json = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return spec
    if obj.get("kind") == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    found = (spec.get("template") or {}).get("spec")
    return dict(found) if isinstance(found, dict) else None


def placement(obj: Json) -> str:
    """nodeSelector, GPU tolerations and runtimeClassName of the object's pod spec, in one short cell."""
    spec = pod_spec(obj)
    if spec is None:
        return "(no pod spec)"
    parts = []
    selector = spec.get("nodeSelector") or {}
    if selector:
        parts.append("sel " + ",".join(f"{k}={v}" for k, v in sorted(selector.items())))
    tolerations = [t for t in spec.get("tolerations") or [] if t.get("key") == GPU]
    if tolerations:
        parts.append(f"tol×{len(tolerations)}")  # noqa: RUF001 (a multiplication sign, on purpose)
    if spec.get("runtimeClassName"):
        parts.append(f"rc {spec['runtimeClassName']}")
    return "; ".join(parts) or "-"


def denial(stderr: str, engine: str) -> str:
    """Who denied the request, in one short cell, from kubectl's error text."""
    text = stderr.strip().splitlines()[0] if stderr.strip() else "(no message)"
    if "admission webhook" in text:
        hook = text.split("admission webhook", 1)[1].split('"')[1]
        return f"denied by {hook}"
    if " is invalid:" in text:
        return "invalid (API server)"
    if "no matches for kind" in text or "ensure CRDs are installed" in text:
        return "no such kind (CRD not installed)"
    if "AlreadyExists" in text:
        return "exists already in the test cluster"
    if "(BadRequest)" in text:
        return "bad request (API server: " + text.rsplit(":", 1)[-1].strip()[:60] + ")"
    return "error: " + text[:80]


def outcomes(cluster: Cluster, engines: list[Engine]) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The outcome of every corpus document per engine; returns (column names, {source: {engine: cell}})."""
    docs = corpus()
    for doc in docs:
        namespace = (doc.obj.get("metadata") or {}).get("namespace")
        if namespace:
            cluster.ensure_namespace(namespace)
    cluster.ensure_namespace(OUTCOME_NAMESPACE)
    table: dict[str, dict[str, str]] = {d.source: {} for d in docs}
    for engine in engines:
        switch(cluster, engines, engine)
        for doc in docs:
            if not doc.obj:
                table[doc.source][engine.name] = "unparseable YAML"
                continue
            namespace = (doc.obj.get("metadata") or {}).get("namespace") or OUTCOME_NAMESPACE
            allowed, stored, stderr = dry_run(cluster, doc.obj, namespace)
            cell = ("allowed: " + placement(stored)) if allowed and stored else denial(stderr, engine.name)
            if allowed and "Warning:" in stderr:
                cell += " (warning)"
            table[doc.source][engine.name] = cell
    return [e.name for e in engines], table


def print_outcomes(columns: list[str], table: dict[str, dict[str, str]]) -> None:
    print("### Outcomes: `kubectl create --dry-run=server`, per document\n")
    print("| document | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for source, cells in table.items():
        print(f"| {source} | " + " | ".join(cells.get(c, "") for c in columns) + " |")
    differ = [s for s, cells in table.items()
              if len({cells.get(c, "").replace(" (warning)", "") for c in columns if c != "no policy"}) > 1]
    print(f"\n{len(table)} documents; the engines disagree on {len(differ)}:\n")
    for source in differ:
        print(f"- {source}")
    print()


# --------------------------------------------------------------------------------------------- messages


def mistakes() -> dict[str, Json]:
    """Three typical mistakes as a user writes them (a class label, so that only the mistake is judged)."""
    base = probe_pod("train", {WORKLOAD: "training"})
    base["spec"].pop("schedulerName")
    unequal = copy.deepcopy(base)
    unequal["spec"]["containers"][0]["resources"] = {"requests": {GPU: "1"}, "limits": {GPU: "2"}}
    requests_only = copy.deepcopy(base)
    requests_only["spec"]["containers"][0]["resources"] = {"requests": {GPU: "1"}}
    unknown = probe_pod("infer", {GPU_TYPE: "v100"})
    unknown["spec"].pop("schedulerName")
    return {"requests != limits": unequal, "GPU in requests only": requests_only,
            "a class that does not exist (gpu-type v100)": unknown}


def messages(cluster: Cluster, engines: list[Engine], work: Path) -> dict[str, dict[str, str]]:
    """{mistake: {engine: what `kubectl apply -f train.yaml` prints}} (created objects are deleted again)."""
    cluster.ensure_namespace("messages")
    out: dict[str, dict[str, str]] = {m: {} for m in mistakes()}
    for engine in engines:
        switch(cluster, engines, engine)
        for mistake, pod in mistakes().items():
            path = work / f"{pod['metadata']['name']}.yaml"
            path.write_text(yaml.safe_dump(pod, sort_keys=False))
            done = subprocess.run([str(cluster.kubectl_path), "apply", "-n", "messages", "-f", path.name],
                                  capture_output=True, text=True, env=cluster.env(), cwd=work, timeout=60, check=False)
            out[mistake][engine.name] = (done.stdout + done.stderr).strip()
            cluster.kubectl("delete", "pod", "-n", "messages", pod["metadata"]["name"], "--ignore-not-found",
                            "--wait=false")
    return out


def print_messages(table: dict[str, dict[str, str]]) -> None:
    print("### Messages: what `kubectl apply -f FILE` prints\n")
    for mistake, by_engine in table.items():
        print(f"#### {mistake}\n")
        for engine, text in by_engine.items():
            print(f"{engine}:\n\n```\n{text}\n```\n")


# --------------------------------------------------------------------------------------------- cost


POD_MIX = [
    ("inference, 1 GPU", {WORKLOAD: "inference"}, 1),
    ("a100, 2 GPUs", {GPU_TYPE: "a100"}, 2),
    ("CPU only", {}, 0),
]


@dataclass
class Batch:
    """What one batch of creates measured."""

    latencies: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # engine or "kube-apiserver" -> CPU seconds in the batch
    calls: dict[str, tuple[float, float]] = field(default_factory=dict)  # webhook name -> (seconds, count) delta


def create_batch(core: Any, pods: list[Json], creates: int) -> list[float]:
    latencies = []
    for index in range(creates):
        pod = copy.deepcopy(pods[index % len(pods)])
        started = time.perf_counter()
        core.create_namespaced_pod(BENCH_NAMESPACE, pod, _preload_content=False)
        latencies.append(time.perf_counter() - started)
    return latencies


def cost(cluster: Cluster, engines: list[Engine], creates: int, rounds: int) -> tuple[dict[str, Batch], str]:
    """One interleaved run; returns ({engine: all its batches merged}, the memory table)."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    pods = []
    for name, labels, gpus in POD_MIX:
        pod = probe_pod("x", labels, gpus)
        pod["metadata"] = {"generateName": "bench-" + name.split(",")[0].replace(" ", "-").lower() + "-",
                           "labels": labels}
        pods.append(pod)
    apiserver = cluster.procs["kube-apiserver"]
    merged = {e.name: Batch() for e in engines}
    print(f"(cost run starts; load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
    for round_index in range(rounds):
        order = engines[round_index % len(engines):] + engines[:round_index % len(engines)]
        for engine in order:
            switch(cluster, engines, engine)
            create_batch(core, pods, 30)  # warm-up: connections, caches, the engine's first calls
            core.delete_collection_namespaced_pod(BENCH_NAMESPACE, grace_period_seconds=0)
            before_cpu = {e.name: cpu_seconds(e.pids()) for e in engines} | {
                "kube-apiserver": cpu_seconds(group_pids(apiserver))}
            before_hist = histogram(cluster.raw_text("/metrics")[1],
                                    "apiserver_admission_webhook_admission_duration_seconds")
            batch = merged[engine.name]
            batch.latencies += create_batch(core, pods, creates)
            after_cpu = {e.name: cpu_seconds(e.pids()) for e in engines} | {
                "kube-apiserver": cpu_seconds(group_pids(apiserver))}
            after_hist = histogram(cluster.raw_text("/metrics")[1],
                                   "apiserver_admission_webhook_admission_duration_seconds")
            for key, value in after_cpu.items():
                batch.cpu[key] = batch.cpu.get(key, 0.0) + value - before_cpu.get(key, 0.0)
            for hook, (total, count, _) in after_hist.items():
                old_total, old_count, _ = before_hist.get(hook, (0.0, 0.0, {}))
                if count - old_count:
                    seconds, calls = batch.calls.get(hook, (0.0, 0.0))
                    batch.calls[hook] = (seconds + total - old_total, calls + count - old_count)
            core.delete_collection_namespaced_pod(BENCH_NAMESPACE, grace_period_seconds=0)
    lines = ["| engine | processes | RSS MiB | PSS MiB |", "|---|---|---|---|"]
    for engine in engines:
        if isinstance(engine, NoPolicy):
            continue
        pids = engine.pids()
        if not pids:
            lines.append(f"| {engine.name} | 0 | (in the API server) | (in the API server) |")
            continue
        rss, pss = memory_mib(pids)
        lines.append(f"| {engine.name} | {len(pids)} | {rss:.0f} | {pss:.0f} |")
    rss, pss = memory_mib(group_pids(apiserver))
    lines.append(f"| kube-apiserver (for scale) | 1 | {rss:.0f} | {pss:.0f} |")
    return merged, "\n".join(lines)


def print_cost(engines: list[Engine], merged: dict[str, Batch], memory: str, creates: int, rounds: int) -> None:
    print(f"### Cost: one interleaved run, {rounds} round(s) x {creates} Pod creates per engine\n")
    print(f"Pod mix, in turn: {'; '.join(n for n, _, _ in POD_MIX)}. Each create is stored in etcd (scheduler "
          "name `bench-nobody`, so nothing schedules); latency is the client's wall time of one POST (Python client, "
          f"keep-alive). {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average at the end {os.getloadavg()[0]:.2f}.\n")
    baseline = merged.get("no policy")
    ours = merged.get("gpu-webhook")

    def pct(batch: Batch, q: int) -> float:
        return statistics.quantiles([s * 1000 for s in batch.latencies], n=100)[q - 1]

    print("| engine | p50 ms | p99 ms | p50 over no policy ms | engine CPU s / 1,000 creates | "
          "API server CPU s / 1,000 creates | engine and API server CPU over no policy s / 1,000 creates | "
          "webhook calls / create | API server's mean ms per call |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows: dict[str, tuple[float, float, float, float]] = {}
    base_api = (1000 * baseline.cpu.get("kube-apiserver", 0.0) / len(baseline.latencies)
                if baseline and baseline.latencies else float("nan"))
    for engine in engines:
        batch = merged[engine.name]
        if not batch.latencies:
            continue
        n = len(batch.latencies)
        p50, p99 = pct(batch, 50), pct(batch, 99)
        extra = p50 - pct(baseline, 50) if baseline and baseline.latencies else float("nan")
        engine_cpu = 1000 * batch.cpu.get(engine.name, 0.0) / n if not isinstance(engine, NoPolicy) else 0.0
        api_cpu = 1000 * batch.cpu.get("kube-apiserver", 0.0) / n
        own = [v for hook, v in batch.calls.items() if engine.webhook_match and engine.webhook_match in hook]
        calls = sum(c for _, c in own)  # its own webhooks only (another engine's, idle, may be called meanwhile)
        seconds = sum(s for s, _ in own)
        mean = 1000 * seconds / calls if calls else 0.0
        added = engine_cpu + api_cpu - base_api
        rows[engine.name] = (extra, engine_cpu, added, mean)
        print(f"| {engine.name} | {p50:.2f} | {p99:.2f} | {extra:+.2f} | {engine_cpu:.2f} | {api_cpu:.2f} | "
              f"{added:+.2f} | {calls / n:.2f} | {mean:.2f} |")
    if ours and "gpu-webhook" in rows:
        base = rows["gpu-webhook"]
        print("\nRatios against gpu-webhook (peer / gpu-webhook):\n")
        print("| engine | added p50 latency | engine CPU per admission | engine and API server CPU added per "
              "admission | API server's mean per call |")
        print("|---|---|---|---|---|")
        for name, (extra, engine_cpu, added, mean) in rows.items():
            if name in ("no policy",):
                continue
            ratio = [f"{a / b:.2f}x" if b > 0 and a > 0 else "n/a"  # native mode: no process, no webhook call
                     for a, b in zip((extra, engine_cpu, added, mean), base, strict=True)]
            print(f"| {name} | " + " | ".join(ratio) + " |")
    print("\nPer webhook, as the API server measured it (cumulative over the engine's batches):\n")
    print("| engine | webhook | calls | mean ms |")
    print("|---|---|---|---|")
    for engine in engines:
        for hook, (seconds, calls) in sorted(merged[engine.name].calls.items()):
            print(f"| {engine.name} | {hook} | {calls:.0f} | {1000 * seconds / calls:.2f} |")
    print("\nMemory at the end of the run (every process of the engine; PSS splits shared pages):\n")
    print(memory)
    print()


# --------------------------------------------------------------------------------------------- main


ENGINES: dict[str, Callable[[], Engine]] = {
    "gpu-webhook": lambda: GpuWebhook("gpu-webhook", "gpu-webhook"),
    "gpu-webhook-native": lambda: GpuWebhookNative("gpu-webhook native", ""),  # no webhook of its own
    "kyverno": lambda: Kyverno("kyverno", "kyverno"),
    "gatekeeper": lambda: Gatekeeper("gatekeeper", "gatekeeper"),
}


def main() -> int:
    """Start everything, run the parts asked for, print markdown."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="gpu-webhook,gpu-webhook-native,kyverno,gatekeeper",
                        help="comma-separated")
    parser.add_argument("--creates", type=int, default=300, help="Pod creates per engine per round (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: outcomes, messages, cost")
    parser.add_argument("--keep-logs", type=Path, help="copy every process's log here at the end")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="peers-bench-") as tmp, running_cluster(Path(tmp) / "cluster") as cluster:
        work = Path(tmp)
        cluster.ensure_namespace(BENCH_NAMESPACE)
        engines: list[Engine] = [NoPolicy("no policy", "")]
        failed: list[Engine] = []
        if "gpu-webhook" not in args.engines.split(","):
            GpuWebhook("gpu-webhook", "gpu-webhook").deactivate(cluster)  # the harness registered it
        for name in filter(None, args.engines.split(",")):
            engine = ENGINES[name]()
            try:
                engine.start(cluster, work)
                engines.append(engine)
            except (EngineError, TimeoutError, AssertionError, subprocess.SubprocessError) as exc:
                engine.error = str(exc)
                failed.append(engine)
                for proc in engine.procs:
                    proc.stop()
                traceback.print_exc(file=sys.stderr)
        try:
            print("## gpu-webhook, Kyverno and Gatekeeper on kube-apiserver v1.36.3 (bench/peers/run.py)\n")
            print("| engine | version | processes |")
            print("|---|---|---|")
            for engine in engines[1:]:
                print(f"| {engine.name} | {engine.version} | {len(engine.pids())} |")
            for engine in failed:
                print(f"| {engine.name} | not run | see below |")
            print()
            for engine in failed:
                print(f"{engine.name} could not be built or run:\n\n```\n{engine.error}\n```\n")
            if "outcomes" not in skip:
                print_outcomes(*outcomes(cluster, engines))
                sys.stdout.flush()
            if "messages" not in skip:
                print_messages(messages(cluster, engines, work))
                sys.stdout.flush()
            if "cost" not in skip:
                merged, memory = cost(cluster, engines, args.creates, args.rounds)
                print_cost(engines, merged, memory, args.creates, args.rounds)
            print(f"(whole run {time.monotonic() - started:.0f} s)")
        finally:
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in cluster.logdir.glob("*.log"):
                    shutil.copyfile(log, args.keep_logs / log.name)
            for engine in engines:
                if not isinstance(engine, GpuWebhook):
                    for proc in engine.procs:
                        proc.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
