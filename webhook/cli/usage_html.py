"""`gpu-webhook usage --html-file`: the report as one self-contained HTML page a person opens in a browser.

The page holds what the text report prints (its heading, the ranking with the same columns, the totals and the
reasons) and, when matplotlib is installed, the `--plot-file` figure inlined as SVG: the ranking as bars and each
workload's activity over the window. It needs no network and no script. Every text from the cluster or the metrics
(workload names, reasons, the Prometheus URL) is escaped with `html.escape`; the SVG is matplotlib's, which escapes
its own text. Without matplotlib the page says how to get the figure.

`page` is pure (strings in, a string out); `write` is the only I/O.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path

from webhook.cli.usage_plot import INSTALL

_STYLE = """
body { font-family: "DejaVu Sans", Verdana, sans-serif; font-size: 14px; margin: 2em; color: #222; }
h1 { font-size: 1.3em; margin-bottom: 0.2em; }
p.source { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.idle td.verdict { color: #d55e00; font-weight: bold; }
tr.oversized td.verdict, tr.underused td.verdict { color: #a05a00; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
ul.notes { padding-left: 1.2em; }
"""
_NUMERIC = (1, 2, 3, 4, 5)  # GPUS, GPU-H, IDLE-H, P50, P95 of the text report's columns
_VERDICT = 7
_PROLOGUE = re.compile(r"\A\s*(<\?xml[^>]*\?>\s*)?(<!DOCTYPE[^>]*>\s*)?", re.IGNORECASE)


class HtmlError(Exception):
    """A page that cannot be written; the message names the flag, the path and how to fix it."""


def page(heading: str, header: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str],
         svg: bytes | None, empty: str) -> str:
    """The whole page. `heading`: the text report's first line (`... from SOURCE`); `header` and `rows`: its
    table; `notes`: the lines under it, the totals first; `svg`: the figure, or None when matplotlib is missing;
    `empty`: the line shown instead of rows when there are none."""
    title, _, source = heading.partition(" from ")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="source">from {html.escape(source)}</p>' if source else "",
        _table(header, rows, empty),
        _notes(notes),
        _figure(svg),
        "</body>",
        "</html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
    out = ['<table class="ranking">', "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
           + "</tr></thead>", "<tbody>"]
    for row in rows:
        verdict = row[_VERDICT] if len(row) > _VERDICT else ""
        cells = []
        for i, cell in enumerate(row):
            cls = "num" if i in _NUMERIC else "verdict" if i == _VERDICT else ""
            cells.append(f'<td class="{cls}">{html.escape(cell)}</td>' if cls else f"<td>{html.escape(cell)}</td>")
        out.append(f'<tr class="{html.escape(verdict)}">' + "".join(cells) + "</tr>")
    if not rows:
        out.append(f'<tr><td colspan="{len(header)}">{html.escape(empty)}</td></tr>')
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    total, rest = notes[0], notes[1:]
    out = [f"<p><strong>{html.escape(total)}</strong></p>"]
    if rest:
        out.append('<ul class="notes">' + "".join(f"<li>{html.escape(n.strip())}</li>" for n in rest) + "</ul>")
    return "\n".join(out)


def _figure(svg: bytes | None) -> str:
    if svg is None:
        return (f'<p class="no-figure">The figure (the ranking as bars and each workload\'s activity over time) needs '
                f"matplotlib: <code>{html.escape(INSTALL)}</code>, then run the same command again.</p>")
    body = _PROLOGUE.sub("", svg.decode("utf-8"), count=1)
    return f"<figure>\n{body}\n<figcaption>The ranking and each workload's activity over the window.</figcaption>" \
           "\n</figure>"


def write(text: str, path: Path, flag: str = "--html-file") -> None:
    """Write the page to `path`; HtmlError naming the flag and the path when it cannot."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise HtmlError(f"{flag} {path}: cannot write it ({err.strerror or err}); name a file in a directory "
                        "that exists and is writable") from None
