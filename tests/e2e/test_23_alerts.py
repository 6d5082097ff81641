"""The chart's alerts (templates/prometheusrule.yaml) proven against a real rule evaluator: vmalert's replay mode.

The rules are the `spec.groups` of the PrometheusRule that helm renders from the chart (monitoring.prometheusRule
on, release gpu-webhook in gpu-system), not a copy. Each scenario is a timeline of the series a Prometheus scraping
two replicas through the chart's ServiceMonitor would hold (labels job, namespace, pod, instance, service,
container, and `endpoint` as honorLabels keeps it), backfilled with timestamps into VictoriaMetrics single-node
(tests/e2e/build_metrics.sh builds both from Go modules). Its event is at minute 0; the data starts two hours and
ten minutes before (the denial-spike alert compares with the hour before the last one) and vmalert -replay
evaluates the rules from minute -10 to +50 in 30 s steps, writing the alert states (ALERTS) back through remote
write. Every scenario names the alerts (with severity) that must fire in its window, and every other alert must
stay quiet there: each alert has a scenario that fires it and near misses that must not.

The dashboard's queries (charts/gpu-webhook/files/dashboards/gpu-webhook.json, its Grafana variables filled in)
are evaluated by the same VictoriaMetrics over a healthy install's series and dcgm-exporter's for two GPUs held by
Pods, one idle: every panel has data, and the idle-GPU figures name the idle one. VictoriaMetrics' MetricsQL
accepts PromQL and more, so this shows the queries are right on these series, not that Prometheus parses them.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from procs import free_port
from usage_replay import VictoriaMetrics, build_victoria_metrics

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
BUILD_HELM = REPO / "tests" / "e2e" / "build_helm.sh"
STEP = 30  # seconds: the scrape interval and the rule group's interval
BEFORE, AFTER = 130, 50  # minutes of data before and after each scenario's event
REPLAY_FROM = -10  # minutes: where vmalert starts evaluating
SPACING = 6 * 3600  # seconds between scenarios' events, so no window sees another scenario's data
SERVICE, NAMESPACE = "gpu-webhook", "gpu-system"
OLD_DIGEST, NEW_DIGEST = "8c2f5b1d0e7a", "41d9e6c3a0b8"
OLD_PODS, NEW_PODS = ("gpu-webhook-6b8f9c7d5-2xkqp", "gpu-webhook-6b8f9c7d5-r7m4z"), (
    "gpu-webhook-7f4c8d6b9-h2vwn", "gpu-webhook-7f4c8d6b9-p9tjs")
REVIEWS_PER_STEP = 50  # /validate reviews each replica answers per 30 s

Minutes = float
ByPod = Callable[[int, Minutes], float]


def always(value: float) -> ByPod:
    return lambda pod, m: value


def from_event(before: float, after: float, until: Minutes = AFTER + 1, pods: tuple[int, ...] = (0, 1)) -> ByPod:
    """`after` for the replicas in `pods` from minute 0 until minute `until`, else `before`."""
    return lambda pod, m: after if pod in pods and 0 <= m < until else before


NEVER, SYNCED, UP, USUAL_DENIALS = always(0), always(1), always(1), always(0.02)


@dataclass(frozen=True)
class Scenario:
    """One timeline of two replicas; the defaults are a healthy install that has run unchanged for hours."""

    fires: frozenset[tuple[str, str]]  # (alertname, severity) that must fire in the window; nothing else may
    up: Callable[[int, Minutes], float | None] = UP  # None: no target at all
    deny_share: ByPod = USUAL_DENIALS
    rules_changed: bool = False  # at minute 0, in place (a reload: the old digest goes to 0)
    rolled: bool = False  # at minute 0, by new Pods with the new digest (rollOnRulesChange)
    reloads: ByPod = NEVER
    reload_failures: ByPod = NEVER
    tls_failures: ByPod = NEVER
    synced: ByPod = SYNCED
    cert_days_left: float = 60  # at the event; the chart's certificates renew 30 days before expiry
    pods: tuple[str, str] = field(default=OLD_PODS)


DOWN = ("GPUWebhookDown", "critical")
SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario(frozenset()),
    "all-replicas-down": Scenario(frozenset({DOWN}), up=lambda pod, m: 0 if 0 <= m < 10 else 1),
    "no-target-left": Scenario(frozenset({DOWN}), up=lambda pod, m: None if m >= 0 else 1),
    "one-replica-down": Scenario(frozenset(), up=lambda pod, m: 0 if pod == 0 and m >= 0 else 1),
    "down-for-a-minute": Scenario(frozenset(), up=lambda pod, m: 0 if 0 <= m < 1 else 1),
    "rule-reload-refused": Scenario(frozenset({("GPUWebhookRuleReloadFailing", "warning")}),
                                    reload_failures=from_event(0, 1, pods=(0,))),
    "rule-reload-loaded": Scenario(frozenset(), reloads=from_event(0, 1), rules_changed=True),
    "certificate-reload-refused": Scenario(frozenset({("GPUWebhookCertificateReloadFailing", "warning")}),
                                           tls_failures=from_event(0, 1, pods=(1,))),
    "certificate-10-days-left": Scenario(frozenset({("GPUWebhookCertificateExpiringSoon", "warning")}),
                                         cert_days_left=10),
    "certificate-2-days-left": Scenario(frozenset({("GPUWebhookCertificateExpiringSoon", "warning"),
                                                   ("GPUWebhookCertificateExpiringSoon", "critical")}),
                                        cert_days_left=2),
    "certificate-20-days-left": Scenario(frozenset(), cert_days_left=20),
    "inventory-not-synced": Scenario(frozenset({("GPUWebhookInventoryNotSynced", "warning")}),
                                     synced=from_event(1, 0, until=20, pods=(1,))),
    "inventory-blip": Scenario(frozenset(), synced=from_event(1, 0, until=5, pods=(1,))),
    "denials-spike-after-reload": Scenario(frozenset({("GPUWebhookDenialsSpikeAfterRuleChange", "critical")}),
                                           deny_share=from_event(0.02, 0.4), reloads=from_event(0, 1),
                                           rules_changed=True),
    "denials-spike-after-rollout": Scenario(frozenset({("GPUWebhookDenialsSpikeAfterRuleChange", "critical")}),
                                            deny_share=from_event(0.02, 0.4), rolled=True),
    "denials-spike-without-rule-change": Scenario(frozenset(), deny_share=from_event(0.02, 0.4)),
    "rule-change-small-rise": Scenario(frozenset(), deny_share=from_event(0.02, 0.06), rolled=True),
}


# --------------------------------------------------------------------------------------------------- series


def exposition(scenario: Scenario, event: int) -> str:
    """The scenario's samples as Prometheus exposition lines with millisecond timestamps."""
    lines: list[str] = []
    counts: dict[tuple[str, str], int] = {}
    not_after = event + scenario.cert_days_left * 86400
    for t in range(event - BEFORE * 60, event + AFTER * 60 + 1, STEP):
        m = (t - event) / 60
        rolled = scenario.rolled and m >= 0
        names = NEW_PODS if rolled else scenario.pods
        for pod, name in enumerate(names):
            target = (f'job="{SERVICE}", namespace="{NAMESPACE}", service="{SERVICE}", pod="{name}", '
                      f'container="webhook", instance="10.42.0.{pod + 10}:9090"')
            meta = f'{target}, endpoint="metrics"'
            up = scenario.up(pod, m)
            if up is None:
                continue
            lines.append(f"up{{{meta}}} {up:g} {t * 1000}")
            if up == 0:
                continue  # a failed scrape: no series of the webhook's own
            ms = t * 1000
            denied = round(REVIEWS_PER_STEP * scenario.deny_share(pod, m))
            for decision, n in (("allow", REVIEWS_PER_STEP - denied), ("deny", denied)):
                key = (name, decision)
                counts[key] = counts.get(key, 0) + n
                lines.append(f'gpu_webhook_reviews_total{{{target}, endpoint="validate", kind="Pod", '
                             f'decision="{decision}"}} {counts[key]} {ms}')
            lines += [
                f"gpu_webhook_rules_reloads_total{{{meta}}} {scenario.reloads(pod, m):g} {ms}",
                f"gpu_webhook_rules_reload_failures_total{{{meta}}} {scenario.reload_failures(pod, m):g} {ms}",
                f"gpu_webhook_tls_reload_failures_total{{{meta}}} {scenario.tls_failures(pod, m):g} {ms}",
                f"gpu_webhook_inventory_synced{{{meta}}} {scenario.synced(pod, m):g} {ms}",
                f"gpu_webhook_tls_cert_not_after_timestamp_seconds{{{meta}}} {not_after:.0f} {ms}",
            ]
            changed = (scenario.rules_changed or scenario.rolled) and m >= 0
            if changed and not rolled:
                lines.append(f'gpu_webhook_rules_active{{{meta}, digest="{OLD_DIGEST}"}} 0 {ms}')
            digest = NEW_DIGEST if changed else OLD_DIGEST
            lines.append(f'gpu_webhook_rules_active{{{meta}, digest="{digest}"}} 1 {ms}')
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- the evaluator


def helm_binary() -> Path:
    done = subprocess.run(["nice", "-n", "10", "bash", str(BUILD_HELM)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tests/e2e/build_helm.sh failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) / "helm"


def rendered_groups(*values: str) -> list[dict[str, object]]:
    """The `spec.groups` of the PrometheusRule the chart renders with monitoring.prometheusRule.enabled."""
    done = subprocess.run(
        [str(helm_binary()), "template", SERVICE, str(REPO / "charts" / "gpu-webhook"), "--namespace", NAMESPACE,
         "--set", "monitoring.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml",
         *(arg for value in values for arg in ("--set", value))],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    rule = yaml.safe_load(done.stdout)
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups: list[dict[str, object]] = rule["spec"]["groups"]
    return groups


def _rfc3339(t: int) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def replay(vmalert: Path, rules: Path, victoria: VictoriaMetrics, start: int, end: int, log: Path) -> None:
    """vmalert -replay over [start, end]; raises with its log when it fails or a rule could not be evaluated."""
    done = subprocess.run(
        [str(vmalert), f"-rule={rules}", f"-datasource.url={victoria.url}", f"-remoteWrite.url={victoria.url}",
         f"-replay.timeFrom={_rfc3339(start)}", f"-replay.timeTo={_rfc3339(end)}", "-replay.disableProgressBar",
         "-replay.rulesDelay=0", "-replay.ruleRetryAttempts=1", "-remoteWrite.flushInterval=100ms",
         f"-httpListenAddr=127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=300, check=False)
    log.write_text(done.stdout + done.stderr)
    output = done.stdout + done.stderr
    problems = [line for line in output.splitlines() if "\terror\t" in line or "\tfatal\t" in line]
    assert done.returncode == 0 and "replay succeed" in output and not problems, \
        f"vmalert -replay failed ({done.returncode}); log {log}:\n{output[-4000:]}"


def firing(victoria: VictoriaMetrics, start: int, end: int) -> set[tuple[str, str]]:
    """(alertname, severity) of every ALERTS{alertstate="firing"} sample vmalert wrote between start and end."""
    with urllib.request.urlopen(f"{victoria.url}/internal/force_flush", timeout=30):
        pass
    query = urllib.parse.urlencode({"match[]": 'ALERTS{alertstate="firing"}', "start": start, "end": end})
    with urllib.request.urlopen(f"{victoria.url}/api/v1/export?{query}", timeout=30) as answer:
        rows = [json.loads(line) for line in answer.read().decode().splitlines() if line.strip()]
    return {(row["metric"]["alertname"], row["metric"]["severity"]) for row in rows}


@dataclass
class Evaluator:
    vmalert: Path
    victoria: VictoriaMetrics
    workdir: Path

    def fired(self, groups: list[dict[str, object]], scenarios: dict[str, Scenario], base: int
              ) -> dict[str, set[tuple[str, str]]]:
        """Backfill every scenario (the n-th's event at base + n * SPACING), replay each window, read ALERTS."""
        rules = self.workdir / f"rules-{base}.yaml"
        rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        events = {name: base + i * SPACING for i, name in enumerate(scenarios)}
        self.victoria.backfill("".join(exposition(scenarios[name], event) for name, event in events.items()))
        time.sleep(1)  # the imported rows become searchable
        out = {}
        for name, event in events.items():
            start, end = event + REPLAY_FROM * 60, event + AFTER * 60
            replay(self.vmalert, rules, self.victoria, start, end, self.workdir / f"vmalert-{name}.log")
            out[name] = firing(self.victoria, start, end)
        return out


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evaluator]:
    binary = build_victoria_metrics()
    vmalert = binary.parent / "vmalert"
    assert vmalert.is_file(), f"tests/e2e/build_metrics.sh left no vmalert in {binary.parent}"
    workdir = tmp_path_factory.mktemp("alerts")
    server = VictoriaMetrics(binary, workdir, free_port())
    try:
        yield Evaluator(vmalert, server, workdir)
    finally:
        server.stop()


def _base(days_ago: int) -> int:
    """An event time on a step boundary, `days_ago` days back (all of a run's windows lie in the past)."""
    return (int(time.time()) // 3600 - days_ago * 24) * 3600


# ------------------------------------------------------------------------------------------------------ tests


def test_each_alert_fires_on_its_series_and_stays_quiet_otherwise(evaluator: Evaluator) -> None:
    groups = rendered_groups()
    names = {rule["alert"] for group in groups for rule in group["rules"]}  # type: ignore[attr-defined]
    proven = {alert for scenario in SCENARIOS.values() for alert, _ in scenario.fires}
    assert proven == names, f"alerts without a scenario that fires them: {sorted(names - proven)}"
    fired = evaluator.fired(groups, SCENARIOS, _base(days_ago=8))
    wrong = {name: (sorted(got), sorted(SCENARIOS[name].fires))
             for name, got in fired.items() if got != SCENARIOS[name].fires}
    assert not wrong, "scenario: (fired, expected)\n" + "\n".join(f"{k}: {v}" for k, v in wrong.items())


def test_webhook_down_is_a_warning_when_the_validating_webhook_fails_open(evaluator: Evaluator) -> None:
    groups = rendered_groups("webhook.validating.failurePolicy=Ignore")
    down = [rule for group in groups for rule in group["rules"]  # type: ignore[attr-defined]
            if rule["alert"] == "GPUWebhookDown"]
    assert len(down) == 1 and "failurePolicy is Ignore" in down[0]["annotations"]["description"]
    scenarios = {name: SCENARIOS[name] for name in ("all-replicas-down", "healthy")}
    fired = evaluator.fired(groups, scenarios, _base(days_ago=2))
    assert fired == {"all-replicas-down": {("GPUWebhookDown", "warning")}, "healthy": set()}


# ------------------------------------------------------------------------------------------------ dashboard

DASHBOARD = REPO / "charts" / "gpu-webhook" / "files" / "dashboards" / "gpu-webhook.json"
GRAFANA_VARIABLES = {"$job": SERVICE, "$namespace": NAMESPACE, "$__rate_interval": "2m"}
IDLE_POD, BUSY_POD = "notebook-0", "trainer-0"


def dashboard_extras(event: int) -> str:
    """Series the alerts do not read, for the dashboard's other panels: latency buckets, findings, 4xx answers,
    and dcgm-exporter's utilisation and memory of two GPUs held by Pods (one idle, one busy)."""
    lines = []
    for step, t in enumerate(range(event - BEFORE * 60, event + AFTER * 60 + 1, STEP)):
        ms, n = t * 1000, step + 1
        for pod, name in enumerate(OLD_PODS):
            target = (f'job="{SERVICE}", namespace="{NAMESPACE}", service="{SERVICE}", pod="{name}", '
                      f'container="webhook", instance="10.42.0.{pod + 10}:9090"')
            for le, share in (("0.001", 0.5), ("0.005", 0.9), ("0.01", 0.99), ("+Inf", 1.0)):
                lines.append(f'gpu_webhook_review_duration_seconds_bucket{{{target}, endpoint="validate", '
                             f'le="{le}"}} {round(REVIEWS_PER_STEP * n * share)} {ms}')
            lines.append(f'gpu_webhook_rule_findings_total{{{target}, endpoint="validate", '
                         f'rule="gpu-limits-required", effect="deny"}} {n} {ms}')
            lines.append(f'gpu_webhook_bad_requests_total{{{target}, endpoint="mutate", code="400"}} {n // 10} {ms}')
        for gpu, (pod_name, util, used) in enumerate(((IDLE_POD, 0, 1625), (BUSY_POD, 80, 61000))):
            labels = (f'gpu="{gpu}", UUID="GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd", modelName="NVIDIA H200", '
                      f'Hostname="gpu-node-1", namespace="ml-research", pod="{pod_name}", container="cuda"')
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util} {ms}")
            lines.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {used} {ms}")
    return "\n".join(lines) + "\n"


def instant(victoria: VictoriaMetrics, expr: str, at: int) -> list[dict[str, object]]:
    query = urllib.parse.urlencode({"query": expr, "time": at})
    with urllib.request.urlopen(f"{victoria.url}/api/v1/query?{query}", timeout=30) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, object]] = body["data"]["result"]
    return result


def test_dashboard_queries_evaluate_and_show_the_idle_gpu(evaluator: Evaluator) -> None:
    """Every panel's query, its Grafana variables filled in, evaluates to data over a healthy install's series."""
    event = _base(days_ago=12)
    evaluator.victoria.backfill(exposition(SCENARIOS["healthy"], event) + dashboard_extras(event))
    time.sleep(1)
    at = event + 30 * 60
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"}
    results: dict[str, list[list[dict[str, object]]]] = {}
    for title, panel in panels.items():
        exprs = [target["expr"] for target in panel["targets"]]
        for variable, value in GRAFANA_VARIABLES.items():
            exprs = [expr.replace(variable, value) for expr in exprs]
        results[title] = [instant(evaluator.victoria, expr, at) for expr in exprs]
    empty = [title for title, answers in results.items() if not all(answers)]
    assert not empty, f"panels with no data over a healthy install with dcgm-exporter: {empty}"

    def value(title: str) -> float:
        (only,) = results[title][0]
        return float(only["value"][1])  # type: ignore[index]

    assert value("Allocated GPUs idle for the last hour") == 1
    assert value("Allocated GPUs") == 2
    assert [row["metric"]["pod"] for row in results["Idle GPUs by Pod (p95 utilisation over 1 h below 1 %)"][0]] \
        == [IDLE_POD]  # type: ignore[index]
    assert value("Denied share of /validate reviews") == pytest.approx(0.02)
    assert value("Serving certificate expires in") == pytest.approx(60 * 86400 - 30 * 60, abs=60)
    by_decision = {row["metric"]["decision"]: float(row["value"][1])  # type: ignore[index]
                   for row in results["Reviews per second by decision"][0]}
    assert by_decision == pytest.approx({"allow": 2 * 49 / STEP, "deny": 2 * 1 / STEP})
