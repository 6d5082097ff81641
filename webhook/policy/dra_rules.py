"""The DRA part of the rule-file model: which DeviceClasses hand out GPUs and what a claim may ask of them.

Read from the merged, schema-checked `spec` by `webhook.policy.rules`:

    gpuDeviceClasses: [gpu.nvidia.com]      # a GPU class with no limits of its own
    dra:
      deviceClasses:
        gpu.nvidia.com: {maxDevices: 8}
        mig.nvidia.com: {maxDevices: 7, allowAllocationModeAll: false}
        mig-1g-12gb.gpu.nvidia.com: {extendedResourceName: nvidia.com/mig-1g.12gb}   # as the DeviceClass maps it
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
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"  # k8s.io/api@v0.36.3 resource/v1/types.go:49


@dataclass(frozen=True)
class DeviceClassRule:
    """One GPU DeviceClass: the most devices a claim may ask of it, and whether `allocationMode: All` is allowed."""

    name: str
    max_devices: int | None = None
    allow_all: bool = False
    classes: bool = True  # the class map (axes) applies: its maxGPUsPerPod and deviceSelectors
    extended_resource_name: str | None = None  # the DeviceClass's spec.extendedResourceName (KEP-5004)


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
    mapped: Mapping[str, str] = field(default_factory=dict)  # extendedResourceName -> its GPU DeviceClass

    def is_gpu_class(self, name: str) -> bool:
        return name in self.device_classes

    def class_of_resource(self, name: str) -> str | None:
        """The GPU DeviceClass whose devices kube-scheduler hands out for a container resource (KEP-5004): the one
        its implicit name `deviceclass.resource.kubernetes.io/<class>` names, or the one mapping it by
        `extendedResourceName`; None for any other name."""
        if name.startswith(IMPLICIT_PREFIX):
            device_class = name[len(IMPLICIT_PREFIX):]
            return device_class if device_class in self.device_classes else None
        return self.mapped.get(name)

    def is_classed(self, name: str) -> bool:
        """A GPU DeviceClass the class map places (`classes: true`, the default)."""
        found = self.device_classes.get(name)
        return found is not None and found.classes


def dra_rules(spec: Mapping[str, Any], fail: Fail) -> DRARules:
    """The DRA rules of a merged spec (its shape already checked against the schema): an `extendedResourceName`
    must be one the API server takes for a DeviceClass (an extended resource name, outside `kubernetes.io/`:
    k8s.io/kubernetes@v1.36.3 pkg/apis/resource/validation/validation.go:596), mapped by one class only."""
    dra = spec.get("dra") or {}
    classes: dict[str, DeviceClassRule] = {name: DeviceClassRule(name) for name in spec.get("gpuDeviceClasses") or ()}
    mapped: dict[str, str] = {}
    for name, body in (dra.get("deviceClasses") or {}).items():
        body = body or {}
        extended = body.get("extendedResourceName")
        where = ("spec", "dra", "deviceClasses", name, "extendedResourceName")
        if extended is not None and "kubernetes.io/" in extended:
            raise fail(where, f'"{extended}" is in the kubernetes.io namespace, which a DeviceClass may not map (the '
                       f"API server refuses it); every class already has {IMPLICIT_PREFIX}{name}: remove this, or "
                       "use a name of your own domain (example.com/gpu)")
        if extended is not None and extended in mapped:
            raise fail(where, f'"{extended}" is already mapped by DeviceClass {mapped[extended]}; kube-scheduler '
                       "serves a name from one class only (the newest): map it once")
        if extended is not None:
            mapped[extended] = name
        classes[name] = DeviceClassRule(name, body.get("maxDevices"), bool(body.get("allowAllocationModeAll", False)),
                                        bool(body.get("classes", True)), extended)
    return DRARules(classes, frozenset(dra.get("adminAccessNamespaces") or ()), mapped)


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
