"""`gpu-webhook usage` against a real metrics server and a real control plane.

VictoriaMetrics single-node (tests/e2e/build_metrics.sh, built from the Go module proxy) is backfilled with six
hours of dcgm-exporter samples (usage_replay.py: the real H200's UUID, model and memory, and its NVML readings)
for Pods that exist in the e2e cluster: a Deployment's idle notebook, a busy Job, an underused StatefulSet, four
time-sliced Pods sharing the real GPU, a Pod on a MIG instance, plus a free MIG instance and a deleted Pod's series.
The report's numbers are checked against values computed here from the same samples.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cluster import GPU, Cluster, free_port, wait_until, yaml_of
from usage_replay import (
    H200_MIB,
    H200_UUID,
    STEP,
    VictoriaMetrics,
    build_victoria_metrics,
    cycled,
    exposition,
    fleet,
    nvml_phases,
)

pytestmark = pytest.mark.e2e
MINUTES = 360


@pytest.fixture(scope="module")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    server = VictoriaMetrics(build_victoria_metrics(), tmp_path_factory.mktemp("victoria"), free_port())
    try:
        yield server
    finally:
        server.stop()


def _container(gpus: int = 1) -> dict[str, Any]:
    return {"name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "command": ["sleep", "infinity"],
            "resources": {"limits": {GPU: str(gpus)}}}


def _template(app: str, labels: dict[str, str] | None = None, restart: str = "Always") -> dict[str, Any]:
    return {"metadata": {"labels": {"app": app, **(labels or {})}},
            "spec": {"restartPolicy": restart, "containers": [_container()]}}


def workloads() -> list[dict[str, Any]]:
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"ts-{i}"},
             "spec": {"containers": [_container()]}} for i in range(1, 5)]
    pods.append({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "mig-infer", "labels": {"gpu-webhook.io/gpu-type": "a100"}},
                 "spec": {"containers": [_container()]}})
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "notebook"},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "notebook"}}, "template": _template("notebook")}},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "trainer"},
         "spec": {"backoffLimit": 0,
                  "template": _template("trainer", {"gpu-webhook.io/workload": "training"}, "Never")}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "embedder"},
         "spec": {"replicas": 1, "serviceName": "embedder", "selector": {"matchLabels": {"app": "embedder"}},
                  "template": _template("embedder")}},
        *pods,
    ]


def _pod_names(cluster: Cluster, namespace: str) -> dict[str, str]:
    """Logical name (notebook, trainer, embedder, ts-1..4, mig-infer) -> the Pod's real name, once all exist."""
    def listed() -> dict[str, str] | None:
        items = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        names = [p["metadata"]["name"] for p in items]
        found = {}
        for logical in ("notebook", "trainer", "embedder", "ts-1", "ts-2", "ts-3", "ts-4", "mig-infer"):
            match = [n for n in names if n == logical or n.startswith(f"{logical}-")]
            if len(match) != 1:
                return None
            found[logical] = match[0]
        return found

    result: dict[str, str] = wait_until(listed, 60, "the usage scenario's Pods to be created")
    return result


@pytest.fixture(scope="module")
def scenario(cluster: Cluster, victoria: VictoriaMetrics) -> Iterator[dict[str, Any]]:
    namespace = "usage-e2e"
    cluster.ensure_namespace(namespace)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(*workloads()))
    try:
        pods = _pod_names(cluster, namespace)
        end = (int(time.time()) // STEP) * STEP - 600
        first = end - (MINUTES - 1) * STEP
        devices = fleet(pods, MINUTES)
        victoria.backfill(exposition(devices, namespace, first))
        yield {"namespace": namespace, "pods": pods, "end": end, "devices": devices}
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


def usage_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    env.pop("GPU_WEBHOOK_PROMETHEUS", None)
    return subprocess.run([sys.executable, "-m", "webhook", "usage", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def report_json(cluster: Cluster, victoria: VictoriaMetrics, scenario: dict[str, Any], *extra: str) -> dict[str, Any]:
    done = usage_cli(cluster, "--prometheus", victoria.url, "--since", f"{MINUTES}m", "--until",
                     str(scenario["end"]), "-n", scenario["namespace"], "-o", "json", *extra)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def q(values: Sequence[float], pct: int) -> float:
    """The pct-th percentile, linear between closest ranks (statistics' inclusive method)."""
    if len(set(values)) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def test_report_numbers_match_the_replayed_series(cluster: Cluster, victoria: VictoriaMetrics,
                                                  scenario: dict[str, Any]) -> None:
    report = report_json(cluster, victoria, scenario)
    rows = {(w["kind"], w["name"]): w for w in report["workloads"]}
    pods = scenario["pods"]
    hours = MINUTES * STEP / 3600
    phases = nvml_phases()
    busy, _ = cycled(phases["busy"], MINUTES)
    light, _ = cycled(phases["light"], MINUTES)
    embed = scenario["devices"][3].activity

    notebook = rows[("Deployment", "notebook")]
    assert notebook["pods"] == [f"{scenario['namespace']}/{pods['notebook']}"]
    assert (notebook["gpus"], notebook["verdict"], notebook["freeableGpus"]) == (1, "idle", 1)
    assert notebook["gpuHours"] == pytest.approx(hours) and notebook["idleGpuHours"] == pytest.approx(hours)
    assert notebook["memory"] == {"peakMiB": 1625, "cardMiB": H200_MIB}

    trainer = rows[("Job", "trainer")]
    assert trainer["verdict"] == "right-sized" and trainer["idleGpuHours"] == 0
    assert trainer["activity"]["p50"] == pytest.approx(q([v / 100 for v in busy], 50), abs=1e-4)
    assert trainer["activity"]["p95"] == pytest.approx(q([v / 100 for v in busy], 95), abs=1e-4)

    embedder = rows[("StatefulSet", "embedder")]
    assert embedder["activity"]["metric"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    assert embedder["activity"]["p95"] == pytest.approx(q(embed, 95), abs=1e-4)
    assert embedder["memory"] == {"peakMiB": 20000, "cardMiB": H200_MIB}
    assert (embedder["verdict"], embedder["freeableGpus"]) == ("oversized", 0.75)
    assert embedder["suggestion"].startswith("time-sliced (nvidia.com/gpu.shared: 1")

    for i in range(1, 5):  # four Pods on the real H200's replicas ::0..::3 hold one GPU between them
        ts = rows[("Pod", pods[f"ts-{i}"])]
        assert ts["devices"] == [H200_UUID] and ts["sharedWith"] == 4
        assert ts["gpus"] == pytest.approx(0.25) and ts["gpuHours"] == pytest.approx(hours / 4)
        assert ts["activity"]["p95"] == pytest.approx(q([v / 100 / 4 for v in light], 95), abs=1e-4)
        assert ts["verdict"] == "idle" and ts["idleGpuHours"] == pytest.approx(hours / 4)

    mig = rows[("Pod", pods["mig-infer"])]
    assert mig["verdict"] == "shared" and mig["gpuHours"] == pytest.approx(hours / 7, rel=1e-3)
    assert mig["devices"] == ["GPU-0e2e0002-0000-4000-8000-00000000a100 MIG 1g.10gb (GI 7)"]

    totals = report["totals"]
    assert totals["unallocatedDevices"] == 1  # the free MIG instance
    assert totals["freeableGpus"] == pytest.approx(1 + 0.75 + 4 * 0.25, abs=1e-3)
    assert totals["wholeGpusFreeable"] == 2
    assert totals["idleGpuHours"] == pytest.approx(2 * hours, rel=1e-3)
    [gone] = report["unjoined"]
    assert gone["series"] == 4 and gone["gpuHours"] == pytest.approx(hours)
    assert gone["examples"] == [f"{scenario['namespace']}/batch-old-7c9f4"]
    assert report["workloads"][0]["name"] == "notebook"  # most idle GPU-hours first


def test_human_and_csv_output(cluster: Cluster, victoria: VictoriaMetrics, scenario: dict[str, Any],
                              tmp_path: Path) -> None:
    args = ["--prometheus", victoria.url, "--since", f"{MINUTES}m", "--until", str(scenario["end"]),
            "-n", scenario["namespace"]]
    page = tmp_path / "idle-gpus.html"
    human = usage_cli(cluster, *args, "--plot", "notebook", "--html-file", str(page))
    assert human.returncode == 0, human.stderr
    html = page.read_text()  # the same ranking as a page, with the figure inlined (the dev extra has matplotlib)
    assert f"<td>Deployment/{scenario['namespace']}/notebook</td>" in html and html.count("<svg") == 1
    assert "2.75 GPUs could be freed (2 whole GPUs)" in html
    lines = human.stdout.splitlines()
    assert lines[2].split()[:2] == ["WORKLOAD", "GPUS"]
    assert lines[3].split()[0] == f"Deployment/{scenario['namespace']}/notebook"
    assert "2.75 GPUs could be freed (2 whole GPUs)" in human.stdout
    assert "Deployment/usage-e2e/notebook: DCGM_FI_DEV_GPU_UTIL" in human.stdout  # the plot's title
    assert human.stderr == f"gpu-webhook usage: wrote {page} (HTML)\n"  # no progress bar: stderr is no terminal
    csv_out = usage_cli(cluster, *args, "-o", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    header, *rows = csv_out.stdout.splitlines()
    assert header.startswith("workload,gpus,gpu_hours,idle_gpu_hours") and len(rows) == 8


def test_no_dcgm_data_in_the_window(cluster: Cluster, victoria: VictoriaMetrics, scenario: dict[str, Any]) -> None:
    done = usage_cli(cluster, "--prometheus", victoria.url, "--since", "1h", "--until",
                     str(scenario["end"] - 86400), "-n", scenario["namespace"])
    assert done.returncode == 2
    assert "no dcgm-exporter series" in done.stderr and "honor_labels: true" in done.stderr
    assert "Traceback" not in done.stderr


def test_series_without_pod_labels(cluster: Cluster, victoria: VictoriaMetrics, scenario: dict[str, Any]) -> None:
    """An exporter without its Kubernetes mapping: the same device lines with no container/namespace/pod."""
    when = scenario["end"] - 2 * 86400
    text = exposition(scenario["devices"][:1], scenario["namespace"], when)
    bare = "\n".join(line.split(',container="')[0] + "}" + line.split("}", 1)[1] if "{" in line else line
                     for line in text.splitlines())
    victoria.backfill(bare + "\n")
    done = usage_cli(cluster, "--prometheus", victoria.url, "--since", "30m", "--until", str(when + 1800),
                     "-n", scenario["namespace"])
    assert done.returncode == 2, done.stdout
    assert "carry no pod labels" in done.stderr and "DCGM_EXPORTER_KUBERNETES=true" in done.stderr


def test_prometheus_unreachable(cluster: Cluster) -> None:
    done = usage_cli(cluster, "--prometheus", f"http://127.0.0.1:{free_port()}", "-A")
    assert done.returncode == 2
    assert "cannot reach Prometheus at http://127.0.0.1:" in done.stderr and "port-forward" in done.stderr


def test_not_the_prometheus_api(cluster: Cluster) -> None:
    done = usage_cli(cluster, "--prometheus", cluster.server.replace("https://", "http://"), "-A")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "not the Prometheus API" in done.stderr or "cannot reach Prometheus" in done.stderr


def test_audit_gains_the_usage_view(cluster: Cluster, victoria: VictoriaMetrics, scenario: dict[str, Any]) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run([sys.executable, "-m", "webhook", "audit", "-n", scenario["namespace"], "--usage",
                           "--prometheus", victoria.url, "--since", f"{MINUTES}m", "--until", str(scenario["end"]),
                           "-o", "json"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["inventory"]["synced"] in (True, False)  # audit's own report is still there
    rows = {w["name"]: w for w in answer["usage"]["workloads"]}
    assert rows["notebook"]["verdict"] == "idle"
    assert rows["notebook"]["idleGpuHours"] == pytest.approx(MINUTES * STEP / 3600)
    assert answer["usage"]["totals"]["wholeGpusFreeable"] == 2


def test_doctor_mentions_the_pods_usage(cluster: Cluster, victoria: VictoriaMetrics,
                                        scenario: dict[str, Any]) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "GPU_WEBHOOK_PROMETHEUS": victoria.url}
    pod = scenario["pods"]["notebook"]
    done = subprocess.run([sys.executable, "-m", "webhook", "doctor", pod, "-n", scenario["namespace"],
                           "--since", f"{MINUTES}m", "--until", str(scenario["end"])],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode in (0, 1), done.stderr
    usage_line = next(line for line in done.stdout.splitlines() if line.startswith("Usage over"))
    assert f"(Deployment/{scenario['namespace']}/notebook): 1 GPU, 6.0 GPU-hours, 6.0 idle" in usage_line
    assert "  idle: release its GPUs" in done.stdout


def test_audit_usage_without_a_reachable_prometheus_exits_2(cluster: Cluster, scenario: dict[str, Any]) -> None:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run([sys.executable, "-m", "webhook", "audit", "-n", scenario["namespace"], "--usage",
                           "--prometheus", f"http://127.0.0.1:{free_port()}"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 2 and "gpu-webhook audit: cannot reach Prometheus" in done.stderr
