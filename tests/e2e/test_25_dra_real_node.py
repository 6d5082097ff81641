"""Scenario 25: DRA on the real node (tests/e2e/realnode.py): a claim template the webhook placed by class is
allocated by the real scheduler from a ResourceSlice a real DRA kubelet plugin published, prepared by that plugin
through the real kubelet, and the Pod runs.

The plugin is `gpu-dra-plugin-standin` (tests/e2e/dra, built by tests/e2e/build_dra_plugin.sh), a STAND-IN for
NVIDIA's DRA driver: it is built on k8s.io/dynamic-resource-allocation (kubeletplugin, resourceslice) at the
suite's release and publishes devices under driver `gpu.nvidia.com` shaped like NVIDIA's full GPUs (type, uuid,
productName, architecture, versions, memory), but it needs no GPU: the devices are made up and preparing a claim
writes a CDI spec that only sets environment variables naming the device. What NVIDIA's driver adds on a real GPU
(device nodes, MIG, sharing config) is in docs/dra.md.

The real node runs containerd 2.x here (tests/e2e/build_containerd.sh, CDI on, reading the node's CDI directory):
Debian's containerd 1.6, which the other real-node tests use, has no CDI and drops the devices the kubelet passes.
Needs root, like every real-node test; one real node per machine at a time.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import GPU, HERE, Cluster, Proc, spawn, wait_until, yaml_of
from realnode import CUDA_IMAGE, GPU_UUIDS, NODE_NAME, RealNode
from test_20_real_node import doctor

pytestmark = pytest.mark.e2e
# The real node runs containerd 2.x (build_containerd.sh): Debian's 1.6 has no CDI and would drop the plugin's devices.
REAL_NODE_CDI = True

DRIVER = "gpu.nvidia.com"  # NVIDIA's driver name, which the stand-in publishes under
DEVICE_CLASS = "gpu.nvidia.com"  # NVIDIA's chart's class, with its selector
CLASS_SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
T4 = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("t4")'
A100 = 'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("a100")'
# Two T4s (the real node's class, and the packaged rules' default), as NVML would name them.
GPUS = [{"name": f"gpu-{i}", "productName": "Tesla T4", "architecture": "Turing", "brand": "Nvidia",
         "uuid": GPU_UUIDS[i], "memory": "15360Mi", "cudaComputeCapability": "7.5.0"} for i in range(2)]


def _plugin_binary() -> Path:
    done = subprocess.run(["bash", str(HERE / "build_dra_plugin.sh")], capture_output=True, text=True, check=False,
                          timeout=1800)
    assert done.returncode == 0, f"build_dra_plugin.sh failed (the stand-in DRA plugin):\n{done.stdout}{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1]) / "gpu-dra-plugin-standin"


def _slices(cluster: Cluster) -> list[dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    return [s for s in items if s["spec"].get("driver") == DRIVER and s["spec"].get("nodeName") == NODE_NAME]


class Plugin:
    """The stand-in DRA plugin on the real node: started, stopped and restarted by the tests."""

    def __init__(self, binary: Path, cluster: Cluster, node: RealNode) -> None:
        self.binary, self.cluster, self.node = binary, cluster, node
        self.proc: Proc | None = None
        kubelet = node.workdir / "kubelet"  # the kubelet's --root-dir: plugins_registry and plugins are under it
        self.registrar_dir = kubelet / "plugins_registry"
        self.data_dir = kubelet / "plugins" / DRIVER
        self.cdi_dir = node.cdi_dir

    def start(self) -> None:
        self.proc = spawn("gpu-dra-plugin-standin", [
            str(self.binary), f"--kubeconfig={self.cluster.kubeconfig}", f"--node-name={NODE_NAME}",
            f"--registrar-dir={self.registrar_dir}", f"--plugin-data-dir={self.data_dir}",
            f"--cdi-dir={self.cdi_dir}", f"--devices={json.dumps(GPUS)}", "--v=3",
        ], self.node.logdir)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def log(self) -> str:
        return self.proc.log.read_text() if self.proc is not None else ""

    def specs(self) -> dict[str, str]:
        """The CDI specs the plugin has written (prepared claims), by file name."""
        return {p.name: p.read_text() for p in sorted(self.cdi_dir.glob("*.json"))}


@pytest.fixture(scope="module")
def dra_plugin(cluster: Cluster, real_node: RealNode) -> Iterator[Plugin]:
    """The stand-in plugin running, NVIDIA's DeviceClass created, and the plugin's ResourceSlice published."""
    plugin = Plugin(_plugin_binary(), cluster, real_node)
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DEVICE_CLASS},
                    "spec": {"selectors": [{"cel": {"expression": CLASS_SELECTOR}}]}}
    cluster.kubectl("apply", "-f", "-", input=yaml_of(device_class))
    plugin.start()
    try:
        def published() -> list[dict[str, Any]]:
            assert plugin.proc is not None and plugin.proc.alive(), f"the stand-in exited:\n{plugin.log()}"
            return _slices(cluster)

        wait_until(published, 90, f"the stand-in DRA plugin's ResourceSlice for {NODE_NAME}", interval=1)
        yield plugin
    finally:
        plugin.stop()
        cluster.kubectl("delete", "deviceclass", DEVICE_CLASS, "--ignore-not-found", check=False)
        for left in _slices(cluster):  # the plugin leaves its slice behind when it stops (the node GC would not yet)
            cluster.kubectl("delete", "resourceslice", left["metadata"]["name"], "--ignore-not-found", check=False)


def _template(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}}}


def _pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [{"name": "cuda", "image": CUDA_IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "env | sort; exec sleep 3600"],
                        "resources": {"claims": [{"name": "gpu"}]}}]}}


def _create(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Create `obj`; (the stored object, kubectl's stderr: the admission warnings)."""
    done = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=yaml_of(obj))
    return dict(json.loads(done.stdout)), done.stderr


def _selectors(template: dict[str, Any]) -> list[str]:
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    return [s["cel"]["expression"] for s in exactly.get("selectors", [])]


def _get(cluster: Cluster, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    done = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return dict(json.loads(done.stdout)) if done.returncode == 0 else None


def _claim_of(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any]:
    """The ResourceClaim the controller made from the Pod's template."""
    def made() -> dict[str, Any] | None:
        statuses = (_get(cluster, namespace, "pod", pod) or {}).get("status", {}).get("resourceClaimStatuses", [])
        name = next((s.get("resourceClaimName") for s in statuses if s.get("name") == "gpu"), None)
        return _get(cluster, namespace, "resourceclaim", name) if name else None
    return dict(wait_until(made, 60, f"the ResourceClaim of {namespace}/{pod}", interval=0.5))


def _running(cluster: Cluster, namespace: str, pod: str, plugin: Plugin, node: RealNode) -> dict[str, Any]:
    def up() -> dict[str, Any] | None:
        got = _get(cluster, namespace, "pod", pod) or {}
        phase = got.get("status", {}).get("phase")
        assert phase not in ("Failed", "Succeeded"), json.dumps(got.get("status"), indent=1)
        return got if phase == "Running" else None
    try:
        return dict(wait_until(up, 120, f"{namespace}/{pod} to run", interval=0.5))
    except (TimeoutError, AssertionError) as exc:
        events = cluster.kubectl("get", "events", "-n", namespace, check=False).stdout
        raise AssertionError(f"{exc}\nevents:\n{events}\nplugin log:\n{plugin.log()[-4000:]}\n"
                             f"{node.logs()[-6000:]}") from exc


def _allocated(claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return [(r["driver"], r["pool"], r["device"]) for r in results]


def test_the_plugin_publishes_nvidia_shaped_devices(cluster: Cluster, dra_plugin: Plugin) -> None:
    """The stand-in registered with the kubelet (its socket in plugins_registry) and published one slice of its node
    with NVIDIA's full-GPU attributes and memory capacity."""
    assert any(dra_plugin.registrar_dir.glob(f"{DRIVER}*.sock")), sorted(dra_plugin.registrar_dir.iterdir())
    (published,) = _slices(cluster)
    assert published["spec"]["pool"]["name"] == NODE_NAME
    devices = {d["name"]: d for d in published["spec"]["devices"]}
    assert sorted(devices) == ["gpu-0", "gpu-1"]
    gpu0 = devices["gpu-0"]
    assert gpu0["attributes"] == {
        "type": {"string": "gpu"}, "uuid": {"string": GPU_UUIDS[0]}, "productName": {"string": "Tesla T4"},
        "brand": {"string": "Nvidia"}, "architecture": {"string": "Turing"},
        "driverVersion": {"version": "580.159.4"}, "cudaDriverVersion": {"version": "13.0.0"},
        "cudaComputeCapability": {"version": "7.5.0"}}
    assert gpu0["capacity"] == {"memory": {"value": "15Gi"}}


def test_a_template_placed_by_class_runs_on_the_allocated_device(cluster: Cluster, namespace: str,
                                                                real_node: RealNode, dra_plugin: Plugin) -> None:
    """The webhook gives the template the default class's (t4) selector; the scheduler allocates a stand-in T4, the
    plugin prepares the claim (its CDI spec names the device), the Pod runs with the device in its environment;
    deleting the Pod unprepares the claim and frees the device."""
    template, _ = _create(cluster, namespace, _template("one-gpu"))
    assert _selectors(template) == [T4]
    _create(cluster, namespace, _pod("dra-t4", "one-gpu"))
    pod = _running(cluster, namespace, "dra-t4", dra_plugin, real_node)
    assert pod["spec"]["nodeName"] == NODE_NAME
    claim = _claim_of(cluster, namespace, "dra-t4")
    ((driver, pool, device),) = _allocated(claim)
    assert (driver, pool) == (DRIVER, NODE_NAME) and device in ("gpu-0", "gpu-1"), _allocated(claim)
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["dra-t4"]
    uuid = GPU_UUIDS[int(device[-1])]
    variable = f"DRA_STANDIN_{device.upper().replace('-', '_')}_UUID={uuid}"

    # Prepared by the plugin, through the kubelet: the CDI spec of this claim, and the plugin's log line.
    spec_name = f"{DRIVER}-standin-{claim['metadata']['uid']}.json"
    specs = dra_plugin.specs()
    assert spec_name in specs, f"no CDI spec for the claim in {dra_plugin.cdi_dir}: {sorted(specs)}"
    spec = json.loads(specs[spec_name])
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{claim['metadata']['uid']}-{device}"]
    assert variable in spec["devices"][0]["containerEdits"]["env"]
    assert f"uid=\"{claim['metadata']['uid']}\"" in dra_plugin.log()

    # The container runtime applied the CDI spec: the container's environment names the allocated device.
    log = str(wait_until(lambda: cluster.kubectl("logs", "dra-t4", "-n", namespace).stdout, 30, "the Pod's log"))
    print(f"container log of {namespace}/dra-t4:\n{log}")
    assert variable in log.splitlines(), f"{variable} is not in the container's environment:\n{log}"
    assert f"DRA_STANDIN_{device.upper().replace('-', '_')}_CLAIM={namespace}/{claim['metadata']['name']}/gpu" in log

    cluster.kubectl("delete", "pod", "dra-t4", "-n", namespace, "--wait=true", timeout=120)
    wait_until(lambda: spec_name not in dra_plugin.specs(), 60, "the plugin to unprepare the claim (CDI spec gone)")
    wait_until(lambda: _get(cluster, namespace, "resourceclaim", claim["metadata"]["name"]) is None, 60,
               "the Pod's claim to be deleted with it")


def test_a_class_selector_no_device_matches_stays_pending(cluster: Cluster, namespace: str,
                                                          dra_plugin: Plugin) -> None:
    """A template labelled gpu-type a100 gets the a100 selector; no stand-in device is an A100, so the scheduler
    cannot allocate the claim and the Pod stays Pending. The webhook warns at the template's create
    (`dra-unsatisfiable`, from the ResourceSlice the plugin published), and the scheduler's condition agrees."""
    template, template_warnings = _create(cluster, namespace, _template("a100", {"gpu-webhook.io/gpu-type": "a100"}))
    assert _selectors(template) == [A100]
    _, pod_warnings = _create(cluster, namespace, _pod("dra-a100", "a100"))
    print(f"admission warnings: template {template_warnings!r}, pod {pod_warnings!r}")
    assert "[dra-unsatisfiable]" in template_warnings and "ResourceClaimTemplate \"a100\"" in template_warnings
    assert "change the selector or the claim's class label" in template_warnings  # the fix survives the cut

    def unschedulable() -> str | None:
        pod = _get(cluster, namespace, "pod", "dra-a100") or {}
        for c in pod.get("status", {}).get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                return str(c.get("message", ""))
        return None

    message = str(wait_until(unschedulable, 60, "the scheduler to mark the Pod Unschedulable", interval=1))
    print(f"PodScheduled=False Unschedulable: {message}")
    assert "cannot allocate all claims" in message, message
    pod = _get(cluster, namespace, "pod", "dra-a100") or {}
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert _allocated(_claim_of(cluster, namespace, "dra-a100")) == []


def test_a_claim_prepared_while_the_plugin_is_down_is_unprepared_when_it_comes_back(
        cluster: Cluster, namespace: str, real_node: RealNode, dra_plugin: Plugin) -> None:
    """Part 4's fault case: the plugin stops while a claim is prepared and the Pod is deleted; the kubelet cannot
    unprepare it (the CDI spec stays, the Pod is not gone). Restarted, the plugin unprepares it, the Pod and its claim
    go, and the device is free again: a new Pod is allocated and runs."""
    _create(cluster, namespace, _template("one-gpu"))
    _create(cluster, namespace, _pod("before", "one-gpu"))
    _running(cluster, namespace, "before", dra_plugin, real_node)
    claim = _claim_of(cluster, namespace, "before")
    spec_name = f"{DRIVER}-standin-{claim['metadata']['uid']}.json"
    assert spec_name in dra_plugin.specs()

    dra_plugin.stop()
    cluster.kubectl("delete", "pod", "before", "-n", namespace, "--wait=false")
    time.sleep(15)  # the kubelet stops the container and tries to unprepare, without a plugin to ask
    assert spec_name in dra_plugin.specs(), "the claim was unprepared without the plugin"
    still = _get(cluster, namespace, "pod", "before")
    kept = _get(cluster, namespace, "resourceclaim", claim["metadata"]["name"]) is not None
    print(f"plugin down: Pod {'still there' if still else 'gone'}; claim {'kept' if kept else 'gone'}")
    assert still is not None and still["metadata"].get("deletionTimestamp"), "the Pod went before it was unprepared"

    dra_plugin.start()
    wait_until(lambda: spec_name not in dra_plugin.specs(), 90, "the restarted plugin to unprepare the claim")
    wait_until(lambda: _get(cluster, namespace, "pod", "before") is None, 90, "the Pod to go once unprepared")
    wait_until(lambda: _get(cluster, namespace, "resourceclaim", claim["metadata"]["name"]) is None, 60,
               "the Pod's claim to be deleted")
    _create(cluster, namespace, _pod("after", "one-gpu"))
    _running(cluster, namespace, "after", dra_plugin, real_node)
    ((driver, pool, _),) = _allocated(_claim_of(cluster, namespace, "after"))
    assert (driver, pool) == (DRIVER, NODE_NAME)



@contextlib.contextmanager
def _class_maps_the_gpu_resource(cluster: Cluster) -> Iterator[None]:
    """The DeviceClass maps `nvidia.com/gpu` (KEP-5004), as NVIDIA's chart sets it on `gpu.nvidia.com` with the v1
    API; removed again after."""
    cluster.kubectl("patch", "deviceclass", DEVICE_CLASS, "--type=merge", "-p",
                    json.dumps({"spec": {"extendedResourceName": GPU}}))
    try:
        yield
    finally:
        cluster.kubectl("patch", "deviceclass", DEVICE_CLASS, "--type=json", "-p",
                        json.dumps([{"op": "remove", "path": "/spec/extendedResourceName"}]), check=False)


def _plain_pod(name: str, gpus: int, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """The seed's cuda-gpu-test as a user writes it (`limits: nvidia.com/gpu`, no claim), printing its environment."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "cuda", "image": CUDA_IMAGE, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "env | sort; exec sleep 3600"],
                        "resources": {"limits": {GPU: str(gpus)}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_the_seeds_plain_pod_runs_on_a_dra_device_by_the_class_extended_resource(
        cluster: Cluster, namespace: str, real_node: RealNode, dra_plugin: Plugin) -> None:
    """Part 3 (KEP-5004, beta and on in 1.36): the DeviceClass maps `nvidia.com/gpu`, the real node runs no device
    plugin, and the seed's plain Pod is placed by the webhook's class as ever (nodeSelector, toleration, runtime
    class); the real scheduler makes the Pod's extended-resource claim and allocates a stand-in device, the plugin
    prepares it, and the container's environment names that device only: the NVIDIA Container Runtime (the class's
    runtimeClassName) injects none of the node's GPUs, because the claim's CDI spec sets NVIDIA_VISIBLE_DEVICES=void
    over the CUDA image's `all`, as NVIDIA's driver does."""
    real_node.stop_device_plugin()
    assert real_node.gpus()[1] in (None, "0"), f"a device plugin advertises {GPU}: {real_node.gpus()}"
    with _class_maps_the_gpu_resource(cluster):
        stored, warnings = _create(cluster, namespace, _plain_pod("seed-on-dra", 1))
        assert stored["spec"]["nodeSelector"] == {"workload": "inference", "gpu-type": "t4"}
        assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in stored["spec"]["tolerations"]
        assert stored["spec"]["runtimeClassName"] == "nvidia"
        assert "gpu-webhook" not in warnings, warnings
        pod = _running(cluster, namespace, "seed-on-dra", dra_plugin, real_node)
        assert pod["spec"]["nodeName"] == NODE_NAME

        extended = pod["status"]["extendedResourceClaimStatus"]
        assert extended["requestMappings"] == [
            {"containerName": "cuda", "requestName": "container-0-request-0", "resourceName": GPU}]
        claim = _get(cluster, namespace, "resourceclaim", extended["resourceClaimName"])
        assert claim is not None, extended
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        assert [o["name"] for o in claim["metadata"]["ownerReferences"]] == ["seed-on-dra"]
        ((driver, pool, device),) = _allocated(claim)
        assert (driver, pool) == (DRIVER, NODE_NAME), _allocated(claim)
        spec_name = f"{DRIVER}-standin-{claim['metadata']['uid']}.json"
        assert spec_name in dra_plugin.specs()

        log = str(wait_until(lambda: cluster.kubectl("logs", "seed-on-dra", "-n", namespace).stdout, 30, "the log"))
        print(f"container log of {namespace}/seed-on-dra:\n{log}")
        lines = log.splitlines()
        prefix = f"DRA_STANDIN_{device.upper().replace('-', '_')}"
        assert f"{prefix}_UUID={GPU_UUIDS[int(device[-1])]}" in lines
        assert f"{prefix}_CLAIM={namespace}/{claim['metadata']['name']}/container-0-request-0" in lines
        assert len([line for line in lines if line.startswith("DRA_STANDIN_") and "_UUID=" in line]) == 1
        assert "NVIDIA_VISIBLE_DEVICES=void" in lines
        leaked = [line for line in lines if line.startswith("NVIDIA_STANDIN_GPU_")]
        assert leaked == [], f"the NVIDIA runtime injected GPUs the scheduler did not allocate: {leaked}"

        # The kwok nodes' device plugins advertise nvidia.com/gpu; on the real node DRA serves it.
        _, report = doctor(cluster, namespace, "seed-on-dra")
        matching = next(s for s in report["steps"] if s["step"] == "Matching nodes")  # type: ignore[attr-defined]
        assert matching["summary"] == f"1 node(s) match; 1 have enough free GPUs now: {NODE_NAME}", matching
        assert f"{NODE_NAME}: 2 {GPU} through DRA, 2 free" in matching["evidence"], matching

        cluster.kubectl("delete", "pod", "seed-on-dra", "-n", namespace, "--wait=true", timeout=120)
        wait_until(lambda: spec_name not in dra_plugin.specs(), 60, "the plugin to unprepare the claim")
        wait_until(lambda: _get(cluster, namespace, "resourceclaim", claim["metadata"]["name"]) is None, 60,
                   "the extended-resource claim to be deleted with its Pod")


def test_the_webhook_counts_the_dra_devices_that_serve_the_gpu_resource(
        cluster: Cluster, namespace: str, real_node: RealNode, dra_plugin: Plugin) -> None:
    """With no device plugin on the node the Pod pins itself to, the webhook counts the DeviceClass's devices there
    (the stand-in's two): one GPU is admitted without the class-no-node warning it gave before it read the mapping,
    three are refused as never schedulable, naming the node's DRA devices."""
    real_node.stop_device_plugin()
    pinned = {"kubernetes.io/hostname": NODE_NAME}
    without = cluster.kubectl("create", "-n", namespace, "--dry-run=server", "-f", "-",
                              input=yaml_of(_plain_pod("pinned", 1, pinned))).stderr
    print(f"no mapping yet: {without!r}")
    assert "[gpu-class-no-node]" in without, without
    with _class_maps_the_gpu_resource(cluster):
        def quiet() -> bool:
            done = cluster.kubectl("create", "-n", namespace, "--dry-run=server", "-f", "-",
                                   input=yaml_of(_plain_pod("pinned", 1, pinned)))
            return "[gpu-class-no-node]" not in done.stderr
        wait_until(quiet, 30, "the webhook to read the DeviceClass's extendedResourceName", interval=0.5)
        _, warnings = _create(cluster, namespace, _plain_pod("pinned", 1, pinned))
        assert "gpu-webhook" not in warnings, warnings
        _running(cluster, namespace, "pinned", dra_plugin, real_node)

        done = cluster.kubectl("create", "-n", namespace, "-f", "-", check=False,
                               input=yaml_of(_plain_pod("three", 3, pinned)))
        print(f"three GPUs: {done.stderr}")
        assert done.returncode == 1 and "[gpu-never-schedulable]" in done.stderr, done.stderr
        assert f"offers is 2 ({NODE_NAME}: devices of DeviceClass {DEVICE_CLASS}, through DRA)" in done.stderr
