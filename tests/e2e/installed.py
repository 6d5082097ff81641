"""The webhook as shipped: the image built from the Dockerfile (tests/e2e/build_image.sh), imported into the real
node's containerd, and `helm install` of charts/gpu-webhook running it as a Deployment on the real node.

The API server reaches it through its Service exactly as shipped (Service, caBundle, RBAC and the webhook
configurations from the chart): it resolves the Service to an endpoint itself (`--enable-aggregator-routing`), a
Pod IP on the real node's bridge, which the host routes to.

The harness's own webhook configurations (by URL, named like the chart's) are saved and deleted for the install,
and restored afterwards, so the rest of the suite is unaffected.
"""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from controlplane import ControlPlane
from procs import HERE, REPO, WEBHOOK_NAMESPACE, ClusterError, Json, tail
from realnode import NODE_NAME, RealNode

BUILD_IMAGE_SCRIPT = HERE / "build_image.sh"
BUILD_HELM_SCRIPT = HERE / "build_helm.sh"
CHART = REPO / "charts" / "gpu-webhook"
RELEASE = "gpu-webhook"
HOOK_KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")
# On the real node only (the kwok nodes would only pretend to run it), past its GPU taint, both replicas there.
ON_THE_REAL_NODE: Json = {
    "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "topologySpread": {"enabled": False},
    "certificates": {"mode": "generate"},
}


# A ValidatingAdmissionPolicy that refuses every write to the chart Service's EndpointSlices. The EndpointSlice
# controller then retries with its backoff ("Error syncing endpoint slices for service, retrying"), and the API
# server's resolver keeps the Pods it listed as Ready after their deletion, as on a control plane whose slice
# updates lag.
FREEZE_SLICES = f"""
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: freeze-webhook-endpointslices}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [discovery.k8s.io]
        apiVersions: ["*"]
        resources: [endpointslices]
        operations: [CREATE, UPDATE, DELETE]
    objectSelector:
      matchLabels: {{kubernetes.io/service-name: {RELEASE}}}
  validations:
    - expression: "false"
      message: frozen by the e2e suite to make the webhook's endpoints lag
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: freeze-webhook-endpointslices}}
spec:
  policyName: freeze-webhook-endpointslices
  validationActions: [Deny]
"""


@contextlib.contextmanager
def endpoint_slices_frozen(cluster: ControlPlane) -> Iterator[None]:
    """While inside, the chart Service's EndpointSlices cannot change (FREEZE_SLICES)."""
    cluster.kubectl("apply", "-f", "-", input=FREEZE_SLICES)
    try:
        yield
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                        "freeze-webhook-endpointslices", "--ignore-not-found")


def _built(script: Path) -> str:
    try:
        done = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True, timeout=3600)
    except subprocess.CalledProcessError as exc:
        raise ClusterError(f"{script} failed with exit {exc.returncode}:\n{tail(exc.stderr)}") from exc
    return done.stdout.strip().splitlines()[-1]


def strip_server_fields(doc: Json) -> Json:
    """A stored object without what the server set (uid, resourceVersion, ...), to apply it again."""
    doc = copy.deepcopy(doc)
    for key in SERVER_FIELDS:
        doc["metadata"].pop(key, None)
    doc["metadata"].get("annotations", {}).pop("kubectl.kubernetes.io/last-applied-configuration", None)
    return doc


@dataclass
class InstalledWebhook:
    """The chart installed on the real node (see the module docstring)."""

    cluster: ControlPlane
    node: RealNode
    home: Path
    helm_binary: Path = Path()
    image_archive: Path = Path()
    saved: dict[str, Json] | None = None

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """helm against the e2e cluster, with its own cache/config/data directories."""
        env = self.cluster.env()
        env |= {f"HELM_{part}_HOME": str(self.home / part.lower()) for part in ("CACHE", "CONFIG", "DATA")}
        done = subprocess.run([str(self.helm_binary), *args], capture_output=True, text=True, env=env,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done

    def prepare(self) -> None:
        """Build (or reuse) helm and the image, and import the image into the node's containerd."""
        self.helm_binary = Path(_built(BUILD_HELM_SCRIPT)) / "helm"
        self.image_archive = Path(_built(BUILD_IMAGE_SCRIPT))
        self.node.ctr("images", "import", "--all-platforms", str(self.image_archive), timeout=600)

    def install(self, values: Json | None = None, *extra: str) -> None:
        """Save and delete the harness's configurations, then `helm install` with ON_THE_REAL_NODE + `values`."""
        if self.saved is None:
            self.saved = {}
            for kind in HOOK_KINDS:
                done = self.cluster.kubectl("get", kind, RELEASE, "-o", "json", check=False)
                if done.returncode == 0:
                    self.saved[kind] = json.loads(done.stdout)
                    self.cluster.kubectl("delete", kind, RELEASE, "--wait=true")
        merged = _merge(copy.deepcopy(ON_THE_REAL_NODE), values or {})
        values_file = self.home / "values.yaml"
        self.home.mkdir(parents=True, exist_ok=True)
        values_file.write_text(yaml.safe_dump(merged))
        self.helm("install", RELEASE, str(CHART), "--namespace", WEBHOOK_NAMESPACE, "-f", str(values_file),
                  "--wait", "--timeout", "240s", *extra, timeout=300)

    def uninstall(self) -> None:
        """`helm uninstall`, then put the harness's configurations back."""
        self.helm("uninstall", RELEASE, "--namespace", WEBHOOK_NAMESPACE, "--wait", check=False)
        if self.saved:
            restore = [strip_server_fields(doc) for doc in self.saved.values()]
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                                 input=yaml.safe_dump_all(restore))
        self.saved = None

    def pods(self) -> list[Json]:
        """The webhook's Pods."""
        done = self.cluster.kubectl("get", "pods", "-n", WEBHOOK_NAMESPACE, "-l",
                                    "app.kubernetes.io/name=gpu-webhook", "-o", "json")
        return list(json.loads(done.stdout)["items"])

    def pod_names(self) -> set[str]:
        """The names of the webhook's Pods."""
        return {pod["metadata"]["name"] for pod in self.pods()}

    def rolled_out(self) -> bool:
        """Whether the Deployment's rollout is complete (`kubectl rollout status`, 5 s at most)."""
        return self.cluster.kubectl("rollout", "status", f"deployment/{RELEASE}", "-n", WEBHOOK_NAMESPACE,
                                    "--timeout=5s", check=False).returncode == 0


def _merge(base: Json, extra: Json) -> Json:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def container_status(pod: Json) -> dict[str, Any]:
    """The first container's status of a Pod."""
    return dict((pod.get("status", {}).get("containerStatuses") or [{}])[0])
