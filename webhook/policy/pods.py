"""Where pod specs live in Pods and workload kinds, their containers, and the effective GPU count.

A Pod carries its spec at `spec`; workload kinds carry a pod *template* whose spec is not defaulted by the
API server (limits are not copied into requests). Custom resources (RayJob, MPIJob, LeaderWorkerSet, ...)
embed pod specs at places only their authors know, so for kinds not listed here the spec is found by shape.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

Path = tuple[str | int, ...]

# kind -> (path of the pod spec, path of the metadata that goes with it)
KNOWN_KINDS: dict[str, tuple[Path, Path]] = {
    "Pod": (("spec",), ("metadata",)),
    "PodTemplate": (("template", "spec"), ("template", "metadata")),
    "Deployment": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "ReplicaSet": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "StatefulSet": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "DaemonSet": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "Job": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "ReplicationController": (("spec", "template", "spec"), ("spec", "template", "metadata")),
    "CronJob": (
        ("spec", "jobTemplate", "spec", "template", "spec"),
        ("spec", "jobTemplate", "spec", "template", "metadata"),
    ),
}
# Containers judged: ephemeral (debugging) containers are not, as they cannot hold resources (the API server refuses).
CONTAINER_LISTS = ("initContainers", "containers")
_MAX_SEARCH_DEPTH = 12


class PodSpecRef(NamedTuple):
    """One pod spec inside an object: where it is, its metadata's path, and whether it is a template."""

    spec_path: Path
    metadata_path: Path
    spec: Mapping[str, Any]
    metadata: Mapping[str, Any]
    is_template: bool


class ContainerRef(NamedTuple):
    """One container of a pod spec, with the path a person reads in messages."""

    list_name: str
    position: int
    container: Mapping[str, Any]
    spec_path: Path

    @property
    def name(self) -> str:
        name = self.container.get("name")
        return name if isinstance(name, str) else "?"

    @property
    def is_sidecar(self) -> bool:
        return self.list_name == "initContainers" and self.container.get("restartPolicy") == "Always"

    def where(self) -> str:
        """`spec.template.spec.containers[0] (train)`."""
        return f"{render_path((*self.spec_path, self.list_name))}[{self.position}] ({self.name})"


def mapping(value: Any) -> Mapping[str, Any]:
    """`value` when it is a JSON object, else an empty one: objects from users may hold anything anywhere."""
    return value if isinstance(value, dict) else {}


def string(value: Any) -> str:
    """`value` if it is a string, else "" (a field of another JSON type counts as absent)."""
    return value if type(value) is str else ""


def get(obj: Any, path: Path) -> Any:
    """The value at `path`, or None where any step is missing or of the wrong type."""
    node = obj
    for step in path:
        if type(node) is dict and type(step) is str:  # the usual step, first
            node = node.get(step)
            continue
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                return None
        elif not isinstance(node, dict):
            return None
        node = node[step] if isinstance(step, int) else node.get(step)
    return node


def render_path(path: Sequence[str | int]) -> str:
    """`('spec', 'containers', 0)` -> `spec.containers[0]`."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


def pod_specs(obj: Mapping[str, Any]) -> list[PodSpecRef]:
    """Every pod spec in `obj`: at the fixed place for known kinds, found by shape for other kinds."""
    kind = obj.get("kind")
    if kind == "Pod":  # the usual object, first: its spec and metadata at the top, read without `get`'s loop
        spec, meta = obj.get("spec"), obj.get("metadata")
        if not isinstance(spec, dict):
            return []
        return [PodSpecRef(*KNOWN_KINDS["Pod"], spec, meta if isinstance(meta, dict) else {}, False)]
    if isinstance(kind, str) and kind in KNOWN_KINDS:
        spec_path, meta_path = KNOWN_KINDS[kind]
        spec = get(obj, spec_path)
        if not isinstance(spec, dict):
            return []
        meta = get(obj, meta_path)
        return [PodSpecRef(spec_path, meta_path, spec, meta if isinstance(meta, dict) else {}, kind != "Pod")]
    return list(_search(obj, obj, (), 0))


def _search(root: Mapping[str, Any], node: Any, path: Path, depth: int) -> Iterator[PodSpecRef]:
    """Pod specs nested anywhere in a custom resource: a mapping with a `containers` list of mappings."""
    if depth > _MAX_SEARCH_DEPTH:
        return
    if isinstance(node, dict):
        containers = node.get("containers")
        if depth > 0 and isinstance(containers, list) and all(isinstance(c, dict) for c in containers):
            meta_path = (*path[:-1], "metadata") if path and path[-1] == "spec" else (*path, "metadata")
            meta = get(root, meta_path)
            yield PodSpecRef(path, meta_path, node, meta if isinstance(meta, dict) else {}, True)
            return
        for key, value in node.items():
            if isinstance(key, str) and key not in ("metadata", "status"):
                yield from _search(root, value, (*path, key), depth + 1)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _search(root, item, (*path, index), depth + 1)


def containers(ref: PodSpecRef) -> list[ContainerRef]:
    """Init containers, then containers, in declaration order."""
    out: list[ContainerRef] = []
    for list_name in CONTAINER_LISTS:
        items = ref.spec.get(list_name)
        if isinstance(items, list):
            for i, c in enumerate(items):
                if isinstance(c, dict):
                    out.append(ContainerRef(list_name, i, c, ref.spec_path))
    return out


def effective_count(per_container: list[tuple[ContainerRef, int]]) -> int:
    """The pod's need for one resource, as the scheduler computes it (component-helpers, KEP-753).

    max(sum of regular containers + all sidecars, max over init containers i of (init_i + sidecars declared
    before i)). A sidecar (restartable init container) keeps running, so it adds to everything after it.
    """
    sidecars = 0
    init_peak = 0
    regular = 0
    for ref, count in per_container:
        if ref.list_name == "initContainers":
            if ref.is_sidecar:
                sidecars += count
                init_peak = max(init_peak, sidecars)
            else:
                init_peak = max(init_peak, count + sidecars)
        elif ref.list_name == "containers":
            regular += count
    return max(regular + sidecars, init_peak)


_SPEC_SHAPES: tuple[tuple[str, type, str], ...] = (
    ("nodeSelector", dict, "a mapping"),
    ("tolerations", list, "a list"),
    ("containers", list, "a list"),
    ("initContainers", list, "a list"),
    ("affinity", dict, "a mapping"),
)
_META_STRINGS = ("name", "namespace", "generateName")
_META_SHAPES: tuple[tuple[str, type, str], ...] = (("labels", dict, "a mapping"), ("annotations", dict, "a mapping"))


def shape_problems(obj: Mapping[str, Any]) -> list[str]:
    """Fields the engine reads or writes that hold the wrong JSON type (`spec.nodeSelector must be a mapping`).

    The API server refuses such bodies before admission; `check` reads files by hand and reports them instead.
    """
    problems = []
    metadata = obj.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        problems.append("metadata must be a mapping")
    for name in _META_STRINGS:
        value = mapping(metadata).get(name)
        if value is not None and not isinstance(value, str):
            problems.append(f"metadata.{name} must be a string, got {type(value).__name__}")
    for ref in pod_specs(obj):
        for name, kind, words in _SPEC_SHAPES:
            value = ref.spec.get(name)
            if value is not None and not isinstance(value, kind):
                problems.append(f"{render_path((*ref.spec_path, name))} must be {words}, got {type(value).__name__}")
        meta = get(obj, ref.metadata_path)
        for name, kind, words in _META_SHAPES:
            value = meta.get(name) if isinstance(meta, dict) else None
            where = render_path((*ref.metadata_path, name))
            if value is not None and not isinstance(value, kind):
                problems.append(f"{where} must be {words}, got {type(value).__name__}")
            for key, item in mapping(value).items():
                if not isinstance(item, str):  # `gpu: 1` unquoted in YAML: the API server wants a string
                    problems.append(f"{where}[{key}] must be a string (quote it), got {type(item).__name__}")
    return problems
