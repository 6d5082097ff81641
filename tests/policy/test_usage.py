"""The usage analysis (webhook.policy.usage) as tables: dcgm-exporter series labelled the ways real exporters
and scrape configs label them, joined to Pods, and the numbers of the report checked against values computed
from the same samples.

Device identities come from the real H200 of ../shared/fixtures/real-h200 (nvidia-smi-q.xml: UUID, `NVIDIA
H200`, 143,771 MiB of which 616 reserved; nvml-utilization.csv: 1,625 MiB used while idle)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from webhook.policy import usage
from webhook.policy.usage import PodInfo, Series, Size, UsageError, UsageRules, Workload

H200 = "GPU-7499c50f-2307-cd9c-d9cc-937afc16d5cb"
A100 = "GPU-5f0d4a36-7b29-4a31-a9d0-000000000a10"  # an A100 of the replay, not a real reading
CARD, RESERVED, USED_IDLE = 143771.0, 616.0, 1625.0
STEP = 60.0
T0 = 1_796_000_000.0


def labels(uuid: str = H200, pod: str = "", ns: str = "ml", *, host: str = "kit-gpu-node", host_key: str = "hostname",
           style: str = "pod", gpu: str = "0", model: str = "NVIDIA H200", mig: tuple[str, str] | None = None,
           **extra: str) -> dict[str, str]:
    out = {"gpu": gpu, "UUID": uuid, "pci_bus_id": "00000000:00:06.0", "device": f"nvidia{gpu}", "modelName": model,
           host_key: host, "DCGM_FI_DRIVER_VERSION": "580.159.04"}
    if mig:
        out.update(GPU_I_PROFILE=mig[0], GPU_I_ID=mig[1])
    if style == "pod":
        out.update(pod=pod, namespace=ns if pod else "", container="cuda" if pod else "")
    elif style == "old":
        out.update(pod_name=pod, pod_namespace=ns if pod else "", container_name="cuda" if pod else "")
    elif style == "exported":
        out.update(pod="dcgm-exporter-x7k2p", namespace="gpu-operator", container="nvidia-dcgm-exporter")
        if pod:
            out.update(exported_pod=pod, exported_namespace=ns, exported_container="cuda")
    out.update(extra)
    return out


def gpu(values: Sequence[float], used: Sequence[float] | float = USED_IDLE, *, metric: str = usage.GPU_UTIL,
        card: float = CARD, reserved: float = RESERVED, t0: float = T0, **kw: object) -> list[Series]:
    """One device's series: activity (`metric`), FB used/free/reserved, one point per STEP."""
    lab = labels(**kw)  # type: ignore[arg-type]
    used_list = [float(used)] * len(values) if isinstance(used, int | float) else list(used)
    ts = [t0 + i * STEP for i in range(len(values))]
    return [Series(metric, lab, tuple(zip(ts, map(float, values), strict=True))),
            Series(usage.FB_USED, lab, tuple(zip(ts, used_list, strict=True))),
            Series(usage.FB_FREE, lab, tuple((t, card - reserved - u) for t, u in zip(ts, used_list, strict=True))),
            Series(usage.FB_RESERVED, lab, tuple((t, reserved) for t in ts))]


def pods(*names: str, ns: str = "ml", owner: str | None = None, gpus: float = 1) -> dict[tuple[str, str], PodInfo]:
    return {(ns, n): PodInfo(ns, n, Workload("Deployment", ns, owner) if owner else Workload("Pod", ns, n), gpus)
            for n in names}


TIME_SLICED = Size("time-sliced", "nvidia.com/gpu.shared", 0.25)
MIG_1G = Size("mig-1g.5gb", "nvidia.com/mig-1g.5gb", 1 / 7, memory_mib=4864, models=("*A100*",))
RULES = UsageRules(idle_below=0.01, idle_minutes=30, effective_above=0.5, memory_headroom=0.2,
                   sizes=(MIG_1G, TIME_SLICED))


def run(series: Sequence[Series], known: dict[tuple[str, str], PodInfo], rules: UsageRules = RULES,
        namespace: str | None = None) -> usage.Report:
    n = max(len(s.points) for s in series)
    return usage.analyse(series, known, rules, start=T0, end=T0 + n * STEP, step=STEP, namespace=namespace)


def row(report: usage.Report, name: str) -> usage.WorkloadUsage:
    return next(w for w in report.workloads if w.workload.name == name)


# --------------------------------------------------------------------------------------------- joins

HOUR = 60  # samples in an hour at STEP


@pytest.mark.parametrize("style, host_key", [
    pytest.param("pod", "hostname", id="dcgm-exporter-4.5+-pod-labels"),
    pytest.param("pod", "Hostname", id="older-exporter-Hostname"),
    pytest.param("old", "Hostname", id="use-old-namespace-pod_name"),
    pytest.param("exported", "hostname", id="honor_labels-false-exported_pod"),
])
def test_every_label_scheme_joins_to_the_same_row(style: str, host_key: str) -> None:
    report = run(gpu([99.0] * HOUR, pod="trainer", style=style, host_key=host_key), pods("trainer"))
    w = row(report, "trainer")
    assert (w.gpus, w.gpu_hours, w.p95, w.verdict) == (1.0, pytest.approx(1.0), pytest.approx(0.99), "right-sized")
    assert w.card_mib == CARD and w.fb_peak_mib == USED_IDLE
    assert report.unjoined == ()


def test_exported_scheme_a_series_without_exported_pod_is_an_unallocated_gpu_not_the_exporter() -> None:
    series = gpu([50.0] * HOUR, pod="trainer", style="exported") + gpu([0.0] * HOUR, uuid=A100, style="exported")
    report = run(series, pods("trainer") | pods("dcgm-exporter-x7k2p", ns="gpu-operator", gpus=0))
    assert [w.workload.name for w in report.workloads] == ["trainer"]
    assert report.unallocated_devices == 1 and report.unjoined == ()


def test_a_pod_label_on_a_pod_without_gpus_is_counted_with_the_honor_labels_fix() -> None:
    report = run(gpu([0.0] * HOUR, pod="dcgm-exporter-x7k2p", ns="gpu-operator"),
                 pods("dcgm-exporter-x7k2p", ns="gpu-operator", gpus=0))
    assert report.workloads == ()
    [miss] = report.unjoined
    assert (miss.series, miss.gpu_hours) == (4, pytest.approx(1.0)) and "honor_labels: true" in miss.reason


def test_a_series_whose_pod_is_gone_is_counted_with_its_gpu_hours() -> None:
    series = gpu([10.0] * 30, pod="gone-7f9c") + gpu([99.0] * 30, uuid=A100, pod="trainer", model="A100")
    report = run(series, pods("trainer"))
    [miss] = report.unjoined
    assert (miss.series, miss.gpu_hours, miss.examples) == (4, pytest.approx(0.5), ("ml/gone-7f9c",))
    assert "not in the cluster" in miss.reason


def test_a_series_without_device_labels_is_counted() -> None:
    bare = Series(usage.GPU_UTIL, {"pod": "trainer", "namespace": "ml"}, ((T0, 5.0),))
    report = run([*gpu([99.0] * 2, pod="trainer"), bare], pods("trainer"))
    [miss] = report.unjoined
    assert miss.series == 1 and "no device labels" in miss.reason


def test_time_sliced_pods_share_one_gpu() -> None:
    """Four Pods on GPU-<uuid>::0..3 (podresources-timesliced.json): dcgm-exporter exports one series per Pod,
    each carrying the whole GPU's value. Together they hold one GPU and its activity, not four."""
    series = [s for i in range(4) for s in gpu([80.0] * HOUR, pod=f"ts-{i + 1}", vgpu=str(i))]
    report = run(series, pods("ts-1", "ts-2", "ts-3", "ts-4", owner="ts"))
    w = row(report, "ts")
    assert w.gpus == pytest.approx(1.0) and w.gpu_hours == pytest.approx(1.0)
    assert w.shared_with == 4 and w.p95 == pytest.approx(0.2) and w.verdict == "shared"
    alone = run(series[:4] + series[4:8], pods("ts-1", "ts-2"))  # two Pods: one half each
    assert [x.gpu_hours for x in alone.workloads] == [pytest.approx(0.5)] * 2


def test_mig_instances_are_separate_devices_of_their_slice_fraction() -> None:
    series = (gpu([0.0] * HOUR, uuid=A100, model="NVIDIA A100-SXM4-40GB", pod="tiny", mig=("1g.5gb", "13"),
                  used=10.0, card=4864, reserved=0)
              + gpu([90.0] * HOUR, uuid=A100, model="NVIDIA A100-SXM4-40GB", pod="mid", mig=("3g.20gb", "2"),
                    used=15000.0, card=20096, reserved=0))
    report = run(series, pods("tiny", "mid"))
    tiny, mid = row(report, "tiny"), row(report, "mid")
    assert tiny.gpu_hours == pytest.approx(1 / 7) and mid.gpu_hours == pytest.approx(3 / 7)
    assert (tiny.card_mib, mid.card_mib) == (4864, 20096)
    assert tiny.verdict == "idle" and tiny.idle_gpu_hours == pytest.approx(1 / 7)
    assert mid.verdict == "shared" and mid.devices == (f"{A100} MIG 3g.20gb (GI 2)",)


def test_gr_engine_active_is_preferred_over_gpu_util() -> None:
    series = gpu([0.3] * 10, metric=usage.GR_ENGINE_ACTIVE, pod="p") + gpu([95.0] * 10, pod="p")[:1]
    w = row(run(series, pods("p")), "p")
    assert (w.activity_metric, w.p95) == (usage.GR_ENGINE_ACTIVE, pytest.approx(0.3))


def test_namespace_scope() -> None:
    series = gpu([99.0] * 10, pod="a", ns="ml") + gpu([99.0] * 10, uuid=A100, pod="b", ns="web")
    report = run(series, pods("a", ns="ml") | pods("b", ns="web"), namespace="web")
    assert [w.workload.name for w in report.workloads] == ["b"]


def test_pods_of_one_owner_are_one_row() -> None:
    series = gpu([40.0] * HOUR, pod="web-1") + gpu([20.0] * HOUR, uuid=A100, pod="web-2", model="NVIDIA H200")
    w = row(run(series, pods("web-1", "web-2", owner="web")), "web")
    assert (w.pods, w.gpus, w.gpu_hours) == (("ml/web-1", "ml/web-2"), 2.0, pytest.approx(2.0))
    assert w.p50 == pytest.approx(0.3)


# --------------------------------------------------------------------------------------------- numbers

NVML_LIGHT = [0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]  # nvml-utilization.csv, phase "light"
NVML_BUSY = [99] * 8 + [100] * 7  # phase "busy"


@pytest.mark.parametrize("values, p50, p95", [
    pytest.param(NVML_LIGHT, 0.0, 0.01, id="real-light-loop"),
    pytest.param(NVML_BUSY, 0.99, 1.0, id="real-saturated"),
    pytest.param(list(range(101)), 0.5, 0.95, id="ramp"),
    pytest.param([10, 20], 0.15, 0.195, id="interpolated"),
])
def test_percentiles(values: list[float], p50: float, p95: float) -> None:
    w = row(run(gpu(values, pod="p"), pods("p")), "p")
    assert (w.p50, w.p95) == (pytest.approx(p50), pytest.approx(p95))


@pytest.mark.parametrize("minutes_idle, expected_idle_hours", [
    pytest.param(29, 0.0, id="29-min-below-threshold-not-idle"),
    pytest.param(30, 0.5, id="30-min-idle"),
    pytest.param(90, 1.5, id="90-min-idle"),
])
def test_idle_hours_need_the_run_length(minutes_idle: int, expected_idle_hours: float) -> None:
    values = [50.0] * 30 + [0.0] * minutes_idle + [50.0] * 30
    w = row(run(gpu(values, pod="p"), pods("p")), "p")
    assert w.idle_gpu_hours == pytest.approx(expected_idle_hours)
    assert w.gpu_hours == pytest.approx(len(values) / 60)


def test_a_gap_in_samples_breaks_an_idle_run() -> None:
    first = gpu([0.0] * 20, pod="p")
    second = gpu([0.0] * 20, pod="p", t0=T0 + 40 * STEP)
    assert row(run(first + second, pods("p")), "p").idle_gpu_hours == 0.0


@pytest.mark.parametrize("values, used, model, verdict, suggestion, freeable", [
    pytest.param([0.0] * HOUR, USED_IDLE, "NVIDIA H200", "idle", "release", 1.0, id="idle-whole-gpu"),
    pytest.param([99.0] * HOUR, USED_IDLE, "NVIDIA H200", "right-sized", "keep", 0.0, id="busy"),
    pytest.param([10.0] * HOUR, 20000.0, "NVIDIA H200", "oversized", "time-sliced", 0.75, id="h200-to-time-slice"),
    pytest.param([10.0] * HOUR, 3000.0, "NVIDIA A100-SXM4-40GB", "oversized", "mig-1g.5gb", 6 / 7,
                 id="a100-to-mig-1g"),
    pytest.param([10.0] * HOUR, 4500.0, "NVIDIA A100-SXM4-40GB", "oversized", "time-sliced", 0.75,
                 id="a100-memory-over-mig-headroom"),
    pytest.param([10.0] * HOUR, 100000.0, "NVIDIA H200", "underused", "keep a whole GPU", 0.0,
                 id="memory-too-big-for-a-share"),
    pytest.param([40.0] * HOUR, 2000.0, "NVIDIA H200", "underused", "keep a whole GPU", 0.0,
                 id="too-active-for-a-quarter"),
])
def test_verdicts(values: list[float], used: float, model: str, verdict: str, suggestion: str,
                  freeable: float) -> None:
    card = 40960.0 if "A100" in model else CARD
    w = row(run(gpu(values, used, model=model, card=card, pod="p"), pods("p")), "p")
    assert w.verdict == verdict and w.suggestion.startswith(suggestion)
    assert w.freeable_gpus == pytest.approx(freeable)


def test_totals_and_ranking() -> None:
    series = (gpu([0.0] * HOUR, pod="idle") + gpu([99.0] * HOUR, uuid=A100, pod="busy")
              + gpu([10.0] * HOUR, 20000.0, uuid="GPU-3", pod="small"))
    report = run(series, pods("idle", "busy", "small"))
    assert [w.workload.name for w in report.workloads] == ["idle", "small", "busy"]
    assert report.gpu_hours == pytest.approx(3.0) and report.idle_gpu_hours == pytest.approx(1.0)
    assert report.freeable_gpus == pytest.approx(1.75)
    totals = report.to_json()["totals"]
    assert totals["wholeGpusFreeable"] == 1 and totals["unjoinedSeries"] == 0


# --------------------------------------------------------------------------------------------- bad input


def test_no_series_names_the_scrape_job_to_add() -> None:
    with pytest.raises(UsageError, match=r"no dcgm-exporter series.*scrape job"):
        usage.analyse([], {}, RULES, start=T0, end=T0 + 60, step=STEP)


def test_series_without_any_pod_labels_names_the_kubernetes_mapping() -> None:
    lab = labels()
    for key in ("pod", "namespace", "container"):
        lab.pop(key)
    with pytest.raises(UsageError, match=r"no pod labels.*DCGM_EXPORTER_KUBERNETES=true"):
        usage.analyse([Series(usage.GPU_UTIL, lab, ((T0, 1.0),))], {}, RULES, start=T0, end=T0 + 60, step=STEP)


def test_nan_points_are_skipped() -> None:
    series = gpu([float("nan"), 50.0], pod="p")
    w = row(run(series, pods("p")), "p")
    assert w.p50 == pytest.approx(0.5)


# --------------------------------------------------------------------------------------------- the rule files

RULE_DOC = """apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata: {{name: usage}}
spec:
  usage:
{body}"""


def usage_doc(body: str) -> list[tuple[str, str]]:
    from webhook.admission.loader import packaged_rules_dir, read_sources

    return [*read_sources(packaged_rules_dir()), ("zz-usage.yaml", RULE_DOC.format(body=body))]


def test_packaged_rules_carry_the_cited_defaults() -> None:
    from webhook.admission.loader import load_policy

    rules = load_policy().usage
    assert (rules.idle_below, rules.idle_minutes, rules.effective_above) == (0.01, 30.0, 0.5)
    assert [s.name for s in rules.sizes] == ["mig-1g.5gb", "time-sliced", "mig-2g.10gb"]  # smallest first


@pytest.mark.parametrize("body, parts", [
    pytest.param("    effectiveAbove: 5\n", ["spec.usage.effectiveAbove", "5 is greater than the maximum of 1"],
                 id="ratio-above-1"),
    pytest.param("    idle: {below: 0.01, for: 30}\n", ['unknown field "for"', "forMinutes"], id="unknown-field"),
    pytest.param("    sizes: {half: {resource: nvidia.com/gpu.shared}}\n",
                 ["'gpuFraction' is a required property; add it"], id="size-without-fraction"),
    pytest.param("    sizes: {x: {resource: example.com/tpu, gpuFraction: 0.5}}\n",
                 ["line 6", "spec.usage.sizes.x.resource", '"example.com/tpu" is not one of spec.gpuResources'],
                 id="size-resource-not-a-gpu"),
    pytest.param("    sizes: {x: {resource: nvidia.com/gpu.shared, gpuFraction: 0.5, "
                 "labels: {gpu-webhook.io/gpu-type: h100}}}\n",
                 ['"h100" is not a value of gpu-webhook.io/gpu-type; choose from a100, t4'], id="size-label-value"),
    pytest.param("    sizes: {x: {resource: nvidia.com/gpu.shared, gpuFraction: 0.5, labels: {team: a}}}\n",
                 ['"team" is no class axis label'], id="size-label-not-an-axis"),
    pytest.param("    sizes: {time-sliced: {resource: nvidia.com/gpu.shared, gpuFraction: 0.5}}\n",
                 ["spec.usage.sizes.time-sliced.gpuFraction is 0.5 here but 0.25"], id="size-redefined-differently"),
    pytest.param("    prometheus: prometheus:9090\n", ["spec.usage.prometheus", "is not a valid name here"],
                 id="url-without-scheme"),
])
def test_usage_rule_errors(body: str, parts: list[str]) -> None:
    from webhook.policy.rules import RuleError, parse_sources

    with pytest.raises(RuleError) as err:
        parse_sources(usage_doc(body))
    for part in parts:
        assert part in str(err.value), f"{part!r} not in {err.value}"


# --------------------------------------------------------------------------------------------- owners


def obj(kind: str, name: str, owner: tuple[str, str] | None = None, gpus: dict[str, object] | None = None
        ) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "ml"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    body: dict[str, object] = {"kind": kind, "metadata": meta}
    if kind == "Pod":
        body["spec"] = {"containers": [{"name": "cuda", "resources": {"limits": gpus or {}}}]}
    return body


@pytest.mark.parametrize("objects, expected_workload, expected_gpus", [
    pytest.param([obj("Pod", "p", gpus={"nvidia.com/gpu": "1"})], ("Pod", "p"), 1.0, id="bare-pod"),
    pytest.param([obj("Deployment", "web"), obj("ReplicaSet", "web-5d8", ("Deployment", "web")),
                  obj("Pod", "p", ("ReplicaSet", "web-5d8"), {"nvidia.com/gpu": 2})], ("Deployment", "web"), 2.0,
                 id="deployment-through-replicaset"),
    pytest.param([obj("Pod", "p", ("ReplicaSet", "web-5d8"), {"nvidia.com/gpu": 1})], ("ReplicaSet", "web-5d8"), 1.0,
                 id="replicaset-not-listed"),
    pytest.param([obj("CronJob", "nightly"), obj("Job", "nightly-29", ("CronJob", "nightly")),
                  obj("Pod", "p", ("Job", "nightly-29"), {"nvidia.com/mig-1g.5gb": 1})], ("CronJob", "nightly"), 1.0,
                 id="cronjob-through-job"),
    pytest.param([obj("Pod", "p", ("StatefulSet", "db"), {"cpu": "2"})], ("StatefulSet", "db"), 0.0,
                 id="statefulset-no-gpu"),
])
def test_pods_and_owners(objects: list[dict[str, object]], expected_workload: tuple[str, str],
                         expected_gpus: float) -> None:
    found = usage.pods_from_objects(objects, lambda r: r.startswith("nvidia.com/"))
    info = found[("ml", "p")]
    assert (info.workload.kind, info.workload.name, info.gpus) == (*expected_workload, expected_gpus)
