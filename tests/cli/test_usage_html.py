"""`usage --html-file`: the replay's fleet (tests/support/usage_sample.py) as an HTML page, read back with the
stdlib's HTML parser; hostile names escaped; the page without matplotlib; the errors."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support.usage_sample import POD_NAMES, report

from webhook.cli import usage_html
from webhook.cli.main import main
from webhook.cli.usage import HEADER, html_page, table

SOURCE = "http://prometheus.test:9090; rules test"
HOSTILE = "<script>alert(1)</script>"


class Page(HTMLParser):
    """The elements of a page (tag names, in order), its table rows as text cells, and the inline svg's source."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.text = ""
        self.feed(text)
        self.close()
        start, end = text.find("<svg"), text.rfind("</svg>")
        self.svg = text[start:end + len("</svg>")] if start >= 0 else ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text += data
        if self._cell is not None:
            self._cell.append(data)


def test_the_table_is_the_text_reports_ranking() -> None:
    sample = report()
    page = Page(html_page(sample, SOURCE, 0.01))
    assert page.rows[0] == list(HEADER)
    assert page.rows[1:1 + len(sample.workloads)] == [list(r) for r in table(sample)]
    assert "could be freed" in page.text and SOURCE in page.text
    assert page.tags[:2] == ["html", "head"] and "script" not in page.tags


def test_the_figure_is_inlined_as_svg() -> None:
    page = Page(html_page(report(), SOURCE, 0.01))
    assert page.tags.count("svg") == 1 and "figure" in page.tags
    svg = ET.fromstring(page.svg)
    text = "".join(svg.itertext())
    for w in report().workloads[:3]:
        assert str(w.workload) in text


def test_a_hostile_name_is_escaped_everywhere() -> None:
    names = {n: n for n in POD_NAMES} | {"ts-1": HOSTILE}
    sample = report(names=names)
    assert any(HOSTILE in str(w.workload) for w in sample.workloads)
    text = html_page(sample, f"{SOURCE}{HOSTILE}", 0.01)
    page = Page(text)
    assert "script" not in page.tags  # nor inside the inline svg: matplotlib escapes its text
    assert HOSTILE not in text
    assert HOSTILE in page.text  # shown to the reader as text


def test_without_matplotlib_the_page_says_how_to_get_the_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    page = Page(html_page(report(), SOURCE, 0.01))
    assert "svg" not in page.tags
    assert "pip install 'gpu-webhook[plot]'" in page.text
    assert len(page.rows) > 1


def test_an_empty_report_says_so() -> None:
    empty = usage_html.page("GPU usage x from y", HEADER, [], ["Total: 0.0 GPU-hours held"], None, "(none here)")
    assert Page(empty).rows[1] == ["(none here)"]


def test_unwritable_path(tmp_path: Path) -> None:
    with pytest.raises(usage_html.HtmlError, match=r"--html-file .*directory that exists"):
        usage_html.write("<html></html>", tmp_path)  # a directory: cannot be written as a file


def test_a_missing_directory_is_refused_before_anything_is_read(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "report.html"
    assert main(["usage", "--prometheus", "http://127.0.0.1:1", "--html-file", str(target)]) == 2
    err = capsys.readouterr().err
    assert "--html-file" in err and "does not exist" in err and "127.0.0.1" not in err
