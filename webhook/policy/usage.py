"""Measured GPU use against what Pods hold: dcgm-exporter series in, a ranked report out (pure, no I/O).

The shell (`webhook.cluster.prometheus`) reads range-query results from Prometheus and the cluster's Pods; this
module joins them and judges them with the rule files' `usage` section:

- A series names its device by `UUID` (also `uuid`, `gpu_uuid`), else by host (`hostname`, from dcgm-exporter
  4.5; `Hostname` before) and `gpu` index; a MIG instance adds `GPU_I_ID` and `GPU_I_PROFILE`.
- It names its Pod by `pod`/`namespace`/`container` (the kubelet pod-resources mapping), by `pod_name`/
  `pod_namespace`/`container_name` (an exporter run with `--use-old-namespace`), or by `exported_pod`/
  `exported_namespace` when Prometheus scraped with `honor_labels: false` and renamed the exporter's labels. Then
  `pod` is the exporter's own Pod, so once any series carries `exported_pod`, a series without it is an
  unallocated device, not the exporter's.
- Every series lands in a workload row or in a counted `Unjoined` reason; none is dropped silently.
- A device several Pods hold at the same instant (time-slicing: device ids `<uuid>::N`, exported as one series
  per Pod carrying the whole GPU's values) is split: each of N holders gets 1/N of its GPU-hours and 1/N of
  its activity. A MIG instance counts as `g/7` of a GPU (`g/4` on an A30) for GPU-hours; its activity is the
  instance's own ratio.

Activity is `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a 0..1 ratio) where a device has it, else `DCGM_FI_DEV_GPU_UTIL`
(percent, divided by 100). Card memory is `FB_USED + FB_FREE` (+ `FB_RESERVED` when exported).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
METRICS = (GR_ENGINE_ACTIVE, GPU_UTIL, FB_USED, FB_FREE, FB_RESERVED)

Verdict = Literal["idle", "oversized", "underused", "right-sized", "shared"]
_MIG_SLICES = re.compile(r"^(\d+)g\.")


class UsageError(ValueError):
    """Metrics that cannot be judged at all; the message names what is missing and how to fix the scrape."""


# --------------------------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Size:
    """A smaller way to hold a GPU (`usage.sizes` in the rule files), offered when a workload fits it."""

    name: str
    resource: str
    gpu_fraction: float
    memory_mib: float | None = None  # None: a fair share of the card (gpu_fraction x card memory)
    max_activity: float | None = None  # None: gpu_fraction
    models: tuple[str, ...] = ()  # modelName globs it exists on; empty: any
    labels: Mapping[str, str] = field(default_factory=dict)  # the class labels a Pod of this size sets

    def fits(self, model: str, fb_peak: float | None, card: float | None, activity: float | None,
             headroom: float) -> bool:
        if self.models and not any(fnmatch.fnmatchcase(model, m) for m in self.models):
            return False
        budget = self.memory_mib if self.memory_mib is not None else (card * self.gpu_fraction if card else None)
        if fb_peak is None or budget is None or fb_peak * (1 + headroom) > budget:
            return False
        limit = self.max_activity if self.max_activity is not None else self.gpu_fraction
        return activity is not None and activity <= limit


@dataclass(frozen=True)
class UsageRules:
    """The thresholds of `gpu-webhook usage` (rule files, `spec.usage`); the defaults cite their source."""

    idle_below: float = 0.01  # idle reapers: below 1 % ...
    idle_minutes: float = 30.0  # ... for 30 minutes
    effective_above: float = 0.5  # NVIDIA DCGM guide: activity below 0.5 likely means ineffective use
    memory_headroom: float = 0.2
    sizes: tuple[Size, ...] = ()
    prometheus: str | None = None


def usage_rules(body: Mapping[str, Any], fail: Callable[[tuple[str, ...], str], Exception],
                resource_known: Callable[[str], bool], axis_labels: Mapping[str, Sequence[str]]
                ) -> UsageRules:
    """`spec.usage` (already schema-checked) as UsageRules; `fail(path, problem)` builds the error to raise.

    `axis_labels`: class label -> axis values, to check a size's `labels`."""
    base = ("spec", "usage")
    idle = body.get("idle") or {}
    sizes = []
    for name, raw in (body.get("sizes") or {}).items():
        where = (*base, "sizes", name)
        if not resource_known(raw["resource"]):
            raise fail((*where, "resource"), f'"{raw["resource"]}" is not one of spec.gpuResources; add it there '
                       "or name a GPU resource the rules know")
        for label, value in (raw.get("labels") or {}).items():
            values = axis_labels.get(label)
            if values is None:
                raise fail((*where, "labels", label), f'"{label}" is no class axis label; labels are: '
                           f"{', '.join(axis_labels) or '(none)'}")
            if value not in set(values):
                raise fail((*where, "labels", label), f'"{value}" is not a value of {label}; choose from '
                           f"{', '.join(values)}")
        sizes.append(Size(name=name, resource=raw["resource"], gpu_fraction=float(raw["gpuFraction"]),
                          memory_mib=raw.get("memoryMiB"), max_activity=raw.get("maxActivity"),
                          models=tuple(raw.get("models") or ()), labels=dict(raw.get("labels") or {})))
    defaults = UsageRules()
    return UsageRules(
        idle_below=float(idle.get("below", defaults.idle_below)),
        idle_minutes=float(idle.get("forMinutes", defaults.idle_minutes)),
        effective_above=float(body.get("effectiveAbove", defaults.effective_above)),
        memory_headroom=float(body.get("memoryHeadroom", defaults.memory_headroom)),
        sizes=tuple(sorted(sizes, key=lambda s: (s.gpu_fraction, s.name))),
        prometheus=body.get("prometheus") or None,
    )


# --------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Series:
    """One series of a range query: the metric it answers, its labels and its (unix seconds, value) points."""

    metric: str
    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Workload:
    """What a Pod belongs to: its top owner (Deployment, StatefulSet, Job, CronJob, DaemonSet) or the Pod."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodInfo:
    """A Pod as the cluster has it: its owner and the GPUs its containers request."""

    namespace: str
    name: str
    workload: Workload
    gpus: float = 0.0


@dataclass(frozen=True)
class Device:
    """A GPU, or a MIG instance of one, as dcgm-exporter labels it."""

    uuid: str
    host: str
    gpu: str
    model: str = ""
    mig_profile: str = ""
    mig_instance: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.uuid or f"{self.host}/{self.gpu}", self.mig_instance, self.mig_profile)

    @property
    def fraction(self) -> float:
        """How much of a whole GPU it is: 1, or g/7 for a MIG instance (g/4 on an A30)."""
        found = _MIG_SLICES.match(self.mig_profile) if self.mig_profile else None
        if found is None:
            return 1.0
        return min(1.0, int(found.group(1)) / (4 if "A30" in self.model else 7))

    def __str__(self) -> str:
        name = self.uuid or f"{self.host}/gpu{self.gpu}"
        return f"{name} MIG {self.mig_profile} (GI {self.mig_instance})" if self.mig_profile else name


def device_of(labels: Mapping[str, str]) -> Device | None:
    """The device a series measures, or None when it carries neither a UUID nor a host and GPU index."""
    uuid = labels.get("UUID") or labels.get("uuid") or labels.get("gpu_uuid") or ""
    host = labels.get("hostname") or labels.get("Hostname") or ""
    gpu = labels.get("gpu", "")
    if not uuid and not (host and gpu):
        return None
    return Device(uuid=uuid, host=host, gpu=gpu, model=labels.get("modelName") or labels.get("model_name") or "",
                  mig_profile=labels.get("GPU_I_PROFILE", ""), mig_instance=labels.get("GPU_I_ID", ""))


def pod_of(labels: Mapping[str, str], renamed: bool) -> tuple[str, str] | None:
    """(namespace, pod) the exporter attached, or None for a device no Pod holds.

    `renamed`: some series carry `exported_pod`, so Prometheus renamed the exporter's labels (honor_labels:
    false) and a bare `pod` names the exporter's own Pod."""
    if labels.get("exported_pod"):
        return labels.get("exported_namespace", ""), labels["exported_pod"]
    if renamed:
        return None
    if labels.get("pod"):
        return labels.get("namespace", ""), labels["pod"]
    if labels.get("pod_name"):
        return labels.get("pod_namespace", ""), labels["pod_name"]
    return None


def _has_pod_labels(labels: Mapping[str, str]) -> bool:
    return any(k in labels for k in ("pod", "exported_pod", "pod_name"))


# --------------------------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class WorkloadUsage:
    """One row of the report: a workload's GPUs, how much of them it used, and what it should hold instead."""

    workload: Workload
    pods: tuple[str, ...]
    devices: tuple[str, ...]
    model: str
    gpus: float  # the most GPUs held at once (a MIG instance or a time-sliced share counts as its fraction)
    gpu_hours: float
    idle_gpu_hours: float
    p50: float | None  # activity, 0..1 of a whole GPU (of the instance, on MIG)
    p95: float | None
    activity_metric: str
    fb_peak_mib: float | None
    card_mib: float | None
    shared_with: int  # most Pods seen on one of its devices at once (1: not shared)
    verdict: Verdict
    suggestion: str
    freeable_gpus: float
    reason: str
    timeline: tuple[tuple[float, float], ...] = field(default=(), compare=False, repr=False)  # (t, mean activity)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.workload.kind, "namespace": self.workload.namespace, "name": self.workload.name,
            "pods": list(self.pods), "devices": list(self.devices), "model": self.model,
            "gpus": round(self.gpus, 4), "gpuHours": round(self.gpu_hours, 4),
            "idleGpuHours": round(self.idle_gpu_hours, 4),
            "activity": {"metric": self.activity_metric, "p50": _r(self.p50), "p95": _r(self.p95)},
            "memory": {"peakMiB": _r(self.fb_peak_mib), "cardMiB": _r(self.card_mib)},
            "sharedWith": self.shared_with, "verdict": self.verdict, "suggestion": self.suggestion,
            "freeableGpus": round(self.freeable_gpus, 4), "reason": self.reason,
        }


@dataclass(frozen=True)
class Unjoined:
    """Series that could not be attributed to a workload, by reason, with what they held."""

    reason: str
    series: int
    gpu_hours: float
    examples: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "series": self.series, "gpuHours": round(self.gpu_hours, 4),
                "examples": list(self.examples)}


@dataclass(frozen=True)
class Report:
    start: float
    end: float
    step: float
    workloads: tuple[WorkloadUsage, ...]  # most idle GPU-hours first
    unjoined: tuple[Unjoined, ...]
    series: int
    unallocated_devices: int  # devices seen with no Pod on them

    @property
    def gpu_hours(self) -> float:
        return sum(w.gpu_hours for w in self.workloads)

    @property
    def idle_gpu_hours(self) -> float:
        return sum(w.idle_gpu_hours for w in self.workloads)

    @property
    def freeable_gpus(self) -> float:
        return sum(w.freeable_gpus for w in self.workloads)

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start, "end": self.end, "stepSeconds": self.step, "series": self.series,
            "totals": {"gpuHours": round(self.gpu_hours, 4), "idleGpuHours": round(self.idle_gpu_hours, 4),
                       "freeableGpus": round(self.freeable_gpus, 4),
                       "wholeGpusFreeable": math.floor(self.freeable_gpus + 1e-9),
                       "unallocatedDevices": self.unallocated_devices,
                       "unjoinedSeries": sum(u.series for u in self.unjoined)},
            "workloads": [w.to_json() for w in self.workloads],
            "unjoined": [u.to_json() for u in self.unjoined],
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolated linearly between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# --------------------------------------------------------------------------------------------- the analysis


@dataclass
class _DeviceTimeline:
    device: Device
    activity: dict[float, float] = field(default_factory=dict)
    activity_metric: str = ""
    fb_used: dict[float, float] = field(default_factory=dict)
    fb_free: dict[float, float] = field(default_factory=dict)
    fb_reserved: dict[float, float] = field(default_factory=dict)
    holders: dict[float, set[tuple[str, str]]] = field(default_factory=lambda: defaultdict(set))

    def card_mib(self) -> float | None:
        totals = [used + self.fb_free[t] + self.fb_reserved.get(t, 0.0)
                  for t, used in self.fb_used.items() if t in self.fb_free]
        return max(totals) if totals else None


@dataclass
class _Sample:
    t: float
    share: float
    activity: float | None
    fb_used: float | None
    holders: int


def analyse(series: Sequence[Series], pods: Mapping[tuple[str, str], PodInfo], rules: UsageRules, *,
            start: float, end: float, step: float, namespace: str | None = None) -> Report:
    """Join dcgm-exporter series to Pods and judge each workload; raise UsageError when nothing can be joined.

    `pods`: (namespace, name) -> PodInfo for every Pod the cluster has; `namespace`: only that namespace."""
    if not series:
        raise UsageError(
            f"no dcgm-exporter series ({', '.join(METRICS[:4])}) between {_iso(start)} and {_iso(end)}: "
            "Prometheus does not scrape dcgm-exporter, or not for that long. Add a scrape job for the "
            "dcgm-exporter Service (port 9400, path /metrics, honor_labels: true) and check its target is up")
    if not any(_has_pod_labels(s.labels) for s in series):
        example = ", ".join(sorted(series[0].labels)) or "(none)"
        raise UsageError(
            "dcgm-exporter series carry no pod labels (neither pod/namespace, pod_name/pod_namespace nor "
            f"exported_pod/exported_namespace; one has: {example}), so GPUs cannot be matched to Pods. Run "
            "dcgm-exporter with its Kubernetes mapping on (DCGM_EXPORTER_KUBERNETES=true, the kubelet's "
            "/var/lib/kubelet/pod-resources mounted; on by default in its Helm chart and the GPU Operator) and do "
            "not drop those labels in metric_relabel_configs")
    renamed = any(s.labels.get("exported_pod") for s in series)
    unjoined: dict[str, list[Any]] = defaultdict(lambda: [0, 0.0, []])

    def miss(reason: str, example: str, gpu_hours: float = 0.0, count: int = 1) -> None:
        entry = unjoined[reason]
        entry[0] += count
        entry[1] += gpu_hours
        if example not in entry[2] and len(entry[2]) < 5:
            entry[2].append(example)

    timelines: dict[tuple[str, str, str], _DeviceTimeline] = {}
    series_of_pod: dict[tuple[str, str], int] = defaultdict(int)
    for s in series:
        device = device_of(s.labels)
        if device is None:
            miss("no device labels (UUID, or hostname and gpu): a relabelling dropped them; keep the "
                 "exporter's labels", _describe_labels(s.labels))
            continue
        line = timelines.setdefault(device.key, _DeviceTimeline(device))
        holder = pod_of(s.labels, renamed)
        if holder is not None:
            series_of_pod[holder] += 1
        target = {GR_ENGINE_ACTIVE: line.activity, GPU_UTIL: None, FB_USED: line.fb_used, FB_FREE: line.fb_free,
                  FB_RESERVED: line.fb_reserved}.get(s.metric)
        for t, value in s.points:
            if math.isnan(value):
                continue
            if holder is not None:
                line.holders[t].add(holder)
            if s.metric == GPU_UTIL:
                continue
            if target is not None:
                target[t] = max(target.get(t, value), value)
        if s.metric == GR_ENGINE_ACTIVE:
            line.activity_metric = GR_ENGINE_ACTIVE
    for s in series:  # the GPU_UTIL fallback, for devices without GR_ENGINE_ACTIVE
        device = device_of(s.labels)
        if s.metric != GPU_UTIL or device is None:
            continue
        line = timelines[device.key]
        if line.activity_metric == GR_ENGINE_ACTIVE:
            continue
        line.activity_metric = GPU_UTIL
        for t, value in s.points:
            if not math.isnan(value):
                line.activity[t] = max(line.activity.get(t, value / 100), value / 100)

    samples: dict[tuple[str, str], dict[tuple[str, str, str], list[_Sample]]] = defaultdict(lambda: defaultdict(list))
    unallocated = 0
    for key, line in timelines.items():
        if not any(line.holders.values()):
            unallocated += 1
            continue
        for t in sorted(line.holders):
            holders = line.holders[t]
            share = line.device.fraction / len(holders)
            activity = line.activity.get(t)
            if activity is not None and len(holders) > 1:
                activity /= len(holders)
            for holder in holders:
                samples[holder][key].append(_Sample(t, share, activity, line.fb_used.get(t), len(holders)))

    by_workload: dict[Workload, list[tuple[tuple[str, str], dict[tuple[str, str, str], list[_Sample]]]]] = \
        defaultdict(list)
    for holder, per_device in samples.items():
        ns, name = holder
        if namespace is not None and ns != namespace:
            continue
        hours = sum(x.share for xs in per_device.values() for x in xs) * step / 3600
        info = pods.get(holder)
        if info is None:
            miss("the Pod is not in the cluster (deleted since, or the series come from another cluster)",
                 f"{ns}/{name}", hours, series_of_pod[holder])
        elif info.gpus <= 0:
            miss("the Pod requests no GPU: Prometheus put its own target label pod= on a series the exporter "
                 "left without one (an unallocated GPU); scrape dcgm-exporter with honor_labels: true",
                 f"{ns}/{name}", hours, series_of_pod[holder])
        else:
            by_workload[info.workload].append((holder, per_device))

    rows = [_judge(w, members, timelines, rules, step) for w, members in by_workload.items()]
    rows.sort(key=lambda r: (-r.idle_gpu_hours, -r.freeable_gpus, -r.gpu_hours, str(r.workload)))
    return Report(
        start=start, end=end, step=step, workloads=tuple(rows),
        unjoined=tuple(Unjoined(reason, n, hours, tuple(examples))
                       for reason, (n, hours, examples) in sorted(unjoined.items())),
        series=len(series), unallocated_devices=unallocated)


def _judge(workload: Workload, members: list[tuple[tuple[str, str], dict[tuple[str, str, str], list[_Sample]]]],
           timelines: Mapping[tuple[str, str, str], _DeviceTimeline], rules: UsageRules, step: float
           ) -> WorkloadUsage:
    activity: list[float] = []
    activity_at: dict[float, list[float]] = defaultdict(list)
    held_at: dict[float, float] = defaultdict(float)
    gpu_hours = idle_hours = 0.0
    fb_peak: float | None = None
    card: float | None = None
    shared_with = 1
    devices: list[Device] = []
    metrics: set[str] = set()
    for _holder, per_device in members:
        for key, xs in per_device.items():
            line = timelines[key]
            devices.append(line.device)
            metrics.add(line.activity_metric)
            card = _max(card, line.card_mib())
            for x in xs:
                held_at[x.t] += x.share
                gpu_hours += x.share * step / 3600
                shared_with = max(shared_with, x.holders)
                fb_peak = _max(fb_peak, x.fb_used)
                if x.activity is not None:
                    activity.append(x.activity)
                    activity_at[x.t].append(x.activity)
            idle_hours += _idle_hours(xs, rules, step)
    p50, p95 = percentile(activity, 50), percentile(activity, 95)
    gpus = max(held_at.values(), default=0.0)
    model = next((d.model for d in devices if d.model), "")
    partial = shared_with > 1 or any(d.mig_profile for d in devices)
    verdict: Verdict
    if p95 is not None and p95 < rules.idle_below:
        verdict, freeable = "idle", gpus
        suggestion = "release its GPUs (scale to zero, or let an idle reaper stop it)"
        reason = f"p95 activity {_pct(p95)} is below the idle threshold {_pct(rules.idle_below)}"
    elif partial:
        verdict, freeable, suggestion = "shared", 0.0, "keep (already a MIG instance or a time-sliced share)"
        reason = f"holds part of a GPU ({'MIG' if any(d.mig_profile for d in devices) else 'time-sliced'})"
    elif p95 is None:
        verdict, freeable, suggestion = "right-sized", 0.0, "keep (no activity samples)"
        reason = "no activity metric for its devices"
    elif p95 >= rules.effective_above:
        verdict, freeable, suggestion = "right-sized", 0.0, "keep"
        reason = f"p95 activity {_pct(p95)} is at or above {_pct(rules.effective_above)}"
    else:
        fit = next((s for s in rules.sizes if s.fits(model, fb_peak, card, p95, rules.memory_headroom)), None)
        if fit is None:
            verdict, freeable, suggestion = "underused", 0.0, "keep a whole GPU: no smaller size fits"
            reason = (f"p95 activity {_pct(p95)} is below {_pct(rules.effective_above)}, but a memory peak of "
                      f"{_mib(fb_peak)} (+{_pct(rules.memory_headroom)} headroom) fits no smaller size")
        else:
            verdict, freeable = "oversized", gpus * (1 - fit.gpu_fraction)
            labels = "".join(f", {k}={v}" for k, v in fit.labels.items())
            suggestion = f"{fit.name} ({fit.resource}: 1{labels})"
            reason = (f"p95 activity {_pct(p95)} and a memory peak of {_mib(fb_peak)} fit {fit.name} "
                      f"({fit.gpu_fraction:.3g} of a GPU)")
    return WorkloadUsage(
        workload=workload, pods=tuple(sorted(f"{ns}/{n}" for (ns, n), _ in members)),
        devices=tuple(sorted({str(d) for d in devices})), model=model, gpus=gpus, gpu_hours=gpu_hours,
        idle_gpu_hours=idle_hours, p50=p50, p95=p95, activity_metric="+".join(sorted(m for m in metrics if m)),
        fb_peak_mib=fb_peak, card_mib=card, shared_with=shared_with, verdict=verdict, suggestion=suggestion,
        freeable_gpus=freeable, reason=reason,
        timeline=tuple((t, sum(v) / len(v)) for t, v in sorted(activity_at.items())))


def _idle_hours(xs: Sequence[_Sample], rules: UsageRules, step: float) -> float:
    """GPU-hours in runs of consecutive samples below the idle threshold lasting at least `idle_minutes`."""
    total = 0.0
    run: list[_Sample] = []

    def close() -> float:
        return sum(x.share for x in run) * step / 3600 if len(run) * step >= rules.idle_minutes * 60 else 0.0

    for x in sorted(xs, key=lambda s: s.t):
        idle = x.activity is not None and x.activity < rules.idle_below
        if idle and run and x.t - run[-1].t > step * 1.5:
            total += close()
            run = []
        if idle:
            run.append(x)
        else:
            total += close()
            run = []
    return total + close()


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.3g} %"


def _mib(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.0f} MiB"


def _iso(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _describe_labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


# --------------------------------------------------------------------------------------------- the cluster's Pods

_TOP_OWNERS = {"ReplicaSet": "Deployment", "Job": "CronJob"}  # the owner kinds that may themselves be owned


def pods_from_objects(objects: Iterable[Mapping[str, Any]], is_gpu: Callable[[str], bool]
                      ) -> dict[tuple[str, str], PodInfo]:
    """The Pods among listed objects (JSON with `kind`), each with its top owner and the GPUs it requests.

    Owners are followed through the listed objects: Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob, Pod ->
    StatefulSet or DaemonSet. A Pod whose controller is not listed is its own workload under the controller's
    name and kind (what its ownerReference says). `is_gpu(resource name)`: whether a resource counts as a GPU."""
    by_key: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    pods = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        key = (str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))
        by_key[key] = obj
        if key[0] == "Pod":
            pods.append(obj)
    found: dict[tuple[str, str], PodInfo] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        workload = Workload("Pod", ns, name)
        current: Mapping[str, Any] = pod
        for _ in range(3):
            ref = _controller(current)
            if ref is None:
                break
            workload = Workload(str(ref.get("kind", "")), ns, str(ref.get("name", "")))
            owner = by_key.get((workload.kind, ns, workload.name))
            if owner is None or workload.kind not in _TOP_OWNERS:
                break
            current = owner
        gpus = 0.0
        for container in (pod.get("spec") or {}).get("containers") or ():
            resources = container.get("resources") or {}
            amounts = resources.get("limits") or resources.get("requests") or {}
            for resource, amount in amounts.items():
                if is_gpu(str(resource)):
                    gpus += _quantity(amount)
        found[(ns, name)] = PodInfo(ns, name, workload, gpus)
    return found


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return next((r for r in refs if r.get("controller")), next(iter(refs), None))


def _quantity(amount: Any) -> float:
    try:
        return float(amount)
    except (TypeError, ValueError):
        return 0.0
