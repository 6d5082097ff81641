"""The webhook's Grafana dashboard and Prometheus alerts, as data; charts/sync_chart.py writes them out.

Outputs (never edit them by hand; edit this file and run `python charts/sync_chart.py`):

- charts/gpu-webhook/files/dashboards/gpu-webhook.json and manifests/components/grafana-dashboard/gpu-webhook.json:
  the dashboard. It selects the webhook's series with its own `namespace` and `job` variables, so one file serves
  every install.
- charts/gpu-webhook/files/prometheus-rules.yaml: the alert groups (a PrometheusRule's `spec`), with placeholders
  templates/prometheusrule.yaml replaces at render time (PLACEHOLDERS: the scrape job, the namespace, and the
  validating webhook's failure policy, which sets the severity of GPUWebhookDown).
- manifests/components/prometheus-rule/prometheusrule.yaml: the same groups in a PrometheusRule, filled in for
  manifests/base (job and Service `gpu-webhook`, namespace `gpu-system`, failurePolicy Fail).

Every gpu_webhook_* name here is one webhook/admission/metrics.py serves; tests/admission/test_monitoring.py
scrapes a running server and checks each name a panel or an alert uses (`up` is Prometheus' own, the DCGM_FI_*
series are dcgm-exporter's). docs/monitoring.md explains each alert and threshold.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

JOB, NAMESPACE = "__JOB__", "__NAMESPACE__"
FAILURE_POLICY, DOWN_SEVERITY = "__VALIDATING_FAILURE_POLICY__", "__DOWN_SEVERITY__"
PLACEHOLDERS = (JOB, NAMESPACE, FAILURE_POLICY, DOWN_SEVERITY)
# manifests/base: the Service (and so the ServiceMonitor's job) and namespace, and the validating failurePolicy.
KUSTOMIZE_VALUES = {JOB: "gpu-webhook", NAMESPACE: "gpu-system", FAILURE_POLICY: "Fail", DOWN_SEVERITY: "critical"}
DASHBOARD_UID = "gpu-webhook"

# ------------------------------------------------------------------------------------------------------ alerts

SEL = f'job="{JOB}", namespace="{NAMESPACE}"'
VALIDATE = f'{SEL}, endpoint="validate"'
CERT_WARNING_DAYS, CERT_CRITICAL_DAYS = 14, 3  # the chart's certificates renew 30 days before expiry
SPIKE_MIN_DENIALS = 5  # in the last 10 minutes
SPIKE_RATIO_POINTS, SPIKE_FACTOR = 0.05, 2


def _deny_ratio(window: str, offset: str = "") -> str:
    """The share of /validate reviews denied over `window` (`offset` before now), per job and namespace.

    No denial in the window is a ratio of 0 (the deny series may not exist yet); no review at all is no ratio."""
    shift = f" offset {offset}" if offset else ""
    total = f"sum by (job, namespace) (rate(gpu_webhook_reviews_total{{{VALIDATE}}}[{window}]{shift}))"
    denied = (f'sum by (job, namespace) (rate(gpu_webhook_reviews_total{{{VALIDATE}, decision="deny"}}'
              f"[{window}]{shift}))")
    return f"(({denied}) or ({total}) * 0) / ({total})"


RULES_CHANGED = (f"count by (job, namespace) (max by (job, namespace, digest) (gpu_webhook_rules_active{{{SEL}}} == 1)"
                 f" unless max by (job, namespace, digest) (gpu_webhook_rules_active{{{SEL}}} offset 1h == 1))")


def _alert(name: str, expr: str, severity: str, summary: str, description: str, for_: str | None = None
           ) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


ALERTS: list[dict[str, Any]] = [
    _alert(
        "GPUWebhookDown",
        f"(sum by (job, namespace) (up{{{SEL}}}) == 0) or absent(up{{{SEL}}})",
        DOWN_SEVERITY,
        "No gpu-webhook replica in {{ $labels.namespace }} can be scraped",
        f"For 2 minutes no target of job {{{{ $labels.job }}}} has been up (or none exists). The validating "
        f"webhook's failurePolicy is {FAILURE_POLICY}: with Fail, kube-apiserver refuses every Pod create and "
        "update the webhook matches until a replica answers again; with Ignore, Pods are admitted unchecked. "
        "Check the Deployment's Pods, their readiness and the Service's endpoints.",
        "2m"),
    _alert(
        "GPUWebhookRuleReloadFailing",
        f"increase(gpu_webhook_rules_reload_failures_total{{{SEL}}}[30m]) > 0",
        "warning",
        "gpu-webhook refused a rule change ({{ $labels.pod }})",
        "A rule file change on disk was invalid and was not loaded in the last 30 minutes: the replica keeps "
        "enforcing the last good rules (gpu_webhook_rules_active names their digest), not what the ConfigMap "
        "holds. The log event rules-reload-failed names the file and the error; fix the ConfigMap or run "
        "`gpu-webhook lint` on the rules. Resolves 30 minutes after the last refusal.",
    ),
    _alert(
        "GPUWebhookCertificateReloadFailing",
        f"increase(gpu_webhook_tls_reload_failures_total{{{SEL}}}[30m]) > 0",
        "warning",
        "gpu-webhook could not load a new serving certificate ({{ $labels.pod }})",
        "A certificate/key pair in the TLS Secret could not be loaded in the last 30 minutes; the replica "
        "keeps serving the last good pair, which will expire. Check the Secret (tls.crt, tls.key match) and "
        "cert-manager's Certificate status.",
    ),
    _alert(
        "GPUWebhookCertificateExpiringSoon",
        f"min by (job, namespace, pod) (gpu_webhook_tls_cert_not_after_timestamp_seconds{{{SEL}}}) - time() "
        f"< {CERT_WARNING_DAYS} * 86400",
        "warning",
        "The serving certificate of {{ $labels.pod }} expires in {{ $value | humanizeDuration }}",
        f"Fewer than {CERT_WARNING_DAYS} days are left, but the chart's certificates renew 30 days before "
        "expiry: renewal is failing, or the Pod does not pick the renewed Secret up. Check cert-manager's "
        "Certificate (or `gpu-webhook certs` for provided ones) and GPUWebhookCertificateReloadFailing.",
        "15m"),
    _alert(
        "GPUWebhookCertificateExpiringSoon",
        f"min by (job, namespace, pod) (gpu_webhook_tls_cert_not_after_timestamp_seconds{{{SEL}}}) - time() "
        f"< {CERT_CRITICAL_DAYS} * 86400",
        "critical",
        "The serving certificate of {{ $labels.pod }} expires in {{ $value | humanizeDuration }}",
        f"Fewer than {CERT_CRITICAL_DAYS} days are left. When it expires kube-apiserver cannot call the webhook: "
        "with the validating webhook failing closed no matched Pod is created. Renew the certificate now.",
        "15m"),
    _alert(
        "GPUWebhookInventoryNotSynced",
        f"gpu_webhook_inventory_synced{{{SEL}}} == 0",
        "warning",
        "gpu-webhook's cluster inventory is not synced ({{ $labels.pod }})",
        "For 10 minutes the replica's watches of nodes, namespaces and runtime classes have not been synced, so "
        "the cluster-aware checks (live GPU inventory, namespace policy) are skipped and Pods are admitted "
        "without them. Check the replica's log for watch errors and its RBAC (the cluster-awareness "
        "component).",
        "10m"),
    _alert(
        "GPUWebhookDenialsSpikeAfterRuleChange",
        f"(\n  {_deny_ratio('10m')}\n> {SPIKE_RATIO_POINTS} + {SPIKE_FACTOR} *\n"
        f"  {_deny_ratio('1h', offset='1h')}\n)\n"
        f"and on (job, namespace) sum by (job, namespace) (increase(gpu_webhook_reviews_total{{{VALIDATE}, "
        f'decision="deny"}}[10m])) >= {SPIKE_MIN_DENIALS}\n'
        f"and on (job, namespace) {RULES_CHANGED}\n",
        "critical",
        "gpu-webhook denies {{ $value | humanizePercentage }} of Pods since a rule change",
        f"The rules being enforced changed within the last hour (a new gpu_webhook_rules_active digest), and "
        f"the share of /validate reviews denied over the last 10 minutes is more than {SPIKE_FACTOR} times the "
        f"share in the hour before the change plus {round(SPIKE_RATIO_POINTS * 100)} points, with at least "
        f"{SPIKE_MIN_DENIALS} denials. gpu_webhook_rule_findings_total shows which rule denies; revert the rule "
        "change or check it with `gpu-webhook check`.",
        "5m"),
]

GROUPS: list[dict[str, Any]] = [{"name": "gpu-webhook", "interval": "30s", "rules": ALERTS}]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as literal blocks, as a person would write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump(document: Any) -> str:
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=120)


def rule_groups_text() -> str:
    """files/prometheus-rules.yaml: the PrometheusRule's spec (groups), with the placeholders in."""
    return dump({"groups": GROUPS})


def filled(text: str, values: dict[str, str]) -> str:
    """`text` with every placeholder replaced."""
    for placeholder in PLACEHOLDERS:
        text = text.replace(placeholder, values[placeholder])
    return text


def kustomize_rule_text(header: str) -> str:
    """The PrometheusRule of manifests/components/prometheus-rule, for manifests/base."""
    spec = yaml.safe_load(filled(rule_groups_text(), KUSTOMIZE_VALUES))
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "gpu-webhook", "namespace": "gpu-system",
                         "labels": {"app.kubernetes.io/name": "gpu-webhook",
                                    "app.kubernetes.io/part-of": "gpu-webhook"}},
            "spec": spec}
    return header + dump(rule)


# --------------------------------------------------------------------------------------------------- dashboard

D = 'job="$job", namespace="$namespace"'
DV = f'{D}, endpoint="validate"'
DCGM = 'DCGM_FI_DEV_GPU_UTIL{namespace!="", pod!=""}'
DCGM_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")  # dcgm-exporter's, as webhook/policy/usage.py reads


def _target(expr: str, legend: str, ref: str, instant: bool = False) -> dict[str, Any]:
    target: dict[str, Any] = {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr,
                              "legendFormat": legend, "refId": ref}
    if instant:
        target.update({"instant": True, "range": False, "format": "table"})
    return target


def _panel(kind: str, title: str, description: str, targets: list[tuple[str, str]], unit: str,
           grid: tuple[int, int, int, int], **extra: Any) -> dict[str, Any]:
    x, y, w, h = grid
    return {"type": kind, "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": x, "y": y, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [_target(expr, legend, chr(ord("A") + i), instant=kind == "table")
                        for i, (expr, legend) in enumerate(targets)],
            **extra}


def _row(title: str, y: int) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
            "panels": []}


PANELS: list[dict[str, Any]] = [
    _row("Reviews", 0),
    _panel("timeseries", "Reviews per second by decision",
           "AdmissionReviews answered, by endpoint (mutate, validate) and decision (allow, patch, deny).",
           [(f"sum by (endpoint, decision) (rate(gpu_webhook_reviews_total{{{D}}}[$__rate_interval]))",
             "{{endpoint}} {{decision}}")], "reqps", (0, 1, 12, 8)),
    _panel("timeseries", "Rule findings per second by rule",
           "Rules that fired in answered reviews, by rule id and effect (deny or warn).",
           [(f"sum by (rule, effect) (rate(gpu_webhook_rule_findings_total{{{D}}}[$__rate_interval]))",
             "{{rule}} ({{effect}})")], "reqps", (12, 1, 12, 8)),
    _panel("timeseries", "Review latency percentiles",
           "Time to answer one review inside the server (kube-apiserver's timeout is 5 s).",
           [(f"histogram_quantile({q}, sum by (le, endpoint) (rate(gpu_webhook_review_duration_seconds_bucket"
             f"{{{D}}}[$__rate_interval])))", f"p{round(q * 100)} {{{{endpoint}}}}") for q in (0.5, 0.9, 0.99)],
           "s", (0, 9, 12, 8)),
    _panel("timeseries", "Denied share of /validate reviews",
           "What GPUWebhookDenialsSpikeAfterRuleChange watches; a new rules digest is marked by the panel below.",
           [(f'sum(rate(gpu_webhook_reviews_total{{{DV}, decision="deny"}}[$__rate_interval])) / '
             f"sum(rate(gpu_webhook_reviews_total{{{DV}}}[$__rate_interval]))", "denied")],
           "percentunit", (12, 9, 6, 8)),
    _panel("timeseries", "Malformed requests per second",
           "Calls answered with a 4xx (malformed AdmissionReview, body too large, wrong method or path).",
           [(f"sum by (endpoint, code) (rate(gpu_webhook_bad_requests_total{{{D}}}[$__rate_interval]))",
             "{{endpoint}} {{code}}")], "reqps", (18, 9, 6, 8)),
    _row("Rules, certificates, inventory", 17),
    _panel("stat", "Rule reload failures (1 h)",
           "Rule changes on disk refused as invalid in the last hour; the last good rules keep serving.",
           [(f"sum(increase(gpu_webhook_rules_reload_failures_total{{{D}}}[1h]))", "refused")], "short",
           (0, 18, 4, 6)),
    _panel("stat", "Rule reloads (1 h)", "Rule changes on disk loaded and enforced in the last hour.",
           [(f"sum(increase(gpu_webhook_rules_reloads_total{{{D}}}[1h]))", "loaded")], "short", (4, 18, 4, 6)),
    _panel("table", "Rules digest per replica", "1 for the digest of the rules each replica enforces.",
           [(f"gpu_webhook_rules_active{{{D}}} == 1", "{{pod}} {{digest}}")], "short", (8, 18, 8, 6)),
    _panel("stat", "Serving certificate expires in",
           "Time left on the earliest-expiring serving certificate in use (renewed 30 days before expiry).",
           [(f"min(gpu_webhook_tls_cert_not_after_timestamp_seconds{{{D}}}) - time()", "expires in")], "s",
           (16, 18, 4, 6)),
    _panel("stat", "Certificate reload failures (1 h)",
           "Certificate/key pairs that could not be loaded in the last hour (the last good pair keeps serving).",
           [(f"sum(increase(gpu_webhook_tls_reload_failures_total{{{D}}}[1h]))", "failed")], "short",
           (20, 18, 4, 6)),
    _panel("timeseries", "Inventory synced",
           "1 when the replica's cluster inventory is synced, 0 when its checks are skipped; no data when cluster "
           "awareness is off.", [(f"gpu_webhook_inventory_synced{{{D}}}", "{{pod}}")], "short", (0, 24, 12, 6)),
    _panel("timeseries", "Replicas up", "Scrape targets of the job that answer (Prometheus' `up`).",
           [(f"sum(up{{{D}}})", "up")], "short", (12, 24, 12, 6)),
    _row("GPU use (dcgm-exporter; empty without it)", 30),
    _panel("stat", "Allocated GPUs idle for the last hour",
           "GPUs held by a Pod whose p95 utilisation over the last hour is below 1 % (the idle threshold of "
           "`gpu-webhook usage`, which also ranks workloads over days: docs/usage.md).",
           [(f"count(quantile_over_time(0.95, {DCGM}[1h]) < 1) or vector(0)", "idle GPUs")], "short",
           (0, 31, 6, 8)),
    _panel("stat", "Allocated GPUs", "GPUs (or MIG instances) dcgm-exporter reports as held by a Pod.",
           [(f"count({DCGM})", "allocated")], "short", (6, 31, 6, 8)),
    _panel("table", "Idle GPUs by Pod (p95 utilisation over 1 h below 1 %)",
           "The Pods holding idle GPUs; `gpu-webhook usage` names their workloads and the GPU-hours they waste.",
           [(f"sum by (namespace, pod) (quantile_over_time(0.95, {DCGM}[1h]) < 1)", "{{namespace}}/{{pod}}")],
           "percent", (12, 31, 12, 8)),
    _panel("timeseries", "GPU utilisation by Pod", "DCGM_FI_DEV_GPU_UTIL of the GPUs Pods hold.",
           [(f"avg by (namespace, pod) ({DCGM})", "{{namespace}}/{{pod}}")], "percent", (0, 39, 12, 8)),
    _panel("timeseries", "GPU memory used by Pod", "DCGM_FI_DEV_FB_USED (MiB) of the GPUs Pods hold.",
           [('sum by (namespace, pod) (DCGM_FI_DEV_FB_USED{namespace!="", pod!=""})', "{{namespace}}/{{pod}}")],
           "decmbytes", (12, 39, 12, 8)),
]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {"type": "query", "name": name, "label": label,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "sort": 1,
            "includeAll": False, "multi": False}


DASHBOARD: dict[str, Any] = {
    "uid": DASHBOARD_UID,
    "title": "gpu-webhook",
    "description": "Admission reviews, rules, certificates and inventory of gpu-webhook, and idle GPUs from "
                   "dcgm-exporter. Source: charts/monitoring.py; docs/monitoring.md.",
    "tags": ["gpu-webhook", "kubernetes", "gpu"],
    "editable": True,
    "graphTooltip": 1,
    "refresh": "1m",
    "schemaVersion": 39,
    "time": {"from": "now-6h", "to": "now"},
    "timezone": "",
    "templating": {"list": [
        {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus"},
        _variable("namespace", "Namespace", "label_values(gpu_webhook_reviews_total, namespace)"),
        _variable("job", "Job", 'label_values(gpu_webhook_reviews_total{namespace="$namespace"}, job)'),
    ]},
    "annotations": {"list": []},
    "panels": [{"id": i, **panel} for i, panel in enumerate(PANELS, start=1)],
}


def dashboard_text() -> str:
    """The dashboard's JSON file."""
    return json.dumps(DASHBOARD, indent=2) + "\n"
