"""The Prometheus reader (webhook.cluster.prometheus) and `gpu-webhook usage`'s bad-input paths, against a local
stand-in HTTP server that answers like Prometheus (or like something that is not Prometheus). The real server is
exercised in tests/e2e/test_16_usage.py (VictoriaMetrics); this covers what a real one will not do on demand:
hang past the timeout, answer HTML, refuse a query."""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from webhook.cli import usage as usage_cli
from webhook.cli.main import main
from webhook.cluster import kube, prometheus, reads
from webhook.policy import usage

Answer = tuple[int, str, bytes]


def matrix(*series: tuple[dict[str, str], list[tuple[float, str]]]) -> Answer:
    result = [{"metric": labels, "values": [[t, v] for t, v in values]} for labels, values in series]
    return 200, "application/json", json.dumps({"status": "success",
                                                "data": {"resultType": "matrix", "result": result}}).encode()


@pytest.fixture
def stand_in() -> Iterator[Callable[[Callable[[str, dict[str, list[str]]], Answer]], str]]:
    """A stand-in Prometheus: `serve(answer)` starts it with `answer(path, query) -> (status, type, body)`."""
    servers: list[ThreadingHTTPServer] = []

    def serve(answer: Callable[[str, dict[str, list[str]]], Answer]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                try:
                    status, kind, body = answer(url.path, parse_qs(url.query))
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


LABELS = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "UUID": "GPU-7499c50f-2307-cd9c-d9cc-937afc16d5cb",
          "modelName": "NVIDIA H200", "Hostname": "kit-gpu-node", "pod": "p", "namespace": "ml", "container": "c"}


def test_read_series_asks_every_metric_with_its_rollup(stand_in: Any) -> None:
    asked: list[str] = []

    def answer(path: str, query: dict[str, list[str]]) -> Answer:
        asked.append(query["query"][0])
        assert path == "/api/v1/query_range" and query["step"] == ["60"] and query["timeout"] == ["30s"]
        return matrix((LABELS, [(1000.0, "5"), (1060.0, "NaN")]))

    prom = prometheus.Prometheus(stand_in(answer) + "/", timeout=30)
    series = prometheus.read_series(prom, 1000, 1060, 60)
    assert asked == [f"{prometheus.ROLLUPS[m]}({m}[60s])" for m in prometheus.ROLLUPS]
    assert [s.metric for s in series] == list(prometheus.ROLLUPS)
    assert "__name__" not in series[0].labels and series[0].points[0] == (1000.0, 5.0)
    assert series[0].points[1][1] != series[0].points[1][1]  # NaN kept, analyse skips it


@pytest.mark.parametrize("status, kind, body, parts", [
    pytest.param(200, "text/html", b"<html>Grafana</html>", ["answered HTTP 200 with text/html",
                                                           "not the Prometheus API", "not at Grafana"], id="html"),
    pytest.param(422, "application/json", b'{"status":"error","errorType":"bad_data","error":"parse error"}',
                 ["refused", "bad_data: parse error"], id="bad-query"),
    pytest.param(503, "application/json",
                 b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}',
                 ["gave up on", "shorten --since", "--timeout"], id="server-side-timeout"),
    pytest.param(404, "text/plain", b"404 page not found", ["HTTP 404 with text/plain", "base URL"],
                 id="wrong-path-prefix"),
])
def test_answers_that_are_not_data(stand_in: Any, status: int, kind: str, body: bytes, parts: list[str]) -> None:
    url = stand_in(lambda path, query: (status, kind, body))
    with pytest.raises(prometheus.PrometheusError) as err:
        prometheus.Prometheus(url).query_range("up", 0, 60, 60)
    for part in parts:
        assert part in str(err.value), str(err.value)


def test_a_query_that_outlasts_the_timeout(stand_in: Any) -> None:
    def slow(path: str, query: dict[str, list[str]]) -> Answer:
        time.sleep(2)
        return matrix()

    with pytest.raises(prometheus.PrometheusError, match=r"did not answer .* within 0\.3 s: shorten --since"):
        prometheus.Prometheus(stand_in(slow), timeout=0.3).query_range("up", 0, 60, 60)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_unreachable_and_malformed_urls() -> None:
    with pytest.raises(prometheus.PrometheusError, match=r"cannot reach Prometheus at .*port-forward"):
        prometheus.Prometheus(f"http://127.0.0.1:{_closed_port()}").query("up", 0)
    with pytest.raises(prometheus.PrometheusError, match="is not an http:// or https:// URL"):
        prometheus.Prometheus("prometheus:9090")


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600),
                                           ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert prometheus.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["7", "7days", "-1d", "0h", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 30m, 12h, 7d or 2w"):
        prometheus.parse_duration(text)


@pytest.mark.parametrize("window, step", [(3600, 60), (7 * 86400, 61), (30 * 86400, 260)])
def test_steps_keep_a_series_under_the_point_limit(window: float, step: float) -> None:
    assert prometheus.step_for(window) == step and window / step <= prometheus.MAX_POINTS


# --------------------------------------------------------------------------------------------- the CLI


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A stand-in for the cluster reads (`usage` lists Pods before it reads Prometheus)."""
    pods: list[dict[str, Any]] = [
        {"kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
         "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}]
    monkeypatch.setattr(kube, "api_client", lambda *a, **k: object())
    monkeypatch.setattr(kube, "context_namespace", lambda *a, **k: "ml")
    monkeypatch.setattr(reads, "read_workloads", lambda api, namespace: pods)
    monkeypatch.delenv("GPU_WEBHOOK_PROMETHEUS", raising=False)
    return pods


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["usage", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_bad_input_exits_2_with_the_fix(stand_in: Any, no_cluster: Any, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    code, _, err = run_cli(capsys)
    assert code == 2 and "no Prometheus to read: pass --prometheus URL" in err
    code, _, err = run_cli(capsys, "--prometheus", "http://127.0.0.1:9", "--since", "7days")
    assert code == 2 and "'7days' is not a duration" in err
    code, _, err = run_cli(capsys, "--prometheus", stand_in(lambda p, q: matrix()), "-A")
    assert code == 2 and "no dcgm-exporter series" in err and "scrape job" in err
    assert "It has none of them now either" in err

    def only_now(path: str, query: dict[str, list[str]]) -> Answer:
        if path == "/api/v1/query":  # the instant check: the metric exists, outside the window
            body = {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"__name__": usage.GPU_UTIL}, "value": [0, "8"]}]}}
            return 200, "application/json", json.dumps(body).encode()
        return matrix()

    code, _, err = run_cli(capsys, "--prometheus", stand_in(only_now), "-A")
    assert code == 2 and "It has DCGM_FI_DEV_GPU_UTIL now: widen --since" in err

    def slow(path: str, query: dict[str, list[str]]) -> Answer:
        time.sleep(2)
        return matrix()

    code, _, err = run_cli(capsys, "--prometheus", stand_in(slow), "--timeout", "0.3")
    assert code == 2 and "did not answer" in err and "Traceback" not in err

    old = {k: v for k, v in LABELS.items() if k not in ("pod", "namespace", "container")}
    code, _, err = run_cli(capsys, "--prometheus", stand_in(lambda p, q: matrix((old, [(1000.0, "3")]))))
    assert code == 2 and "carry no pod labels" in err and "DCGM_EXPORTER_KUBERNETES=true" in err


def test_cli_reports_from_the_rules_url(stand_in: Any, no_cluster: Any, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(path: str, query: dict[str, list[str]]) -> Answer:
        metric = query["query"][0].split("(")[1].split("[")[0]
        value = {usage.GPU_UTIL: "0", usage.FB_USED: "1625", usage.FB_FREE: "141530",
                 usage.FB_RESERVED: "616"}.get(metric)
        if value is None:
            return matrix()
        end = float(query["end"][0])
        return matrix(({**LABELS, "__name__": metric}, [(end - 60 * i, value) for i in range(60)]))

    monkeypatch.setenv("GPU_WEBHOOK_PROMETHEUS", stand_in(answer))
    code, out, err = run_cli(capsys, "--since", "1h", "-o", "json")
    assert code == 0, err
    report = json.loads(out)
    [row] = report["workloads"]
    assert (row["name"], row["verdict"], row["gpuHours"], row["idleGpuHours"]) == ("p", "idle", 1.0, 1.0)
    assert row["memory"] == {"peakMiB": 1625.0, "cardMiB": 143771.0}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_bar_only_on_a_terminal(stand_in: Any, monkeypatch: pytest.MonkeyPatch, terminal: bool) -> None:
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    url = stand_in(lambda p, q: matrix((LABELS, [(0.0, "1")])))
    series = usage_cli._read_with_progress(prometheus.Prometheus(url), 0, 60, 60)
    assert len(series) == len(prometheus.ROLLUPS)
    shown = err.getvalue()
    if terminal:
        assert "querying Prometheus" in shown and f"{list(prometheus.ROLLUPS)[-1]}]" in shown  # names the query
    else:
        assert shown == ""
