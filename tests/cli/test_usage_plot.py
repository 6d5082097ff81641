"""`usage --plot-file`: the replay's fleet (tests/support/usage_sample.py) drawn as PNG and SVG, and the errors."""

from __future__ import annotations

import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from support.usage_sample import report

from webhook.cli import usage_plot
from webhook.cli.main import main
from webhook.policy.usage_chart import chart

CHART = chart(report(), 0.01)
TITLE = usage_plot.title(CHART, "http://prometheus.test:9090; rules test")


def test_png_has_the_signature_and_the_size() -> None:
    data = usage_plot.render(CHART, "png", TITLE)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 2002) == usage_plot.size_px(CHART)
    assert data == usage_plot.render(CHART, "png", TITLE), "deterministic"


def test_svg_parses_and_names_every_workload() -> None:
    data = usage_plot.render(CHART, "svg", TITLE)
    text = "".join(ET.fromstring(data).itertext())
    for row in CHART.rows:
        assert row.label in text
    assert b"<dc:date>" not in data
    assert data == usage_plot.render(CHART, "svg", TITLE), "deterministic"


@pytest.mark.parametrize(("args", "wanted"), [
    pytest.param(["--plot-file", "out.jpg"], "end the file name in .png or .svg", id="extension"),
    pytest.param(["--plot-file", "out"], "no extension names no format", id="no-extension"),
])
def test_plot_file_errors(args: list[str], wanted: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--prometheus", "http://127.0.0.1:1", *args]) == 2
    assert wanted in capsys.readouterr().err


def test_without_the_extra_it_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["usage", "--prometheus", "http://127.0.0.1:1", "--plot-file", "out.png"]) == 2
    assert "pip install 'gpu-webhook[plot]'" in capsys.readouterr().err


def test_unwritable_path(tmp_path: Path) -> None:
    with pytest.raises(usage_plot.PlotError, match="directory that exists"):
        usage_plot.write(CHART, tmp_path / "missing" / "out.svg", TITLE)
