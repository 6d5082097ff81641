"""The container and pod-level GPU checks of a pod spec: quantities, limits, per-container maxima, GPUs in pod-level
resources, and GPU access the scheduler does not count. Findings go to a `Sink` (the engine's collector).

1. per container: GPU quantities parse, are whole and non-negative, are set in limits, and requests equal limits:
   for extended resources the API server's own rules, said earlier and with a fix; for KEP-5004's implicit name
   `deviceclass.resource.kubernetes.io/<class>`, which the API server lets be fractional, requests-only and
   below its limit (`webhook.policy.resources`), the rules' (the count is then what the scheduler allocates: the
   request); per-container maxima;
2. no GPUs in pod-level `spec.resources`;
3. for a spec with no GPU request: GPU env, GPU runtime class or GPU taint toleration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from webhook.policy import pods, quantity
from webhook.policy.pods import ContainerRef, PodSpecRef, render_path
from webhook.policy.resources import GPUResource
from webhook.policy.rules import Policy

NO_GPU_VALUES = frozenset({"void", "none", ""})
GPU_ENV = "NVIDIA_VISIBLE_DEVICES"


class Sink(Protocol):
    """Where findings go: `add(rule, message)` (the engine's collector applies the enforcement level)."""

    def add(self, rule: str, message: str) -> None: ...


class _Discard:
    def add(self, rule: str, message: str) -> None:
        return None


def gpu_requests(policy: Policy, spec: Mapping[str, Any]) -> dict[str, int]:
    """Each GPU resource a Pod's spec holds that Nodes advertise, counted as the scheduler counts it (`doctor`'s
    view of a Pod): not the names DRA devices serve (KEP-5004), which no Node's allocatable holds."""
    ref = PodSpecRef(("spec",), ("metadata",), spec, {}, False)
    counted = check_containers(policy, ref, _Discard())
    return {name: n for name, counts in counted.items()
            if (n := pods.effective_count(counts)) and not is_dra_served(policy, name)}


def is_dra_served(policy: Policy, name: str) -> bool:
    """Whether kube-scheduler may serve `name` from DRA devices (a GPU DeviceClass's implicit or mapped name)."""
    resource = policy.gpu_resource(name)
    return resource is not None and resource.device_class is not None


def check_containers(policy: Policy, ref: PodSpecRef, out: Sink, containers: Sequence[ContainerRef] | None = None
                     ) -> dict[str, list[tuple[ContainerRef, int]]]:
    """Per-container quantity rules; returns, per GPU resource name, each container's valid count. `containers`:
    `pods.containers(ref)`, when the caller has them."""
    per_resource: dict[str, list[tuple[ContainerRef, int]]] = {}
    for cref in pods.containers(ref) if containers is None else containers:
        resources = cref.container.get("resources")
        if not isinstance(resources, dict):
            continue
        limits = pods.mapping(resources.get("limits"))
        requests = pods.mapping(resources.get("requests"))
        for name in {**limits, **requests}:  # the names in limits, then those only in requests
            resource = policy.gpu_resource(name) if isinstance(name, str) else None
            if resource is not None:
                count = _check_quantity(resource, cref, name, limits, requests, out)
                per_resource.setdefault(name, []).append((cref, count))
    return per_resource


def _check_quantity(resource: GPUResource, cref: ContainerRef, name: str, limits: Mapping[str, Any],
                    requests: Mapping[str, Any], out: Sink) -> int:
    """One GPU resource of one container; returns the count it asks for (0 when it is invalid)."""
    values: dict[str, int | None] = {}
    for part, table in (("limits", limits), ("requests", requests)):
        if name in table:
            values[part] = _count(cref, part, name, table[name], out)
    limit, request = values.get("limits"), values.get("requests")
    if "requests" in values and "limits" not in values:
        out.add("gpu-limits-required", _limits_required(resource, cref, name, requests[name]))
        # The API server refuses an extended resource without a limit; the implicit name it keeps, and the
        # scheduler allocates its request.
        return (request or 0) if resource.implicit else 0
    if limit is not None and request is not None and limit != request:
        out.add("gpu-requests-equal-limits", _requests_differ(resource, cref, name, requests[name], limits[name]))
    count = limit if limit is not None else 0
    if resource.implicit and request is not None:
        count = request  # what kube-scheduler allocates (extendeddynamicresources.go:341-352)
    if resource.max_per_container is not None and count > resource.max_per_container:
        why = f" ({resource.reason})" if resource.reason else ""
        out.add("gpu-per-container-max",
                f"{cref.where()}: asks for {count} {name} but a container may have at most {resource.max_per_container}"
                f"{why}; ask for {resource.max_per_container}, or use whole GPUs (nvidia.com/gpu)")
    return count


def _count(cref: ContainerRef, part: str, name: str, raw: Any, out: Sink) -> int | None:
    """One quantity as a whole, non-negative number of GPUs, or None (reported)."""
    try:
        value = quantity.count(raw)
    except quantity.QuantityError as err:
        out.add("gpu-quantity-invalid", f"{_at(cref, part, name)} {err}")
        return None
    if value < 0:
        out.add("gpu-quantity-invalid",
                f'{_at(cref, part, name)} "{quantity.display(raw)}": must be greater than or equal to 0; '
                f"ask for a whole number of GPUs such as 1")
        return None
    if not isinstance(value, int):
        out.add("gpu-whole-number",
                f'{_at(cref, part, name)} "{quantity.display(raw)}": must be an integer; a GPU cannot be split'
                f" this way: ask for whole GPUs, or use a shared (nvidia.com/gpu.shared) or "
                f"MIG (nvidia.com/mig-1g.5gb) resource")
        return None
    return value


def _limits_required(resource: GPUResource, cref: ContainerRef, name: str, raw: Any) -> str:
    move = f"move {name}: {quantity.display(raw)} to resources.limits"
    if resource.implicit:
        return (f"{cref.where()}: {name} is in requests but not in limits; the API server accepts that for a "
                f"DeviceClass's implicit name and kube-scheduler hands out {quantity.display(raw)} "
                f"{resource.device_class} devices, but GPUs are requested in limits here: {move}")
    return f"{cref.where()}: {name} is in requests but not in limits; GPUs are requested in limits: {move}"


def _requests_differ(resource: GPUResource, cref: ContainerRef, name: str, request: Any, limit: Any) -> str:
    if resource.implicit:
        return (f'{cref.where()}: resources.requests[{name}] "{quantity.display(request)}" differs from its limit '
                f'"{quantity.display(limit)}"; kube-scheduler hands out as many {resource.device_class} devices as '
                "the request says, whatever the limit: set requests equal to limits, or remove the request (it "
                "defaults to the limit)")
    return (f'{cref.where()}: resources.requests: Invalid value: "{quantity.display(request)}": '
            f"must be equal to {name} limit of {quantity.display(limit)}; set requests equal to limits, "
            f"or remove the request (it defaults to the limit)")


def _at(cref: ContainerRef, part: str, name: str) -> str:
    return f"{cref.where()}: resources.{part}[{name}]: Invalid value:"


def check_pod_level(policy: Policy, ref: PodSpecRef, out: Sink) -> None:
    resources = ref.spec.get("resources")
    if not isinstance(resources, dict):
        return
    for part in ("limits", "requests"):
        table = resources.get(part)
        if not isinstance(table, dict):
            continue
        for name in table:
            if isinstance(name, str) and policy.gpu_resource(name):
                out.add("gpu-pod-level-resources",
                        f"{render_path((*ref.spec_path, 'resources', part))}[{name}]: GPUs cannot be set in pod-level "
                        "resources (only cpu, memory and hugepages can); move it to each container's "
                        "resources.limits")


def check_unaccounted_access(policy: Policy, ref: PodSpecRef, out: Sink,
                             containers: Sequence[ContainerRef] | None = None) -> None:
    """A spec with no GPU request that can still reach GPUs, or sits on GPU nodes for nothing. `containers`:
    `pods.containers(ref)`, when the caller has them."""
    for cref in pods.containers(ref) if containers is None else containers:
        env = cref.container.get("env")
        for var in env if isinstance(env, list) else []:
            if isinstance(var, dict) and var.get("name") == GPU_ENV and "value" in var:
                value = str(var.get("value") or "")
                if value.strip().lower() not in NO_GPU_VALUES:
                    out.add("gpu-env-without-request",
                            f"{cref.where()}: {GPU_ENV}={value} reaches GPUs the scheduler does not count; "
                            "request nvidia.com/gpu in limits")
    runtime = ref.spec.get("runtimeClassName")
    if isinstance(runtime, str) and runtime in policy.gpu_runtime_classes:
        out.add("gpu-runtime-without-request",
                f"{render_path((*ref.spec_path, 'runtimeClassName'))}={runtime} without a GPU request; "
                "request nvidia.com/gpu in limits or drop it")
    tolerations = ref.spec.get("tolerations")
    taint_keys = policy.gpu_taint_keys
    for tol in tolerations if isinstance(tolerations, list) else []:
        key = tol.get("key") if isinstance(tol, dict) else None
        if isinstance(key, str) and key in taint_keys and tol.get("effect") in (None, "", "NoSchedule"):
            out.add("gpu-toleration-without-request",
                    f"{render_path((*ref.spec_path, 'tolerations'))}: tolerates {tol.get('key')} with no GPU "
                    "request (it may hold a GPU node); drop it or request a GPU")
            break
