"""The seed's GPU journey on a real node (tests/e2e/realnode.py): a real kubelet on containerd, the STAND-IN device
plugin speaking the kubelet's v1beta1 API, the real NVIDIA Container Runtime in CDI mode with a STAND-IN CDI spec,
and the webhook deciding where the seed's Pod goes.

Needs root, containerd, runc and the CNI plugins (tests/e2e/build_node.sh installs them); it fails, never skips,
where they are missing. One real node per machine at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cluster import GPU, Cluster, CreateLoop, events_for, pod_json, wait_until, yaml_of
from realnode import GPU_UUIDS, NODE_NAME, RealNode
from test_01_placement import CUDA_GPU_TEST  # the seed's Pod, as the seed writes it

pytestmark = pytest.mark.e2e


def doctor(cluster: Cluster, namespace: str, pod: str) -> tuple[int, dict[str, object]]:
    """`gpu-webhook doctor POD -o json` against the cluster: (exit code, report)."""
    done = subprocess.run([sys.executable, "-m", "webhook", "doctor", pod, "-n", namespace, "-o", "json"],
                          capture_output=True, text=True, env=cluster.env(), timeout=120)
    print(f"doctor {namespace}/{pod} exit {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}


def _phase(cluster: Cluster, namespace: str, name: str) -> str:
    return str(pod_json(cluster, namespace, name).get("status", {}).get("phase", ""))


def _finished(cluster: Cluster, namespace: str, name: str, timeout: float = 90) -> str:
    return str(wait_until(lambda: _phase(cluster, namespace, name) in ("Succeeded", "Failed")
                          and _phase(cluster, namespace, name), timeout, f"pod {namespace}/{name} to finish"))


def _shell_pod(name: str, script: str, gpus: int = 1, runtime_class: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {
        "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                        "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", script],
                        "resources": {"limits": {GPU: str(gpus)}} if gpus else {}}],
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_device_plugin_before_and_after(cluster: Cluster, real_node: RealNode) -> None:
    """Before the plugin: no nvidia.com/gpu; after: N; an Unhealthy device leaves allocatable; stopped: 0."""
    real_node.stop_device_plugin()
    wait_until(lambda: real_node.gpus()[1] in (None, "0"), 60, "no allocatable GPU before the plugin runs")
    before = real_node.gpus()
    real_node.start_device_plugin(uuids=GPU_UUIDS[:4])
    wait_until(lambda: real_node.gpus() == ("4", "4"), 60, "nvidia.com/gpu: 4 after the plugin registers")
    assert before[1] in (None, "0")

    real_node.unhealthy_file.write_text(GPU_UUIDS[2] + "\n")
    wait_until(lambda: real_node.gpus() == ("4", "3"), 60, "an Unhealthy device to leave allocatable")
    real_node.unhealthy_file.write_text("")
    wait_until(lambda: real_node.gpus() == ("4", "4"), 60, "the device to come back when Healthy")

    real_node.stop_device_plugin()
    wait_until(lambda: real_node.gpus()[1] == "0", 60, "allocatable to drop to 0 once the plugin stops")


def test_allocate_env_reaches_the_container(cluster: Cluster, real_node: RealNode, namespace: str) -> None:
    """The plugin's Allocate sets NVIDIA_VISIBLE_DEVICES=<uuid> and the container gets it. The Pod runs in a namespace
    the webhook ignores, so it keeps plain runc: through the nvidia handler the CDI runtime would hide the variable
    (`void`, as on the H200) once it has injected the device."""
    real_node.start_device_plugin(uuids=GPU_UUIDS[:1])
    wait_until(lambda: real_node.gpus()[1] == "1", 60, "nvidia.com/gpu: 1")
    optout = f"{namespace}-optout"
    cluster.ensure_namespace(optout, labels={"gpu-webhook.io/ignore": "true"})
    pod = _shell_pod("env", "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES", runtime_class=None)
    cluster.kubectl("apply", "-n", optout, "-f", "-", input=yaml_of(pod))
    try:
        assert _finished(cluster, optout, "env") == "Succeeded", cluster.kubectl(
            "describe", "pod", "env", "-n", optout).stdout
        assert "runtimeClassName" not in pod_json(cluster, optout, "env")["spec"]
        logs = cluster.kubectl("logs", "env", "-n", optout).stdout
    finally:
        cluster.kubectl("delete", "namespace", optout, "--wait=false", check=False)
    assert f"NVIDIA_VISIBLE_DEVICES={GPU_UUIDS[0]}" in logs


def test_seed_pod_runs_through_the_nvidia_runtime(cluster: Cluster, real_node: RealNode, namespace: str) -> None:
    """The seed's cuda-gpu-test, applied as written: the webhook mutates it, the scheduler puts it on the real
    node, the NVIDIA Container Runtime injects the device from the stand-in CDI spec, and it Succeeds."""
    real_node.start_device_plugin(uuids=GPU_UUIDS[:1])
    wait_until(lambda: real_node.gpus()[1] == "1", 60, "nvidia.com/gpu: 1")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=CUDA_GPU_TEST)
    phase = _finished(cluster, namespace, "cuda-gpu-test")
    stored = pod_json(cluster, namespace, "cuda-gpu-test")
    assert stored["spec"]["runtimeClassName"] == "nvidia"
    assert stored["spec"]["nodeName"] == NODE_NAME
    assert phase == "Succeeded", cluster.kubectl("describe", "pod", "cuda-gpu-test", "-n", namespace).stdout
    logs = cluster.kubectl("logs", "cuda-gpu-test", "-n", namespace).stdout
    assert "nvidia-smi STAND-IN" in logs
    assert f"GPU 0: NVIDIA H200 stand-in (UUID: {GPU_UUIDS[0]})" in logs
    assert "libcuda.so.1 -> libcuda.so.580.159.04" in logs  # the real nvidia-cdi-hook made the link


def _insufficient(cluster: Cluster, namespace: str, name: str) -> str:
    """The real scheduler's FailedScheduling text for the Pod once it says Insufficient nvidia.com/gpu."""
    def said() -> str:
        for event in events_for(cluster, namespace, "Pod", name):
            if event.get("reason") == "FailedScheduling" and "Insufficient nvidia.com/gpu" in event["message"]:
                return str(event["message"])
        return ""

    message = str(wait_until(said, 60, f"the scheduler's Insufficient nvidia.com/gpu for {name}"))
    print(f"real event: {message}")
    return message


def _steps(report: dict[str, object]) -> dict[str, str]:
    """doctor's JSON report: step title -> summary."""
    return {str(s["step"]): str(s["summary"]) for s in report["steps"]}  # type: ignore[attr-defined]


def test_plugin_not_running_leaves_the_seed_pod_pending(cluster: Cluster, real_node: RealNode,
                                                        namespace: str) -> None:
    """No device plugin: the real node advertises no GPU, the real scheduler says Insufficient, and doctor says
    the plugin is not running there, although the kwok A100 nodes advertise GPUs the Pod cannot land on."""
    real_node.stop_device_plugin()
    wait_until(lambda: real_node.gpus()[1] in (None, "0"), 60, "no allocatable GPU")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=CUDA_GPU_TEST)
    _insufficient(cluster, namespace, "cuda-gpu-test")
    code, report = doctor(cluster, namespace, "cuda-gpu-test")
    assert code == 1
    steps = _steps(report)
    assert "Insufficient nvidia.com/gpu" in json.dumps(report)
    assert "none of the nodes the Pod can land on advertises it, so the device plugin is not running" in steps["Events"]
    assert f"the device plugin is not running (or not registered) on {NODE_NAME}" in steps["Matching nodes"]


def test_all_gpus_in_use_leaves_the_seed_pod_pending(cluster: Cluster, real_node: RealNode, namespace: str) -> None:
    """The plugin advertises 1 GPU and another Pod holds it: the same Insufficient text from the real scheduler,
    and doctor says the GPU is in use and the Pod waits for it (unscheduled: exit 1, as for a full fleet)."""
    real_node.start_device_plugin(uuids=GPU_UUIDS[:1])
    wait_until(lambda: real_node.gpus()[1] == "1", 60, "nvidia.com/gpu: 1")
    holder = _shell_pod("gpu-holder", "trap 'exit 0' TERM; while :; do sleep 1; done")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(holder))
    wait_until(lambda: _phase(cluster, namespace, "gpu-holder") == "Running", 90, "the holder Pod to run")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=CUDA_GPU_TEST)
    _insufficient(cluster, namespace, "cuda-gpu-test")
    code, report = doctor(cluster, namespace, "cuda-gpu-test")
    assert code == 1
    steps = _steps(report)
    assert "the GPUs of the nodes the Pod can land on are in use" in steps["Events"]
    assert "1 could hold the Pod, but none has enough free GPUs now" in steps["Matching nodes"]
    assert str(report["conclusion"]).startswith("Placement: the Pod is not scheduled (phase Pending): the nodes it "
                                                "can land on have no GPU free now")


def test_two_replicas_fail_allocate_like_the_real_plugin(cluster: Cluster, real_node: RealNode,
                                                          namespace: str) -> None:
    """Time-slicing with failRequestsGreaterThanOne: 2 replicas fail at the kubelet with the real plugin's text."""
    real_node.start_device_plugin(uuids=GPU_UUIDS[:1], replicas=4, fail_requests_greater_than_one=True)
    wait_until(lambda: real_node.gpus()[1] == "4", 60, "nvidia.com/gpu: 4 (time-sliced)")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(_shell_pod("ts-two", "true", gpus=2)))
    stored = wait_until(lambda: (p := pod_json(cluster, namespace, "ts-two"))["status"].get("phase") == "Failed"
                        and p, 60, "ts-two to be rejected by the kubelet")
    assert stored["status"]["reason"] == "UnexpectedAdmissionError"
    assert ("Allocate failed due to rpc error: code = Unknown desc = invalid allocation request for "
            '"nvidia.com/gpu": invalid request: maximum request size for shared resources is 1; found 2, which is '
            "unexpected") in stored["status"]["message"]


def test_device_missing_from_the_cdi_spec(cluster: Cluster, real_node: RealNode, namespace: str) -> None:
    """A device the (stand-in) CDI spec does not list: the real runtime's "unresolvable CDI devices"."""
    pod = _shell_pod("no-such-gpu", "true", gpus=0, runtime_class="nvidia")
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES",  # type: ignore[index]
                                            "value": "GPU-00000000-0000-0000-0000-000000000000"}]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml_of(pod))

    def failed_event() -> str:
        for event in events_for(cluster, namespace, "Pod", "no-such-gpu"):
            if "unresolvable CDI devices" in event.get("message", ""):
                return str(event["message"])
        return ""

    message = wait_until(failed_event, 90, "the unresolvable-CDI-devices event")
    print(f"real event: {message}")
    assert ("failed to inject CDI devices: unresolvable CDI devices "
            "nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000") in message
    # doctor explains the runtime's own text: the node's CDI spec lacks the device, and how to regenerate it.
    code, report = doctor(cluster, namespace, "no-such-gpu")
    assert code == 1
    text = json.dumps(report)
    assert "could not inject the CDI device nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000" in text
    assert "nvidia-ctk cdi generate" in text


def test_runtime_handler_that_does_not_exist(cluster: Cluster, real_node: RealNode, namespace: str) -> None:
    """A RuntimeClass whose handler containerd does not have: the sandbox cannot be created."""
    runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia-missing"},
                     "handler": "nvidia-missing"}
    cluster.kubectl("apply", "-f", "-", input=yaml_of(runtime_class))
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        input=yaml_of(_shell_pod("no-handler", "true", gpus=0, runtime_class="nvidia-missing")))

        def sandbox_event() -> str:
            for event in events_for(cluster, namespace, "Pod", "no-handler"):
                if event.get("reason") == "FailedCreatePodSandBox":
                    return str(event["message"])
            return ""

        message = wait_until(sandbox_event, 90, "the FailedCreatePodSandBox event")
        print(f"real event: {message}")
        assert 'no runtime for "nvidia-missing" is configured' in message
        code, report = doctor(cluster, namespace, "no-handler")
        assert code == 1
        assert 'containerd on the node has no runtime handler \\"nvidia-missing\\"' in json.dumps(report)
    finally:
        cluster.kubectl("delete", "runtimeclass", "nvidia-missing", "--ignore-not-found", check=False)


def test_node_as_the_rules_expect(real_node: RealNode) -> None:
    """The real node carries the labels and taint the packaged rules' default (inference, T4) class selects."""
    node = real_node.node() or {}
    labels = node["metadata"]["labels"]
    assert labels["workload"] == "inference" and labels["gpu-type"] == "t4"
    assert {"key": GPU, "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert json.dumps(node["status"]["addresses"]).count("10.222.0.1") == 1


def test_create_latency_by_url(cluster: Cluster, real_node: RealNode, namespace: str) -> None:
    """Prints (does not time) Pod-create latency with the webhook by URL (a host process), the same loop that
    test_21 runs against the in-cluster webhook through its Service."""
    with CreateLoop(cluster, namespace) as loop:
        time.sleep(15)
    print(f"Pod-create (dry run) via the URL route: {loop.summary()}")
    assert loop.counts()["refused"] == 0
