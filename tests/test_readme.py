"""The README and docs/ as a reader meets them: the README stays a page a newcomer reads (at most 20,000
characters; the reference lives in docs/), every relative link in it and in docs/*.md leads to a file that
exists and, with `#anchor`, to a heading there (GitHub's anchors), and every `$ gpu-webhook ...` output the
README shows is what the command prints today."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_LIMIT = 20_000
DOCUMENTS = [README, *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (links in code are not links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets and markup dropped, lower case, punctuation except `-` and `_`
    removed, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file's headings, the `-1`, `-2`, ... of repeated headings included."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of a Markdown file that lead nowhere, each with what is missing."""
    broken = []
    for line in prose(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO)}: link ({target})"
            if not dest.exists():
                broken.append(f"{where}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    return broken


def test_readme_is_a_page_not_the_reference() -> None:
    size = len(README.read_text(encoding="utf-8"))
    assert size <= README_LIMIT, (
        f"README.md has {size:,} characters, more than {README_LIMIT:,}: move reference text (every rule, field, "
        "command, figure) to a docs/*.md file and link it from README.md's \"Where the rest is\"")


@pytest.mark.parametrize("path", DOCUMENTS, ids=[str(p.relative_to(REPO)) for p in DOCUMENTS])
def test_relative_links_resolve(path: Path) -> None:
    broken = broken_links(path)
    assert not broken, "links that lead nowhere; fix the path or the #anchor (GitHub's: lower case, " \
                       "punctuation dropped, spaces as -):\n" + "\n".join(broken)


@pytest.mark.parametrize(("heading", "anchor"), [
    pytest.param("How a Pod's class is chosen", "how-a-pods-class-is-chosen", id="apostrophe"),
    pytest.param("`gpu-webhook doctor POD`", "gpu-webhook-doctor-pod", id="code"),
    pytest.param("Gradual rollout and failurePolicy", "gradual-rollout-and-failurepolicy", id="case"),
    pytest.param("Troubleshooting: the path of a GPU Pod", "troubleshooting-the-path-of-a-gpu-pod", id="colon"),
    pytest.param("The seed's Pods through `check`", "the-seeds-pods-through-check", id="mixed"),
    pytest.param("1. Was the Pod created at all?", "1-was-the-pod-created-at-all", id="numbered"),
])
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def shown_outputs() -> list[tuple[str, str]]:
    """Each ```text block of the README that starts with `$ gpu-webhook ...`: the command and the output shown."""
    blocks = re.findall(r"^```text\n\$ (gpu-webhook [^\n]*)\n(.*?)^```$", README.read_text(encoding="utf-8"),
                        flags=re.S | re.M)
    return [(command, output) for command, output in blocks]


SHOWN = shown_outputs()


def test_the_readme_shows_command_outputs() -> None:
    assert len(SHOWN) >= 3, "README.md's `check` walkthrough lost its `$ gpu-webhook check ...` blocks"


@pytest.mark.parametrize(("command", "shown"), SHOWN, ids=[c for c, _ in SHOWN])
def test_shown_output_is_current(command: str, shown: str) -> None:
    args = shlex.split(command)[1:]
    result = subprocess.run([sys.executable, "-m", "webhook", *args], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode in (0, 1), result.stderr
    assert result.stdout.rstrip("\n") == shown.rstrip("\n"), (
        f"README.md shows an output of `{command}` that is no longer what it prints: paste the new output "
        f"(run it from the repository root) into README.md. It prints now:\n{result.stdout}")
