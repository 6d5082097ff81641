"""Edits -> RFC 6902 JSON Patch operations.

Operations are built directly from the edits, never by diffing whole objects: a key goes in with
`add /parent/key` when its map exists, and a missing map or list is added whole at the shallowest missing
level (`add /spec/nodeSelector {...}`), because `add` below a missing parent fails in the API server
("doc is missing path"). Every reference token is escaped as RFC 6901 requires (`nvidia.com~1gpu`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import orjson

from webhook.policy import pods
from webhook.policy.findings import Edit, Patch

Path = tuple[str | int, ...]
_CONTAINERS = (dict, list)  # a tuple: isinstance checks it faster than the union `dict | list`
_UNSEEN: Any = object()


@lru_cache(maxsize=4096)
def pointer(path: tuple[str | int, ...]) -> str:
    """A JSON Pointer for `path`: `~` -> `~0` first, then `/` -> `~1` (RFC 6901 section 3)."""
    return "".join("/" + str(step).replace("~", "~0").replace("/", "~1") for step in path)


def operations(obj: Mapping[str, Any], edits: Sequence[Edit]) -> list[dict[str, Any]]:
    """The smallest correct JSON Patch that applies `edits` to `obj` (empty: nothing to change)."""
    ops: list[dict[str, Any]] = []
    created: dict[Path, Any] = {}
    anchors: dict[Path, Path | None] = {}
    for kind, path, key, value in edits:
        anchor = anchors.get(path, _UNSEEN)
        if anchor is _UNSEEN:
            anchor = anchors[path] = _missing_root(obj, path, list if kind == "append" else dict)
        if isinstance(value, _CONTAINERS):
            value = _copy(value)
        if anchor is None:
            if kind == "set":
                ops.append({"op": "add", "path": pointer((*path, str(key))), "value": value})
            elif kind == "append":
                ops.append({"op": "add", "path": pointer((*path, "-")), "value": value})
            elif key in pods.mapping(pods.get(obj, path)):
                ops.append({"op": "remove", "path": pointer((*path, str(key)))})
            continue
        if kind == "remove":
            continue
        node: Any = created.get(anchor)
        if node is None:
            node = created[anchor] = [] if (anchor == path and kind == "append") else {}
            ops.append({"op": "add", "path": pointer(anchor), "value": node})
        if len(anchor) < len(path):
            rest = path[len(anchor):]
            for i, step in enumerate(rest):
                last = i == len(rest) - 1
                node = node.setdefault(step, [] if (last and kind == "append") else {})
        if kind == "append":
            node.append(value)
        else:
            node[key] = value
    return ops


def encode(ops: Sequence[Mapping[str, Any]]) -> str:
    """RFC 6902 operations as the base64 string an AdmissionReview's `response.patch` carries."""
    return base64.b64encode(orjson.dumps(list(ops))).decode("ascii")


def patch_of(obj: Mapping[str, Any], edits: Sequence[Edit]) -> Patch:
    """`operations(obj, edits)`, frozen in a tuple and encoded once: a patch to share between reviews."""
    ops = tuple(operations(obj, edits))
    return Patch(ops, encode(ops))


def _copy(value: Any) -> Any:
    """A copy of a JSON value, so the patch never shares containers with the rules."""
    if isinstance(value, dict):
        return {k: _copy(v) if isinstance(v, _CONTAINERS) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) if isinstance(v, _CONTAINERS) else v for v in value]
    return value


def _missing_root(obj: Mapping[str, Any], path: Path, leaf: type = dict) -> Path | None:
    """The shallowest prefix of `path` that is absent (or null) in `obj`; None when all of it exists.

    A container of the wrong type (a list where a map belongs) counts as absent and is replaced whole: the
    API server never sends one (it refuses such a body at decoding), but a manifest given to `check` can.
    """
    node: Any = obj
    for depth, step in enumerate(path):
        if isinstance(node, dict):
            node = node.get(step)
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        else:
            node = None
        if node is None:
            return path[: depth + 1]
    return None if isinstance(node, leaf) else path
