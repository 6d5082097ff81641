"""Reading Kubernetes manifests for `check` and `test`: multi-document YAML or JSON, `List` kinds, line numbers.

The only YAML loader is PyYAML's safe one: a manifest can hold no tag that builds a Python object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml


class ManifestError(ValueError):
    """A manifest that cannot be read; the message starts with `file:line:`."""


@dataclass(frozen=True)
class Manifest:
    """One object read from a file, with where it starts."""

    source: str
    line: int
    obj: Mapping[str, Any]

    def where(self) -> str:
        return f"{self.source}:{self.line}"


def read_manifests(source: str, text: str) -> list[Manifest]:
    """Every object of a YAML or JSON text; `List` items are expanded; raises ManifestError with file:line."""
    out: list[Manifest] = []
    for line, body in _documents(source, text):
        if body is None:
            continue
        if not isinstance(body, Mapping):
            raise ManifestError(f"{source}:{line}: expected a Kubernetes object (a mapping with apiVersion and kind), "
                                f"got {type(body).__name__}; check the indentation of this document")
        out.extend(_expand(source, line, body))
    return out


def yaml_documents(text: str) -> Iterator[tuple[yaml.Node, Any]]:
    """Each YAML document as its composed node (for line numbers) and its value, parsed once, safe tags only;
    raises yaml.YAMLError."""
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:  # check_node() was true: there is a document
                yield node, loader.construct_document(node)
    finally:
        loader.dispose()


def _documents(source: str, text: str) -> Iterator[tuple[int, Any]]:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")) and not stripped.startswith("{{"):
        try:
            yield 1, json.loads(text)
            return
        except json.JSONDecodeError:
            pass  # flow-style YAML (KYAML) also starts with "{"; let the YAML parser judge it
    try:
        for node, body in yaml_documents(text):
            yield node.start_mark.line + 1, body
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ManifestError(f"{source}:{line}: not valid YAML: {problem}; fix the syntax at that line") from None


def _expand(source: str, line: int, body: Mapping[str, Any]) -> Iterator[Manifest]:
    kind = body.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(body.get("items"), list):
        for item in body["items"]:
            if isinstance(item, Mapping):
                yield Manifest(source, line, item)
        return
    if "kind" not in body:
        raise ManifestError(f"{source}:{line}: this document has no kind; add apiVersion and kind (e.g. v1, Pod)")
    yield Manifest(source, line, body)


def object_name(obj: Mapping[str, Any]) -> str:
    """metadata.name, or `generateName*` for objects named by the API server, or `(unnamed)`."""
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        if meta.get("name"):
            return str(meta["name"])
        if meta.get("generateName"):
            return f"{meta['generateName']}*"
    return "(unnamed)"
