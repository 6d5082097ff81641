"""The DRA part of the rule-file model: which DeviceClasses hand out GPUs and what a claim may ask of them.

Read from the merged, schema-checked `spec` by `webhook.policy.rules`:

    gpuDeviceClasses: [gpu.nvidia.com]      # a GPU class with no limits of its own
    dra:
      deviceClasses:
        gpu.nvidia.com: {maxDevices: 8}
        mig.nvidia.com: {maxDevices: 7, allowAllocationModeAll: false}
      adminAccessNamespaces: [gpu-monitoring]
    namespaces:
      team-a:
        dra: {deviceClasses: [mig.nvidia.com], maxDevices: 2, allowAllocationModeAll: false}

and, per class axis value, `deviceSelectors: {gpu.nvidia.com: <CEL>}` (kept on the value's `Contribution`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Fail = Callable[[tuple[str, ...], str], Exception]


@dataclass(frozen=True)
class DeviceClassRule:
    """One GPU DeviceClass: the most devices a claim may ask of it, and whether `allocationMode: All` is allowed."""

    name: str
    max_devices: int | None = None
    allow_all: bool = False
    classes: bool = True  # the class map (axes) applies: its maxGPUsPerPod and deviceSelectors


@dataclass(frozen=True)
class NamespaceDRA:
    """A namespace's DRA limits: the GPU DeviceClasses it may use (None: any), its device maximum, `All`."""

    device_classes: tuple[str, ...] | None = None
    max_devices: int | None = None
    allow_all: bool = False


@dataclass(frozen=True)
class DRARules:
    """The GPU DeviceClasses by name, and the namespaces (besides the exempt ones) that may use adminAccess."""

    device_classes: Mapping[str, DeviceClassRule] = field(default_factory=dict)
    admin_access_namespaces: frozenset[str] = frozenset()

    def is_gpu_class(self, name: str) -> bool:
        return name in self.device_classes

    def is_classed(self, name: str) -> bool:
        """A GPU DeviceClass the class map places (`classes: true`, the default)."""
        found = self.device_classes.get(name)
        return found is not None and found.classes


def dra_rules(spec: Mapping[str, Any]) -> DRARules:
    """The DRA rules of a merged spec (its shape already checked against the schema)."""
    dra = spec.get("dra") or {}
    classes: dict[str, DeviceClassRule] = {name: DeviceClassRule(name) for name in spec.get("gpuDeviceClasses") or ()}
    for name, body in (dra.get("deviceClasses") or {}).items():
        body = body or {}
        classes[name] = DeviceClassRule(name, body.get("maxDevices"), bool(body.get("allowAllocationModeAll", False)),
                                        bool(body.get("classes", True)))
    return DRARules(classes, frozenset(dra.get("adminAccessNamespaces") or ()))


def namespace_dra(body: Mapping[str, Any], rules: DRARules, where: tuple[str, ...], fail: Fail) -> NamespaceDRA:
    """A namespace entry's `dra`, refusing a DeviceClass the rules do not count as a GPU class."""
    dra = body.get("dra") or {}
    listed = dra.get("deviceClasses")
    for index, name in enumerate(listed or ()):
        if not rules.is_gpu_class(name):
            known = ", ".join(sorted(rules.device_classes)) or "(none)"
            raise fail((*where, "dra", "deviceClasses", str(index)),
                       f'"{name}" is not a GPU DeviceClass of the rules (gpuDeviceClasses or dra.deviceClasses: '
                       f"{known}); add it there, or remove it here")
    return NamespaceDRA(tuple(listed) if listed is not None else None, dra.get("maxDevices"),
                        bool(dra.get("allowAllocationModeAll", False)))


def check_selectors(selectors: Mapping[str, str], rules: DRARules, where: tuple[str, ...], fail: Fail) -> None:
    """An axis value's `deviceSelectors` must name GPU DeviceClasses (a selector on another class is never used)."""
    for name in selectors:
        if not rules.is_gpu_class(name):
            known = ", ".join(sorted(rules.device_classes)) or "(none)"
            raise fail((*where, "deviceSelectors", name),
                       f'"{name}" is not a GPU DeviceClass of the rules (gpuDeviceClasses or dra.deviceClasses: '
                       f"{known}); add it there, or remove this selector")
