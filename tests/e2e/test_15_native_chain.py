"""The admission chain on the real API server, and the RuntimeClass question, in webhook and in native mode.

Order (kube-apiserver's AllOrderedPlugins): the built-in mutating plugins (ExtendedResourceToleration,
RuntimeClass, ...), MutatingAdmissionPolicies, mutating webhooks, the object's validation,
ValidatingAdmissionPolicies, validating webhooks. Each stage here gets a probe that records what it sees of a GPU
Pod: a MutatingAdmissionPolicy that writes its first look into an annotation, a capture mutating webhook named to
be called before gpu-webhook's, a ValidatingAdmissionPolicy that warns what it sees, and a capture validating
webhook. The RuntimeClass `nvidia` has `overhead.podFixed` and `scheduling`, as a GPU Operator install may have.

The question (docs/native-policy.md, "RuntimeClass"): the RuntimeClass plugin runs before both of our mutating
stages, so a runtimeClassName that we default might miss its overhead and scheduling, and its validation
would then refuse the Pod. The module starts its own control plane (the harness's `running_cluster`).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster import GPU, LOOPBACK, Cluster, free_port, gpu_pod, new_ca, new_leaf, running_cluster, wait_until
from test_11_real_bodies import _Capture, _hook
from test_15_native import apply_native, remove_webhooks

pytestmark = pytest.mark.e2e

NS = "chain"
LABEL = "e2e.gpu-webhook.io/chain"
LOOK = "e2e.gpu-webhook.io/map-first-look"
OVERHEAD = {"cpu": "250m", "memory": "120Mi"}
RUNTIME_CLASS = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
                 "handler": "nvidia", "overhead": {"podFixed": OVERHEAD},
                 "scheduling": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                                "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]}}
# What a stage sees, as one line: the fields the RuntimeClass and ExtendedResourceToleration plugins and our class
# injection touch.
SEEN = ("'runtimeClassName=' + (has(object.spec.runtimeClassName) ? object.spec.runtimeClassName : '') + "
        "' overhead=' + (has(object.spec.overhead) ? 'yes' : 'no') + "
        "' gpuToleration=' + (has(object.spec.tolerations) && object.spec.tolerations.exists(t, has(t.key) && "
        f"t.key == '{GPU}') ? 'yes' : 'no') + "
        "' runtimeClassSelector=' + (has(object.spec.nodeSelector) && 'nvidia.com/gpu.present' in "
        "object.spec.nodeSelector ? 'yes' : 'no') + "
        "' class=' + (has(object.metadata.annotations) && 'gpu-webhook.io/class' in object.metadata.annotations ? "
        "object.metadata.annotations['gpu-webhook.io/class'] : '')")
SCOPE = {"namespaceSelector": {"matchLabels": {LABEL: "true"}}}
POD_RULES = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                "resources": ["pods"]}]}


def probes() -> list[dict[str, Any]]:
    api = "admissionregistration.k8s.io/v1"
    look = (f"has(object.metadata.annotations) && '{LOOK}' in object.metadata.annotations ? [] : "
            "[JSONPatch{op: 'add', path: '/metadata/annotations', value: has(object.metadata.annotations) ? "
            f"object.metadata.annotations : {{}}}}, JSONPatch{{op: 'add', path: '/metadata/annotations/' + "
            f"jsonpatch.escapeKey('{LOOK}'), value: {SEEN}}}]")
    return [
        {"apiVersion": api, "kind": "MutatingAdmissionPolicy", "metadata": {"name": "0-e2e-chain-probe"},
         "spec": {"matchConstraints": POD_RULES, "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                  "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": look}}]}},
        {"apiVersion": api, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": "0-e2e-chain-probe"},
         "spec": {"policyName": "0-e2e-chain-probe", "matchResources": SCOPE}},
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "0-e2e-chain-probe"},
         "spec": {"matchConstraints": POD_RULES, "failurePolicy": "Fail",
                  "validations": [{"expression": "false", "messageExpression": "'vap saw: ' + " + SEEN}]}},
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "0-e2e-chain-probe"},
         "spec": {"policyName": "0-e2e-chain-probe", "validationActions": ["Warn"], "matchResources": SCOPE}},
    ]


def seen(pod: dict[str, Any]) -> str:
    """SEEN, computed in Python on a Pod a webhook received (or the stored one)."""
    spec = pod["spec"]
    return (f"runtimeClassName={spec.get('runtimeClassName') or ''} overhead={'yes' if spec.get('overhead') else 'no'}"
            f" gpuToleration={'yes' if any(t.get('key') == GPU for t in spec.get('tolerations') or ()) else 'no'}"
            f" runtimeClassSelector={'yes' if 'nvidia.com/gpu.present' in (spec.get('nodeSelector') or {}) else 'no'}"
            f" class={(pod['metadata'].get('annotations') or {}).get('gpu-webhook.io/class', '')}")


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, dict[str, list[dict[str, Any]]]]]:
    """A control plane with the RuntimeClass above, the four probes and a labelled namespace."""
    workdir = tmp_path_factory.mktemp("chain")
    with running_cluster(workdir) as cluster:
        cluster.kubectl("delete", "runtimeclass", "nvidia")
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(RUNTIME_CLASS))
        ca, ca_key, ca_cert = new_ca("e2e-chain-ca")
        leaf = new_leaf(ca_key, ca_cert, "capture", ips=[LOOPBACK], server=True)
        (workdir / "tls.crt").write_bytes(leaf.cert)
        (workdir / "tls.key").write_bytes(leaf.key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(workdir / "tls.crt"), str(workdir / "tls.key"))
        bodies: dict[str, list[dict[str, Any]]] = {}
        server = ThreadingHTTPServer((LOOPBACK, free_port()), type("Handler", (_Capture,), {"bodies": bodies}))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base, bundle = f"https://{LOOPBACK}:{server.server_address[1]}", base64.b64encode(ca.cert).decode()
        rules = POD_RULES["resourceRules"]
        hooks = [
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
             "metadata": {"name": "0-e2e-chain-first"},
             "webhooks": [{**_hook("first.chain.e2e.io", f"{base}/mutating-first", bundle, rules),
                           "namespaceSelector": SCOPE["namespaceSelector"]}]},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": "zz-e2e-chain-final"},
             "webhooks": [{**_hook("final.chain.e2e.io", f"{base}/validating-final", bundle, rules),
                           "namespaceSelector": SCOPE["namespaceSelector"]}]},
        ]
        cluster.ensure_namespace(NS, labels={LABEL: "true"})
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(hooks + probes()))
        try:
            yield cluster, bodies
        finally:
            server.shutdown()


def admit(cluster: Cluster, bodies: dict[str, list[dict[str, Any]]], name: str) -> dict[str, str]:
    """Create a one-GPU Pod (no runtimeClassName: ours is defaulted) and report what each stage saw."""
    def probed() -> bool:
        bodies.clear()
        done = cluster.kubectl("create", "--dry-run=server", "-n", NS, "-o", "json", "-f", "-",
                               input=json.dumps(gpu_pod(f"{name}-probe")), check=False)
        return "vap saw" in done.stderr and "mutating-first" in bodies and "validating-final" in bodies

    wait_until(probed, 30, "every probe to be called")
    bodies.clear()
    done = cluster.kubectl("create", "-n", NS, "-o", "json", "-f", "-", input=json.dumps(gpu_pod(name)), check=False)
    assert done.returncode == 0, f"the Pod was refused: {done.stderr}"
    stored = json.loads(done.stdout)
    vap = next(line.split("vap saw: ", 1)[1] for line in done.stderr.splitlines() if "vap saw: " in line)
    return {
        "MutatingAdmissionPolicy (first look)": stored["metadata"]["annotations"][LOOK],
        "mutating webhook (called before gpu-webhook)": seen(bodies["mutating-first"][0]["request"]["object"]),
        "ValidatingAdmissionPolicy": vap,
        "validating webhook (last)": seen(bodies["validating-final"][-1]["request"]["object"]),
        "stored": seen(stored) + f" overheadValue={stored['spec'].get('overhead')} gpuTolerations="
                  f"{sum(1 for t in stored['spec']['tolerations'] if t.get('key') == GPU)}",
    }


def test_the_chain_in_webhook_mode_then_native_mode(chain: tuple[Cluster, dict[str, list[dict[str, Any]]]]) -> None:
    cluster, bodies = chain
    webhook = admit(cluster, bodies, "webhook-mode")
    remove_webhooks(cluster)
    apply_native(cluster)
    native = admit(cluster, bodies, "native-mode")
    report = {"webhook mode": webhook, "native mode": native}
    Path(cluster.workdir / "chain.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))

    # ExtendedResourceToleration has run before every stage of ours; nothing of ours has run before the MAP.
    assert webhook["MutatingAdmissionPolicy (first look)"] == (
        "runtimeClassName= overhead=no gpuToleration=yes runtimeClassSelector=no class=")
    # Webhook mode: the first mutating webhook sees the same; gpu-webhook comes after it.
    assert webhook["mutating webhook (called before gpu-webhook)"] == webhook["MutatingAdmissionPolicy (first look)"]
    # Native mode: our MAP has injected the class before any webhook is called, and the RuntimeClass plugin has
    # not yet added the overhead or its scheduling for it. (MutatingAdmissionPolicies are not called in name
    # order among themselves: the probe's first look may come after ours, so it is not asserted here.)
    assert native["mutating webhook (called before gpu-webhook)"] == (
        "runtimeClassName=nvidia overhead=no gpuToleration=yes runtimeClassSelector=no "
        "class=workload=inference,gpu-type=t4")
    # In both modes the defaulted runtimeClassName gets the RuntimeClass's overhead and scheduling before
    # validation (the API server re-runs its built-in mutating plugins after a later stage changed the object),
    # and the Pod is admitted, not refused.
    for mode in (webhook, native):
        final = ("runtimeClassName=nvidia overhead=yes gpuToleration=yes runtimeClassSelector=yes "
                 "class=workload=inference,gpu-type=t4")
        assert mode["ValidatingAdmissionPolicy"] == final
        assert mode["validating webhook (last)"] == final
        assert mode["stored"] == final + f" overheadValue={OVERHEAD} gpuTolerations=1"
