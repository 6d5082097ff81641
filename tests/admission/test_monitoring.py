"""Every metric the shipped dashboard and alerts name is one a running server serves on /metrics.

The server is a real `gpu-webhook serve` (gunicorn master and workers, the master's aggregate on the plain-HTTP
metrics port) with cluster awareness on, over a replayed Kubernetes API, so the inventory gauge exists too. It
answers a patch, an allow, a deny and a malformed request; then /metrics is scraped and each metric name in every
PromQL expression of charts/gpu-webhook/files/dashboards/gpu-webhook.json and files/prometheus-rules.yaml (what
the chart and the kustomize components install: charts/sync_chart.py --check keeps them equal) must be there.
Only the names in EXEMPT are not the server's, each with who serves it.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.admission import GPU_REVIEW, REPO, Server, post, review, start_server, wait_until, with_uid
from support.cluster_api import serve_cluster
from support.kube_replay import ReplayServer

from webhook.admission.metrics import FLUSH_SECONDS
from webhook.policy import usage

CHART = REPO / "charts" / "gpu-webhook"
DASHBOARD = CHART / "files" / "dashboards" / "gpu-webhook.json"
RULES = CHART / "files" / "prometheus-rules.yaml"
EXEMPT = {
    "up": "Prometheus' own: the health of each scrape of the webhook's targets",
    "DCGM_FI_DEV_GPU_UTIL": "dcgm-exporter (read by `gpu-webhook usage` too)",
    "DCGM_FI_DEV_FB_USED": "dcgm-exporter (read by `gpu-webhook usage` too)",
}

# --- metric names in PromQL ------------------------------------------------------------------------------

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
            "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?")
_WORD = re.compile(r"[a-zA-Z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords or labels."""
    text = _STRING.sub(" ", expr)  # label values, Grafana variables in them
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)  # [5m], [$__rate_interval], subqueries
    text = _LABEL_LIST.sub(" ", text)
    text = re.sub(r"\boffset\s+\S+", " ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _WORD.finditer(text):
        word, rest = match.group(), text[match.end():].lstrip()
        if word not in KEYWORDS and not rest.startswith("("):
            names.add(word)
    return names


@pytest.mark.parametrize(("expr", "expected"), [
    pytest.param('sum by (endpoint, decision) (rate(gpu_webhook_reviews_total{job="$job"}[$__rate_interval]))',
                 {"gpu_webhook_reviews_total"}, id="grouping-labels-and-grafana-variables"),
    pytest.param("histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m])))", {"a_bucket"}, id="quantile"),
    pytest.param('(sum by (job) (up{job="x"}) == 0) or absent(up{job="x"})', {"up"}, id="or-absent"),
    pytest.param("a offset 1h unless on (job, namespace) b offset 5m", {"a", "b"}, id="offset-unless-on"),
    pytest.param("min(x) - time() < 14 * 86400", {"x"}, id="time-and-numbers"),
    pytest.param("count(quantile_over_time(0.95, DCGM_FI_DEV_GPU_UTIL{pod!=''}[1h]) < 1) or vector(0)",
                 {"DCGM_FI_DEV_GPU_UTIL"}, id="vector-literal-and-single-quotes"),
    pytest.param("m:rate5m{a=\"b{c}\"} > bool 1e3", {"m:rate5m"}, id="recording-rule-name-braces-in-a-value"),
])
def test_metric_names_of_promql(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def alert_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


# --- the server ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, ReplayServer]]:
    tmp = tmp_path_factory.mktemp("monitoring")
    with ReplayServer() as api, pytest.MonkeyPatch.context() as env:
        serve_cluster(api)
        env.setenv("KUBECONFIG", str(api.kubeconfig(tmp / "kubeconfig")))
        served = start_server(tmp, "--cluster", cwd=tmp)
        try:
            yield served, api
        finally:
            served.stop()


def served_names(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)(\{|\s)", text, re.M)}


def test_every_metric_a_panel_or_alert_names_is_served(server: tuple[Server, ReplayServer]) -> None:
    served, _ = server
    context = ssl.create_default_context(cafile=str(Path(served.log_path).parent / "certs" / "ca.crt"))
    conn = served.connection(context)
    try:
        for path, document in (("/mutate", GPU_REVIEW), ("/validate", GPU_REVIEW),
                               ("/validate", review("pod-create-gpu-mismatch"))):
            status, _ = post(conn, path, with_uid(document))
            assert status == 200
        status, _ = post(conn, "/mutate", b"{nope")
        assert status == 400
    finally:
        conn.close()
    time.sleep(FLUSH_SECONDS * 1.5)  # the workers write their tallies
    assert wait_until(lambda: served.metric("gpu_webhook_inventory_synced") == 1, timeout=30), served.log()
    assert served.metric("gpu_webhook_reviews_total", {"decision": "deny"}) >= 1, "the mismatch was not denied"
    have = served_names(served.metrics())

    wanted: dict[str, set[str]] = {}
    for source, exprs in (("dashboard", dashboard_exprs()), ("alerts", alert_exprs())):
        assert exprs, f"no expressions found in the {source}"
        for expr in exprs:
            for name in metric_names(expr):
                wanted.setdefault(name, set()).add(source)
    missing = {name: sorted(sources) for name, sources in wanted.items() if name not in have and name not in EXEMPT}
    assert not missing, (f"named by a panel or an alert but not served on /metrics: {missing}; served: "
                         f"{sorted(n for n in have if n.startswith('gpu_webhook'))}")
    assert set(EXEMPT) <= set(wanted), f"exempt but no longer used: {sorted(set(EXEMPT) - set(wanted))}"
    dcgm = {name for name in EXEMPT if name.startswith("DCGM_")}
    assert dcgm <= set(usage.METRICS), "the dashboard's dcgm-exporter series are the ones `gpu-webhook usage` reads"


def test_each_served_instrument_of_the_webhook_is_on_the_dashboard(server: tuple[Server, ReplayServer]) -> None:
    """The reverse: no gpu_webhook_* family the server exposes is left off the dashboard."""
    served, _ = server
    families = {re.sub(r"_(bucket|sum|count|created)$", "", name) for name in served_names(served.metrics())
                if name.startswith("gpu_webhook_")}
    on_dashboard = {re.sub(r"_(bucket|sum|count)$", "", name) for expr in dashboard_exprs()
                    for name in metric_names(expr)}
    assert families - on_dashboard == set()
