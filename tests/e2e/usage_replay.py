"""A recorded-style week of dcgm-exporter data for `gpu-webhook usage`, and a VictoriaMetrics to hold it.

The replay writes dcgm-exporter's own exposition lines (its label order: gpu, UUID, pci_bus_id, device, modelName,
GPU_I_PROFILE/GPU_I_ID on MIG, Hostname before exporter 4.5 and hostname after, DCGM_FI_DRIVER_VERSION, then the
pod-resources labels container/namespace/pod) with a timestamp per line, and backfills VictoriaMetrics through its
/api/v1/import/prometheus endpoint, so hours of one-a-minute samples exist at once.

Grounded in the real H200 of tests/data/usage (copied from the captured fixtures):
- the time-sliced GPU is the real one: UUID GPU-7499c50f-2307-cd9c-d9cc-937afc16d5cb, `NVIDIA H200`, 143,771 MiB
  (616 reserved), held by four Pods as `<uuid>::0..3` (podresources-timesliced.json; the exporter's `vgpu` label);
- utilisation and memory values replay nvml-utilization.csv's phases (idle, light loop, saturated), cycled.
The other devices are the replay's own: made-up UUIDs of further H200s, an A100 in MIG mode with two 1g.10gb
instances (one held, one free), and a T4 whose Pod has been deleted. The `embedder` workload's activity (8-14 %)
and 20,000 MiB are not readings either: no captured phase sits between idle and saturated.
"""

from __future__ import annotations

import csv
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "usage"
BUILD_SCRIPT = Path(__file__).resolve().parent / "build_metrics.sh"
STEP = 60
H200_UUID = "GPU-7499c50f-2307-cd9c-d9cc-937afc16d5cb"
H200_MODEL = "NVIDIA H200"
H200_MIB, H200_RESERVED = 143771.0, 616.0
HELP = {  # dcgm-exporter's etc/default-counters.csv
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
}


def nvml_phases() -> dict[str, list[tuple[float, float]]]:
    """nvml-utilization.csv by phase: [(utilization %, memory used MiB)] once a second, as read on the H200."""
    phases: dict[str, list[tuple[float, float]]] = {}
    with (DATA / "nvml-utilization.csv").open() as f:
        for row in csv.DictReader(f):
            phases.setdefault(row["phase"], []).append((float(row["utilization_gpu_pct"]),
                                                       float(row["memory_used_mib"])))
    return phases


def timesliced_holders() -> list[tuple[str, str]]:
    """(Pod name, replica index) of the captured time-sliced GPU, from the kubelet's pod-resources answer."""
    answer = json.loads((DATA / "podresources-timesliced.json").read_text())
    holders = []
    for pod in answer["pod_resources"]:
        for device_id in pod["containers"][0]["devices"][0]["device_ids"]:
            uuid, replica = device_id.split("::")
            assert uuid == H200_UUID
            holders.append((pod["name"], replica))
    return sorted(holders)


@dataclass
class Device:
    """One GPU (or MIG instance) of the replay: its labels and its samples (one a minute)."""

    uuid: str
    model: str
    host: str
    card_mib: float
    activity: list[float]  # GPU_UTIL percent, or GR_ENGINE_ACTIVE ratio when `profiling`
    fb_used: list[float]
    holders: list[tuple[str, str]] = field(default_factory=list)  # (pod, vgpu replica or "")
    host_key: str = "hostname"
    gpu: str = "0"
    reserved: float = 0.0
    mig: tuple[str, str] | None = None
    profiling: bool = False

    def labels(self, pod: str, namespace: str, vgpu: str) -> str:
        parts = [("gpu", self.gpu), ("UUID", self.uuid), ("pci_bus_id", f"00000000:{int(self.gpu) + 6:02X}:00.0"),
                 ("device", f"nvidia{self.gpu}"), ("modelName", self.model)]
        if self.mig:
            parts += [("GPU_I_PROFILE", self.mig[0]), ("GPU_I_ID", self.mig[1])]
        parts += [(self.host_key, self.host), ("DCGM_FI_DRIVER_VERSION", "580.159.04"),
                  ("container", "cuda" if pod else ""), ("namespace", namespace if pod else ""), ("pod", pod)]
        if vgpu:
            parts.append(("vgpu", vgpu))
        return ",".join(f'{k}="{v}"' for k, v in parts)

    def lines(self, namespace: str, start: int) -> Iterator[str]:
        activity_metric = "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if self.profiling else "DCGM_FI_DEV_GPU_UTIL"
        for pod, vgpu in self.holders or [("", "")]:
            labels = self.labels(pod, namespace, vgpu)
            for i, (value, used) in enumerate(zip(self.activity, self.fb_used, strict=True)):
                ms = (start + i * STEP) * 1000
                free = self.card_mib - self.reserved - used
                yield f"{activity_metric}{{{labels}}} {value:g} {ms}"
                if self.profiling:
                    yield f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value * 100:g} {ms}"
                yield f"DCGM_FI_DEV_FB_USED{{{labels}}} {used:g} {ms}"
                yield f"DCGM_FI_DEV_FB_FREE{{{labels}}} {free:g} {ms}"
                yield f"DCGM_FI_DEV_FB_RESERVED{{{labels}}} {self.reserved:g} {ms}"


def cycled(samples: Sequence[tuple[float, float]], n: int) -> tuple[list[float], list[float]]:
    return [samples[i % len(samples)][0] for i in range(n)], [samples[i % len(samples)][1] for i in range(n)]


def fleet(pods: Mapping[str, str], minutes: int) -> list[Device]:
    """The replay's devices for the Pods the cluster created: logical name -> real Pod name."""
    phases = nvml_phases()
    light_util, light_fb = cycled(phases["light"], minutes)
    idle_util, idle_fb = cycled(phases["idle"], minutes)
    busy_util, busy_fb = cycled(phases["busy"], minutes)
    embed = [0.08 + 0.01 * (i % 7) for i in range(minutes)]  # 8..14 %, the replay's own values
    return [
        Device(H200_UUID, H200_MODEL, "kit-gpu-node", H200_MIB, light_util, light_fb, reserved=H200_RESERVED,
               holders=[(pods[name], replica) for name, replica in timesliced_holders()]),
        Device("GPU-0e2e0001-0000-4000-8000-000000000001", H200_MODEL, "h200-node-1", H200_MIB, idle_util, idle_fb,
               reserved=H200_RESERVED, host_key="Hostname", holders=[(pods["notebook"], "")]),
        Device("GPU-0e2e0001-0000-4000-8000-000000000002", H200_MODEL, "h200-node-1", H200_MIB, busy_util, busy_fb,
               reserved=H200_RESERVED, host_key="Hostname", gpu="1", holders=[(pods["trainer"], "")]),
        Device("GPU-0e2e0001-0000-4000-8000-000000000003", H200_MODEL, "h200-node-2", H200_MIB, embed,
               [20000.0] * minutes, reserved=H200_RESERVED, profiling=True, holders=[(pods["embedder"], "")]),
        Device("GPU-0e2e0002-0000-4000-8000-00000000a100", "NVIDIA A100-SXM4-80GB", "gpu-a100-0", 9856.0,
               busy_util, [4000.0] * minutes, mig=("1g.10gb", "7"), holders=[(pods["mig-infer"], "")]),
        Device("GPU-0e2e0002-0000-4000-8000-00000000a100", "NVIDIA A100-SXM4-80GB", "gpu-a100-0", 9856.0,
               [0.0] * minutes, [0.0] * minutes, mig=("1g.10gb", "9")),
        Device("GPU-0e2e0003-0000-4000-8000-000000000004", "Tesla T4", "gpu-t4-0", 15360.0, light_util,
               [300.0] * minutes, holders=[("batch-old-7c9f4", "")]),
    ]


def exposition(devices: Sequence[Device], namespace: str, start: int) -> str:
    """The devices' samples as exposition text with timestamps (one # HELP/# TYPE block per metric)."""
    by_metric: dict[str, list[str]] = {}
    for device in devices:
        for line in device.lines(namespace, start):
            by_metric.setdefault(line.split("{", 1)[0], []).append(line)
    out = []
    for metric, lines in by_metric.items():
        kind, text = HELP[metric]
        out += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}", *lines]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- the server


def build_victoria_metrics() -> Path:
    done = subprocess.run(["nice", "-n", "10", "bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tests/e2e/build_metrics.sh failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) / "victoria-metrics"


class VictoriaMetrics:
    """A single-node VictoriaMetrics on a free local port, its data in `workdir`."""

    def __init__(self, binary: Path, workdir: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "victoria-metrics.log"
        self.proc = subprocess.Popen(
            [str(binary), f"-storageDataPath={workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
             "-retentionPeriod=1y", "-search.disableCache", "-loggerLevel=WARN"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"victoria-metrics did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def backfill(self, text: str) -> None:
        request = urllib.request.Request(f"{self.url}/api/v1/import/prometheus", data=text.encode(), method="POST")
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 204, answer.status
        with urllib.request.urlopen(f"{self.url}/internal/force_flush", timeout=30):
            pass

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
