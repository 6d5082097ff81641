"""GPU resources: which container resource names count as GPUs, and which DeviceClass serves the DRA ones.

A name is a GPU resource when (`find`), in this order:

1. the rule files' `gpuResources` name it: exact names first, then globs, the more specific (more literal
   characters) first, so `nvidia.com/mig-1g.5gb` wins over `nvidia.com/mig-*` whatever the file order;
2. it is `deviceclass.resource.kubernetes.io/<class>` for a GPU DeviceClass of the rules: KEP-5004's implicit
   extended resource, served by kube-scheduler from DRA devices of that class (beta and on in Kubernetes 1.36);
3. it is the `extendedResourceName` a GPU DeviceClass of the rules maps (`dra.deviceClasses.<class>`), which the
   scheduler serves from that class's devices on nodes whose device plugin does not advertise it.

A name of 2 or 3 carries its DeviceClass (`GPUResource.device_class`): the namespace's allowed DeviceClasses and
the DRA maxima apply to it, and the node checks (which read `status.allocatable`) do not, since no Node advertises
DRA devices. Its other fields come from its `gpuResources` entry when it has one; an implicit name without one
takes those of its class's mapped name (the same devices); else it is placed by the class map as its DeviceClass
says (`classes`).

The API server reads the implicit name as a *native* resource (its name holds `kubernetes.io/`:
`k8s.io/kubernetes@v1.36.3` pkg/apis/core/v1/helper/helpers.go:53-63), so it may be overcommitted and need not be
a whole number (pkg/apis/core/validation/validation.go:7548-7560, 7970-7983, 8222-8231; helpers.go in
pkg/apis/core/helper:186-211, 293); kube-scheduler allocates what the container *requests*
(pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go:341-352). `IMPLICIT_PREFIX` names it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from webhook.policy.dra_rules import IMPLICIT_PREFIX, DRARules

Fail = Callable[[tuple[str, ...], str], Exception]


@dataclass(frozen=True)
class GPUResource:
    """An extended resource (or glob of them) that counts as a GPU; `device_class`: the GPU DeviceClass whose DRA
    devices serve it (KEP-5004), for a name found through the DRA rules."""

    pattern: str
    max_per_container: int | None = None
    reason: str | None = None
    classes: bool = True
    valid_for: Mapping[str, frozenset[str]] = field(default_factory=dict)  # axis -> the values it exists on
    device_class: str | None = None

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)

    @property
    def implicit(self) -> bool:
        """KEP-5004's implicit name: the API server lets it be overcommitted and fractional; the rules do not."""
        return self.device_class is not None and self.pattern.startswith(IMPLICIT_PREFIX)


def is_glob(pattern: str) -> bool:
    return "*" in pattern or "?" in pattern


def ordered(resources: Iterable[GPUResource]) -> tuple[GPUResource, ...]:
    """Exact names first, then globs by how many literal characters they hold (most first), else in file order."""
    listed = list(resources)
    return tuple(sorted(listed, key=lambda r: (is_glob(r.pattern), -len(r.pattern.replace("*", "").replace("?", ""))
                                               if is_glob(r.pattern) else 0)))


def find(resources: Sequence[GPUResource], dra: DRARules, name: str) -> GPUResource | None:
    """The GPU resource entry for `name` (`resources` as `ordered` gives them), or None: not a GPU."""
    listed = next((r for r in resources if r.matches(name)), None)
    device_class = dra.class_of_resource(name)
    if device_class is None:
        return listed
    if listed is None and name.startswith(IMPLICIT_PREFIX):
        mapped = dra.device_classes[device_class].extended_resource_name
        listed = next((r for r in resources if r.matches(mapped)), None) if mapped else None
    if listed is None:
        return GPUResource(name, classes=dra.device_classes[device_class].classes, device_class=device_class)
    return replace(listed, pattern=name, device_class=device_class)


def check(resources: Sequence[GPUResource], dra: DRARules, fail: Fail) -> None:
    """What the schema cannot say: an implicit name in `gpuResources` must be of a GPU DeviceClass of the rules."""
    for resource in resources:
        if resource.pattern.startswith(IMPLICIT_PREFIX) and dra.class_of_resource(resource.pattern) is None:
            known = ", ".join(sorted(dra.device_classes)) or "(none)"
            raise fail(("spec", "gpuResources", resource.pattern),
                       f'"{resource.pattern[len(IMPLICIT_PREFIX):]}" is not a GPU DeviceClass of the rules '
                       f"(gpuDeviceClasses or dra.deviceClasses: {known}); add it there, or remove this entry")


def offered(resources: Sequence[GPUResource], axis: str, values: Sequence[str], like: str) -> str:
    """What each value of `axis` offers among the exact resources named like `like` (`nvidia.com/mig-`):
    `a100 offers 1g.5gb, 1g.10gb | t4 offers none`, for a message about a resource no value offers (no "; ":
    a warning keeps what follows its last one, the fix)."""
    parts = []
    for value in values:
        names = [r.pattern for r in resources if not is_glob(r.pattern) and r.pattern.startswith(like)
                 and value in r.valid_for.get(axis, ())]
        shown = ", ".join(n.removeprefix(like) for n in names[:12]) + (f" and {len(names) - 12} more"
                                                                      if len(names) > 12 else "")
        parts.append(f"{value} offers {shown or 'none'}")
    return " | ".join(parts)
