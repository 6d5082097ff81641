"""A real node beside the kwok nodes: a kubelet on containerd + runc + bridge CNI, joined to the e2e API server.

Opt-in: only the real-node tests start it (fixture `real_node`), so other e2e runs on a machine never start a second
kubelet or containerd. Only one real node can run on a machine at a time; a lock file guards it.

What runs, each in its own process group with its log in the node's work directory:
- containerd (Debian's), with its own config file, root, state directory and socket in the work directory. Its CRI
  plugin has two runtime handlers: `runc` (the default) and `nvidia`, which is the real NVIDIA Container Runtime
  (nvidia-container-runtime v1.20.2, built by build_node.sh) in CDI mode. The CDI spec it reads is a STAND-IN in
  nvidia-ctk's format: its devices are this machine's stand-in GPUs (no GPU, no driver), and what it mounts is a
  stand-in `nvidia-smi` (a shell script that prints the devices it was given) and a stand-in library, with the
  real `nvidia-cdi-hook create-symlinks` hook;
- the kubelet v1.36.3 (cgroupfs, cgroup v1 allowed, swap allowed, its root directory in the work directory);
- on demand, `gpu-device-plugin-standin`, a STAND-IN for NVIDIA's device plugin (see its source).

Network rule of the suite: traffic goes only to loopback or to interfaces the suite creates. The harness adds a
bridge (`gpuwh0`, 10.222.0.1/24) before the kubelet starts; the node IP is that gateway address and the bridge CNI
gives Pods addresses on it. Images cannot be pulled: the pause image and the test image tagged as the seed's CUDA
image are written here as OCI archives and imported into containerd.

`RealNode.stop()` (also run at exit) deletes the node's Pods, stops the kubelet, the containers, containerd, kills
shims left behind, unmounts everything under the work directory and removes the bridge and the network namespaces
CNI created, so nothing is left behind even when a test fails.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from controlplane import ControlPlane
from procs import HERE, LOOPBACK, ClusterError, Json, Proc, free_port, spawn, tail, wait_until

BUILD_NODE_SCRIPT = HERE / "build_node.sh"
BUILD_CONTAINERD_SCRIPT = HERE / "build_containerd.sh"
LOCK_FILE = Path("/run/gpu-webhook-e2e-real-node.lock")
NODE_NAME = "real-gpu-0"
BRIDGE = "gpuwh0"
POD_SUBNET = "10.222.0.0/24"
NODE_IP = "10.222.0.1"
PAUSE_IMAGE = "registry.k8s.io/pause:3.6"
CUDA_IMAGE = "docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04"
# The H200's UUID from the real-h200 fixtures, and stand-in UUIDs for more GPUs.
GPU_UUIDS = ("GPU-7499c50f-2307-cd9c-d9cc-937afc16d5cb", "GPU-1f6e9a2c-5b3d-4e8f-9a7b-2c4d6e8f0a1b",
             "GPU-3a5c7e9b-1d2f-4a6c-8e0b-5d7f9a1c3e5b", "GPU-6b8d0f2a-4c6e-4b1d-9f3a-7e9b1d3f5a7c")
RUNC = "/usr/sbin/runc"
CNI_BIN = "/usr/lib/cni"
API_FORWARD_PORT = 6443
NETNS_DIR = Path("/run/netns")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


class RealNodeUnavailable(ClusterError):
    """The machine cannot run the real node (not root, a missing package, another real node running)."""


def _built(script: Path) -> Path:
    """Run a build script (seconds when warm) and return the bin directory it prints last."""
    try:
        done = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise RealNodeUnavailable(f"{script} failed with exit {exc.returncode}:\n{tail(exc.stderr)}") from exc
    return Path(done.stdout.strip().splitlines()[-1])


def build_node_binaries() -> Path:
    """build_node.sh: the kubelet, pause, the stand-in device plugin, the NVIDIA Container Runtime."""
    return _built(BUILD_NODE_SCRIPT)


def build_containerd_binaries() -> Path:
    """build_containerd.sh: containerd 2.x, for CDI."""
    return _built(BUILD_CONTAINERD_SCRIPT)


# --------------------------------------------------------------------------------------------- OCI images


def _blob(blobs: dict[str, bytes], data: bytes) -> Json:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def _layer(files: dict[str, tuple[bytes, int]], symlinks: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *symlinks]} - {"."})
        for directory in dirs:
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(symlinks.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return out.getvalue()


def write_oci_archive(path: Path, name: str, files: dict[str, tuple[bytes, int]], config: Json,
                      symlinks: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> None:
    """A one-layer linux/amd64 image as an OCI archive that `ctr images import` names `name`."""
    blobs: dict[str, bytes] = {}
    layer = _layer(files, symlinks or {})
    gz = gzip.compress(layer, mtime=0)
    image_config = {
        "architecture": "amd64", "os": "linux",
        "config": {**config, "Labels": dict(labels or {})},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "created": "1970-01-01T00:00:00Z",
    }
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   **_blob(blobs, json.dumps(image_config).encode())},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **_blob(blobs, gz)}],
    }
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **_blob(blobs, json.dumps(manifest).encode()),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
    }]}
    with tarfile.open(path, "w") as tar:
        entries = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
                   "index.json": json.dumps(index).encode()}
        entries |= {f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()}
        for entry, data in entries.items():
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


NVIDIA_SMI_STANDIN = """#!/bin/sh
# STAND-IN for nvidia-smi, mounted by the e2e suite's stand-in CDI spec (this machine has no GPU and no driver).
# It prints the GPUs the NVIDIA Container Runtime injected into this container, in `nvidia-smi -L`'s format.
echo "nvidia-smi STAND-IN (gpu-webhook e2e: no GPU here; devices injected by the stand-in CDI spec)"
env | grep '^NVIDIA_STANDIN_GPU_' | sort | while IFS='=' read -r key uuid; do
  echo "GPU ${key#NVIDIA_STANDIN_GPU_}: NVIDIA H200 stand-in (UUID: $uuid)"
done
echo "libcuda.so.1 -> $(readlink /lib64/libcuda.so.1)"
"""


def stand_in_cdi_spec(hook: Path, standin_dir: Path, uuids: tuple[str, ...]) -> Json:
    """A STAND-IN CDI spec in nvidia-ctk's format (kind nvidia.com/gpu, a device per GPU UUID and `all`): it mounts
    the stand-in nvidia-smi and library and runs the real nvidia-cdi-hook, as `nvidia-ctk cdi generate` would."""
    def device(name: str, indices: list[int]) -> Json:
        return {"name": name, "containerEdits": {
            "env": [f"NVIDIA_STANDIN_GPU_{i}={uuids[i]}" for i in indices]}}

    return {
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [device(u, [i]) for i, u in enumerate(uuids)] + [device("all", list(range(len(uuids))))],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_CTK_LIBCUDA_DIR=/lib64"],
            "mounts": [
                {"hostPath": str(standin_dir / "nvidia-smi"), "containerPath": "/usr/bin/nvidia-smi",
                 "options": ["ro", "nosuid", "nodev", "bind"]},
                {"hostPath": str(standin_dir / "libcuda.so.580.159.04"),
                 "containerPath": "/lib64/libcuda.so.580.159.04", "options": ["ro", "nosuid", "nodev", "bind"]},
            ],
            "hooks": [{"hookName": "createContainer", "path": str(hook),
                       "args": ["nvidia-cdi-hook", "create-symlinks", "--link",
                                "libcuda.so.580.159.04::/lib64/libcuda.so.1"],
                       "env": ["NVIDIA_CTK_DEBUG=false"]}],
        },
    }


# --------------------------------------------------------------------------------------------- the node


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}{done.stdout.strip()}")
    return done


@dataclass
class RealNode:
    """The real node (see the module docstring), joined to `cluster`'s API server."""

    cluster: ControlPlane
    bindir: Path
    workdir: Path
    # containerd 2.x (build_containerd.sh) instead of Debian's 1.6: CDI on, reading `cdi_dir` (the DRA test).
    containerd_bindir: Path | None = None
    procs: dict[str, Proc] = field(default_factory=dict)
    kubelet_port: int = 0
    _lock: Any = None
    _netns_before: set[str] = field(default_factory=set)
    _created_var_lib_kubelet: bool = False
    _relay: socketserver.ThreadingTCPServer | None = None

    @property
    def logdir(self) -> Path:
        """Where containerd's, the kubelet's and the plugin's logs are kept."""
        return self.workdir / "logs"

    @property
    def containerd_socket(self) -> Path:
        """containerd's own socket (not the system's /run/containerd)."""
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def device_plugin_dir(self) -> Path:
        """The kubelet's device-plugins directory (kubelet.sock and the plugins' sockets). The kubelet does not
        follow --root-dir here: the path is the API's constant, so it is the one host path the node shares."""
        return DEVICE_PLUGIN_DIR

    @property
    def cdi_dir(self) -> Path:
        """Where DRA kubelet plugins write the CDI specs of the claims they prepare (the stand-in DRA plugin of
        test_25_dra_real_node.py), one of the CDI spec directories containerd reads."""
        return self.workdir / "cdi"

    @property
    def unhealthy_file(self) -> Path:
        """Device ids written here are reported Unhealthy by the stand-in device plugin."""
        return self.workdir / "unhealthy-devices"

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`ctr` on this node's containerd, namespace k8s.io."""
        ctr = str(self.containerd_bindir / "ctr") if self.containerd_bindir else "ctr"
        return _run(ctr, "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args, check=check,
                    timeout=timeout)

    def logs(self) -> str:
        """Every node process's log tail, for a failure report."""
        return "\n".join(f"===== {n} ({'running' if p.alive() else f'exited {p.popen.returncode}'}), {p.log} =====\n"
                         f"{p.log_tail()}" for n, p in self.procs.items())

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Take the lock, then start the network, containerd, images and the kubelet; raises ClusterError."""
        self._take_lock()
        atexit.register(self.stop)
        self.logdir.mkdir(parents=True, exist_ok=True)
        steps = [("the bridge", self._start_network), ("containerd", self._start_containerd),
                 ("images", self._import_images), ("kubelet", self._start_kubelet)]
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                raise ClusterError(f"real node: starting {what} failed: {exc}\n{self.logs()}") from exc

    def _take_lock(self) -> None:
        if os.geteuid() != 0:
            raise RealNodeUnavailable("the real node needs root (containerd, the kubelet, mounts, a bridge); run the "
                                      "real-node tests as root")
        for tool in ("containerd", "ctr", RUNC, "ip"):
            if shutil.which(tool) is None:
                raise RealNodeUnavailable(f"the real node needs {tool}; run tests/e2e/build_node.sh as root (it "
                                          "installs the Debian packages)")
        self._lock = LOCK_FILE.open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "unknown"
            self._lock.close()
            self._lock = None
            raise RealNodeUnavailable(
                f"another real node is running on this machine ({LOCK_FILE} is held by pid {holder}); only one can "
                "run at a time (one kubelet, one bridge): wait for that test run to finish, then run again") from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()

    def _start_network(self) -> None:
        self._netns_before = set(os.listdir(NETNS_DIR)) if NETNS_DIR.exists() else set()
        self._created_var_lib_kubelet = not DEVICE_PLUGIN_DIR.parent.exists()
        _run("ip", "link", "del", BRIDGE, check=False)  # a bridge a killed run left behind
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        netd = self.workdir / "cni" / "net.d"
        netd.mkdir(parents=True, exist_ok=True)
        (netd / "10-gpuwh.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "gpuwh-e2e",
            "plugins": [{"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                                  "dataDir": str(self.workdir / "cni" / "ipam")}},
                        {"type": "loopback"}],
        }, indent=2))

    def _start_containerd(self) -> None:
        base = self.workdir / "containerd"
        base.mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        runtimes = f"{cri}.containerd.runtimes"
        cdi_lines = self._cdi_config()
        config = f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / 'opt'}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
{cdi_lines}[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{self.workdir / 'cni' / 'net.d'}"
[{cri}.containerd]
  default_runtime_name = "runc"
  snapshotter = "overlayfs"
[{runtimes}.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtimes}.runc.options]
  BinaryName = "{RUNC}"
[{runtimes}.nvidia]
  runtime_type = "io.containerd.runc.v2"
[{runtimes}.nvidia.options]
  BinaryName = "{self.bindir / 'nvidia-container-runtime'}"
"""
        (base / "config.toml").write_text(config)
        self._write_nvidia_runtime_config()
        env = dict(os.environ)
        # Nothing can be pulled, and no traffic may leave the machine: any pull goes to a dead loopback proxy
        # (refused at once, no DNS lookup of the registry), so a Pod naming an image that is not here fails fast.
        env |= {"HTTPS_PROXY": f"http://{LOOPBACK}:9", "HTTP_PROXY": f"http://{LOOPBACK}:9", "NO_PROXY": ""}
        # Read by nvidia-container-runtime (containerd -> shim -> runtime inherit it): its config in the work dir.
        env["NVIDIA_CTK_CONFIG_FILE_PATH"] = str(self.workdir / "nvidia" / "config.toml")
        containerd = "containerd"
        if self.containerd_bindir is not None:  # its shim (containerd-shim-runc-v2) is looked up on PATH
            containerd = str(self.containerd_bindir / "containerd")
            env["PATH"] = f"{self.containerd_bindir}:{env.get('PATH', '')}"
        self.procs["containerd"] = spawn("containerd", [containerd, "--config", str(base / "config.toml")],
                                         self.logdir, env=env)

        def up() -> bool:
            if not self.procs["containerd"].alive():
                raise ClusterError(f"containerd exited:\n{self.procs['containerd'].log_tail()}")
            return self.ctr("version", check=False).returncode == 0

        wait_until(up, 30, "containerd to answer on its socket", interval=0.3)

    def _cdi_config(self) -> str:
        """The CRI plugin's CDI lines: containerd 2.x reads `cdi_dir`; Debian's 1.6 has no CDI (no lines)."""
        if self.containerd_bindir is None:
            return ""
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        return f'  enable_cdi = true\n  cdi_spec_dirs = ["{self.cdi_dir}"]\n'

    def _write_nvidia_runtime_config(self) -> None:
        nvidia = self.workdir / "nvidia"
        standin = nvidia / "standin"
        cdi = nvidia / "cdi"
        for d in (standin, cdi):
            d.mkdir(parents=True, exist_ok=True)
        (standin / "nvidia-smi").write_text(NVIDIA_SMI_STANDIN)
        (standin / "nvidia-smi").chmod(0o755)
        (standin / "libcuda.so.580.159.04").write_text("STAND-IN for libcuda (no driver on this machine)\n")
        spec = stand_in_cdi_spec(self.bindir / "nvidia-cdi-hook", standin, GPU_UUIDS)
        (cdi / "nvidia-standin.yaml").write_text(
            "# STAND-IN CDI spec (gpu-webhook e2e): nvidia-ctk's format, stand-in devices and files; no GPU here.\n"
            + yaml.safe_dump(spec, sort_keys=False))
        (nvidia / "config.toml").write_text(f"""[nvidia-container-runtime]
debug = "{self.logdir / 'nvidia-container-runtime.log'}"
log-level = "info"
mode = "cdi"
runtimes = ["{RUNC}"]
[nvidia-container-runtime.modes.cdi]
spec-dirs = ["{cdi}"]
default-kind = "nvidia.com/gpu"
annotation-prefixes = ["cdi.k8s.io/"]
[nvidia-ctk]
path = "{self.bindir / 'nvidia-ctk'}"
""")

    def _import_images(self) -> None:
        images = self.workdir / "images"
        images.mkdir(exist_ok=True)
        write_oci_archive(images / "pause.tar", PAUSE_IMAGE, {"pause": ((self.bindir / "pause").read_bytes(), 0o755)},
                          {"Entrypoint": ["/pause"]}, labels={"gpu-webhook.io/e2e": "static pause built from Go"})
        busybox = (self.bindir / "busybox").read_bytes()
        tools = ["sh", "env", "cat", "echo", "grep", "sort", "sleep", "readlink", "ls", "true", "id"]
        write_oci_archive(
            images / "cuda-standin.tar", CUDA_IMAGE, {"bin/busybox": (busybox, 0o755)},
            {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                     "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]},
            symlinks={f"bin/{t}": "busybox" for t in tools},
            labels={"gpu-webhook.io/stand-in": "STAND-IN tagged as nvidia/cuda:12.4.1-base-ubuntu22.04: Debian "
                                                "busybox only; nvidia-smi comes from the stand-in CDI spec"})
        for archive in ("pause.tar", "cuda-standin.tar"):
            # containerd 2.x's ctr imports through the transfer service, which refuses to unpack without --local.
            local = ["--local"] if self.containerd_bindir is not None else []
            self.ctr("images", "import", *local, "--all-platforms", str(images / archive))

    def _start_kubelet(self) -> None:
        kubelet_dir = self.workdir / "kubelet"
        kubelet_dir.mkdir(exist_ok=True)
        self.kubelet_port = free_port()
        pki = self.cluster.pki
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # This host: cgroup v1, swap, no local-storage isolation (REAL-NODE-FACTS section 2).
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "failSwapOn": False,
            "localStorageCapacityIsolation": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": NODE_IP, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": LOOPBACK, "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "registerWithTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            "serializeImagePulls": False, "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "resolvConf": "", "staticPodPath": "",
        }
        (kubelet_dir / "config.yaml").write_text(yaml.safe_dump(config))
        # The packaged rules' default class (inference, T4), which the seed's Pod gets. No `nvidia.com/gpu.present`:
        # the device plugin here is a host process, and NVIDIA's DaemonSet (selecting that label) could not pull.
        labels = {"workload": "inference", "gpu-type": "t4", "accelerator": "nvidia-tesla-t4",
                  "gpu-webhook.io/e2e-real-node": "true"}
        self.procs["kubelet"] = spawn("kubelet", [
            str(self.bindir / "kubelet"), f"--config={kubelet_dir / 'config.yaml'}",
            f"--kubeconfig={self.cluster.kubeconfig}", f"--root-dir={kubelet_dir}",
            f"--cert-dir={kubelet_dir / 'pki'}",
            f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()), "--v=1",
        ], self.logdir)

        def ready() -> bool:
            if not self.procs["kubelet"].alive():
                raise ClusterError(f"the kubelet exited:\n{self.procs['kubelet'].log_tail()}")
            node = self.node()
            conditions = {c["type"]: c["status"] for c in (node or {}).get("status", {}).get("conditions", [])}
            return conditions.get("Ready") == "True"

        wait_until(ready, 120, f"node {NODE_NAME} to register and be Ready", interval=0.5)

    def node(self) -> Json | None:
        """The Node object, or None before it registers."""
        done = self.cluster.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        return dict(json.loads(done.stdout)) if done.returncode == 0 else None

    def gpus(self) -> tuple[str | None, str | None]:
        """The node's (capacity, allocatable) of nvidia.com/gpu; None where the resource is absent."""
        status = (self.node() or {}).get("status", {})
        return status.get("capacity", {}).get("nvidia.com/gpu"), status.get("allocatable", {}).get("nvidia.com/gpu")

    def run_to_end(self, namespace: str, manifest: str, name: str, timeout: float = 90) -> Json:
        """Apply a Pod manifest and wait for the Pod to finish (Succeeded or Failed); the Pod as stored."""
        self.cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

        def finished() -> Json | None:
            done = self.cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
            pod = json.loads(done.stdout) if done.returncode == 0 else {}
            return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        return dict(wait_until(finished, timeout, f"{namespace}/{name} to finish"))

    # ------------------------------------------------------------------ the stand-in device plugin

    def start_device_plugin(self, uuids: tuple[str, ...] = GPU_UUIDS[:1], replicas: int = 1,
                            fail_requests_greater_than_one: bool = False) -> Proc:
        """Start the STAND-IN device plugin (see tests/e2e/node/cmd/gpu-device-plugin-standin)."""
        self.stop_device_plugin()
        self.unhealthy_file.write_text("")
        argv = [str(self.bindir / "gpu-device-plugin-standin"), f"--device-plugin-dir={self.device_plugin_dir}",
                f"--uuids={','.join(uuids)}", f"--replicas={replicas}", f"--unhealthy-file={self.unhealthy_file}"]
        if fail_requests_greater_than_one:
            argv.append("--fail-requests-greater-than-one")
        proc = spawn("gpu-device-plugin-standin", argv, self.logdir)
        self.procs["gpu-device-plugin-standin"] = proc
        return proc

    def stop_device_plugin(self) -> None:
        """Stop the stand-in device plugin (SIGTERM: it removes its socket)."""
        proc = self.procs.pop("gpu-device-plugin-standin", None)
        if proc is not None:
            proc.stop()

    # ------------------------------------------------------------------ the API server from Pods

    def forward_api_server(self) -> tuple[str, int]:
        """A STAND-IN for kube-proxy's route to the `kubernetes` Service: a TCP relay on the node IP (the bridge's
        gateway, reachable from Pods) to the API server on 127.0.0.1. There is no kube-proxy, so the Service's
        ClusterIP leads nowhere; a Pod that talks to the API server is given this address instead
        (KUBERNETES_SERVICE_HOST/PORT), which the API server's certificate names. Returns (host, port)."""
        if self._relay is None:
            target = (LOOPBACK, self.cluster.apiserver_port)

            class Relay(socketserver.BaseRequestHandler):
                def handle(self) -> None:
                    with socket.create_connection(target, timeout=10) as upstream:
                        upstream.settimeout(None)
                        pump = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
                        pump.start()
                        _pipe(self.request, upstream)
                        pump.join(timeout=5)

            server = socketserver.ThreadingTCPServer((NODE_IP, API_FORWARD_PORT), Relay, bind_and_activate=False)
            server.daemon_threads = True
            server.allow_reuse_address = True
            server.server_bind()
            server.server_activate()
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self._relay = server
        return NODE_IP, API_FORWARD_PORT

    # ------------------------------------------------------------------ teardown

    def stop(self) -> None:
        """Stop everything and remove what the node created (see the module docstring); safe to call twice."""
        if self._lock is None:
            return
        try:
            self._stop()
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
            self._lock = None

    def _stop(self) -> None:
        if self._relay is not None:
            self._relay.shutdown()
            self._relay.server_close()
            self._relay = None
        kubelet = self.procs.get("kubelet")
        if kubelet is not None and kubelet.alive():
            with contextlib.suppress(Exception):
                self.cluster.kubectl("delete", "pods", "--all-namespaces", "--field-selector",
                                     f"spec.nodeName={NODE_NAME}", "--grace-period=0", "--force", "--wait=false",
                                     check=False, timeout=30)
        self.stop_device_plugin()
        if kubelet is not None:
            kubelet.stop()
        containerd = self.procs.get("containerd")
        if containerd is not None and containerd.alive():
            with contextlib.suppress(Exception):
                self._remove_containers()
        if containerd is not None:
            containerd.stop()
        self._kill_leftover_shims()
        self._unmount_all()
        self._remove_network()
        with contextlib.suppress(Exception):
            self.cluster.kubectl("delete", "node", NODE_NAME, "--ignore-not-found", "--wait=false", check=False,
                                 timeout=30)

    def _remove_containers(self) -> None:
        for task in self.ctr("tasks", "ls", "-q", check=False, timeout=30).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, timeout=30)
        time.sleep(0.5)
        for task in self.ctr("tasks", "ls", "-q", check=False, timeout=30).stdout.split():
            self.ctr("tasks", "rm", "-f", task, check=False, timeout=30)
        for container in self.ctr("containers", "ls", "-q", check=False, timeout=30).stdout.split():
            self.ctr("containers", "rm", container, check=False, timeout=30)

    def _kill_leftover_shims(self) -> None:
        """Shims outlive containerd by design; kill the ones serving this node's containerd (by pid)."""
        needle = str(self.containerd_socket).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"containerd-shim" in cmdline and needle in cmdline:
                    os.kill(int(entry.name), signal.SIGKILL)

    def _unmount_all(self) -> None:
        """Unmount everything under the work directory (pod volumes, rootfs, shm), deepest first."""
        prefix = str(self.workdir.resolve()) + "/"
        for _ in range(3):
            mounts = [line.split()[1].encode().decode("unicode_escape")
                      for line in Path("/proc/self/mounts").read_text().splitlines()]
            mine = sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True)
            if not mine:
                return
            for mount in mine:
                _run("umount", "-l", mount, check=False)

    def _remove_network(self) -> None:
        if NETNS_DIR.exists():
            for name in set(os.listdir(NETNS_DIR)) - self._netns_before:
                if re.fullmatch(r"cni-[0-9a-f-]+", name):
                    _run("ip", "netns", "delete", name, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        if self._created_var_lib_kubelet:
            shutil.rmtree(DEVICE_PLUGIN_DIR.parent, ignore_errors=True)
        else:
            for entry in ("kubelet.sock", "nvidia-gpu-standin.sock", "kubelet_internal_checkpoint"):
                with contextlib.suppress(OSError):
                    (DEVICE_PLUGIN_DIR / entry).unlink()
        # veths whose peer lived in a deleted netns go with it; any still on the bridge went with the bridge.



def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes from source to sink until either side closes."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
