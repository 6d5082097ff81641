"""The deployment manifests (manifests/, rules/Kustomization) rendered by `kubectl kustomize` and checked.

Every overlay is rendered as an operator would apply it (plus each overlay with all optional components),
every core object is validated against the Kubernetes OpenAPI schemas (kubernetes-validate --strict) for
1.30 and for the newest version the validator knows, and the choices of the issue are asserted on the
rendered objects. The self-managed overlay is rendered in a copy of the tree with a throwaway CA and
serving certificate, as `gpu-webhook certs` would write them. Where the server's own modules exist, the
manifests are also checked against them (ports, env vars, drain time, routes, certificate names).
"""

from __future__ import annotations

import base64
import datetime as dt
import importlib
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient
from support.manifests import CRD_GROUPS, group_of, strict_errors

from webhook.cluster import kube

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
NAMESPACE = "gpu-system"
NAME = "gpu-webhook"
SYSTEM_NAMESPACES = ("kube-system", "kube-node-lease")
OPT_OUT_LABEL = "gpu-webhook.io/ignore"
COMPONENTS = ("servicemonitor", "runtimeclass-nvidia", "cluster-awareness", "grafana-dashboard", "prometheus-rule")
GUNICORN_GRACEFUL_TIMEOUT = 20  # seconds; the server's drain time (webhook/admission/settings.py when it exists)

pytestmark = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl is not on PATH: it is needed to render the kustomizations (`kubectl kustomize`)",
)

# name -> (kustomization dir relative to the work copy, components added on top)
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "base": ("manifests/base", ()),
    "cert-manager": ("manifests/overlays/cert-manager", ()),
    "self-managed": ("manifests/overlays/self-managed", ()),
    "cert-manager+components": ("manifests/overlays/cert-manager", COMPONENTS),
    "self-managed+components": ("manifests/overlays/self-managed", COMPONENTS),
}
DEPLOYABLE = [v for v in VARIANTS if v != "base"]


# ----------------------------------------------------------------------------------------------- rendering


def _throwaway_tls(directory: Path) -> bytes:
    """Write ca.crt, tls.crt, tls.key (cert-manager layout) for gpu-webhook.gpu-system; return the CA PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-webhook-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [NAME, f"{NAME}.{NAMESPACE}", f"{NAME}.{NAMESPACE}.svc", f"{NAME}.{NAMESPACE}.svc.cluster.local"]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[2])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem = ca.public_bytes(pem)
    (directory / "ca.crt").write_bytes(ca_pem)
    (directory / "tls.crt").write_bytes(leaf.public_bytes(pem))
    (directory / "tls.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca_pem


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="session")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of manifests/ and rules/ (never write into the repository), with test TLS for self-managed."""
    root = tmp_path_factory.mktemp("kustomize")
    ignore = shutil.ignore_patterns("*.crt", "*.key", "*.pem", "__pycache__")
    shutil.copytree(REPO / "manifests", root / "manifests", ignore=ignore)
    shutil.copytree(REPO / "rules", root / "rules", ignore=ignore)
    ca_pem = _throwaway_tls(root / "manifests/overlays/self-managed/tls")
    (root / "ca.pem").write_bytes(ca_pem)
    return root


@pytest.fixture(scope="session")
def rendered(work: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for variant, (path, components) in VARIANTS.items():
        directory = work / path
        if components:
            directory = work / "combos" / variant.replace("+", "-")
            directory.mkdir(parents=True)
            kustomization = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"../../{path}"],
                "components": [f"../../manifests/components/{c}" for c in components],
            }
            (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        out[variant] = _kustomize(directory)
    return out


def only(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected exactly one {kind} {name or ''}, found {len(found)}"
    return found[0]


def rules_configmap(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rules ConfigMap (its name has kustomize's hash suffix); the dashboard component adds another."""
    found = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gpu-webhook-rules")]
    assert len(found) == 1, f"expected exactly one ConfigMap gpu-webhook-rules-<hash>, found {len(found)}"
    return found[0]


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return only(docs, "Deployment", NAME)


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def container_port(docs: list[dict[str, Any]], port: int | str) -> int:
    """Resolve a port name or number against the webhook container, as a Service or probe would."""
    ports = container(docs)["ports"]
    if isinstance(port, int):
        assert port in [p["containerPort"] for p in ports], f"container does not expose {port}"
        return port
    by_name = {p["name"]: p["containerPort"] for p in ports}
    assert port in by_name, f"container has no port named {port!r}: {sorted(by_name)}"
    return by_name[port]


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: matchLabels and matchExpressions, all ANDed."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")



def server_module(name: str) -> Any:
    """The server's module, or skip: the server is written in parallel and may not be importable yet."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.skip(f"{name} is not importable yet ({exc}); manifests not cross-checked against it")


# --------------------------------------------------------------------------------- rendering and schemas


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_renders_the_expected_objects(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered[variant]}
    expected = {
        ("Namespace", NAMESPACE),
        ("ServiceAccount", NAME),
        ("Deployment", NAME),
        ("Service", NAME),
        ("PodDisruptionBudget", NAME),
        ("MutatingWebhookConfiguration", NAME),
        ("ValidatingWebhookConfiguration", NAME),
    }
    if variant.startswith("cert-manager"):
        expected |= {("Issuer", "gpu-webhook-selfsigned"), ("Certificate", "gpu-webhook-ca")}
        expected |= {("Issuer", "gpu-webhook-ca"), ("Certificate", "gpu-webhook-serving")}
    if variant.startswith("self-managed"):
        expected.add(("Secret", "gpu-webhook-tls"))
    if variant.endswith("+components"):
        expected |= {("ServiceMonitor", NAME), ("RuntimeClass", "nvidia")}
        expected |= {("ClusterRole", "gpu-webhook-cluster-awareness")}
        expected |= {("ClusterRoleBinding", "gpu-webhook-cluster-awareness")}
        expected |= {("ConfigMap", "gpu-webhook-dashboard"), ("PrometheusRule", NAME)}
    assert expected <= kinds, f"missing: {expected - kinds}"
    configmaps = [n for k, n in kinds if k == "ConfigMap" and n != "gpu-webhook-dashboard"]
    assert len(configmaps) == 1 and configmaps[0].startswith("gpu-webhook-rules")
    assert len(kinds) == len(expected) + 1, f"unexpected objects: {kinds - expected}"


def _validation_versions() -> list[str]:
    import kubernetes_validate

    latest = kubernetes_validate.latest_version()
    return ["1.30.0"] if latest.startswith("1.30") else ["1.30.0", latest]


@pytest.fixture(scope="module")
def kv() -> Any:
    return pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("version", ["1.30.0", "latest"])
def test_core_objects_validate_strictly(
    rendered: dict[str, list[dict[str, Any]]], kv: Any, variant: str, version: str
) -> None:
    k8s_version = kv.latest_version() if version == "latest" else version
    errors = strict_errors(kv, rendered[variant], k8s_version)
    assert not errors, f"against Kubernetes {k8s_version}:\n" + "\n".join(errors)


def test_strict_validation_rejects_a_misspelled_field(rendered: dict[str, list[dict[str, Any]]], kv: Any) -> None:
    """The validator really checks: a typo that the API server would silently drop is an error here."""
    import copy

    doc = copy.deepcopy(deployment(rendered["cert-manager"]))
    doc["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(doc, "1.30.0", strict=True)


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_only_known_crd_objects_skip_schema_validation(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    crd = sorted((d["apiVersion"], d["kind"]) for d in rendered[variant] if group_of(d) in CRD_GROUPS)
    allowed = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
    allowed |= {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
    assert set(crd) <= allowed


# ------------------------------------------------------------------------------------ webhook configurations


@dataclass(frozen=True)
class HookCase:
    """One webhook of one rendered variant, with what the issue fixes for it."""

    docs: list[dict[str, Any]]
    variant: str
    kind: str
    name: str
    path: str
    failure_policy: str

    @property
    def config(self) -> dict[str, Any]:
        return only(self.docs, self.kind, NAME)

    @property
    def hook(self) -> dict[str, Any]:
        hooks = self.config["webhooks"]
        assert [h["name"] for h in hooks] == [self.name]
        return dict(hooks[0])


WEBHOOKS = {
    "mutating": ("MutatingWebhookConfiguration", "mutate.gpu-webhook.io", "/mutate", "Ignore"),
    "validating": ("ValidatingWebhookConfiguration", "validate.gpu-webhook.io", "/validate", "Fail"),
}


@pytest.fixture(params=[(v, w) for v in DEPLOYABLE for w in WEBHOOKS], ids=lambda p: f"{p[0]}-{p[1]}")
def case(request: pytest.FixtureRequest, rendered: dict[str, list[dict[str, Any]]]) -> HookCase:
    variant, webhook = request.param
    return HookCase(rendered[variant], variant, *WEBHOOKS[webhook])


def test_webhook_calls_the_service_on_its_tls_port_and_path(case: HookCase) -> None:
    service_ref = case.hook["clientConfig"]["service"]
    service = only(case.docs, "Service", NAME)
    assert service_ref["path"] == case.path
    assert (service_ref["name"], service_ref["namespace"]) == (
        service["metadata"]["name"],
        service["metadata"]["namespace"],
    )
    port = next(p for p in service["spec"]["ports"] if p["port"] == service_ref.get("port", 443))
    assert container_port(case.docs, port["targetPort"]) == 8443


def test_webhook_fixed_choices(case: HookCase) -> None:
    hook = case.hook
    assert len(hook["name"].split(".")) >= 3
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["failurePolicy"] == case.failure_policy
    assert 1 <= hook["timeoutSeconds"] <= 5
    if case.kind == "MutatingWebhookConfiguration":
        assert hook["reinvocationPolicy"] == "IfNeeded"


@pytest.mark.parametrize(
    ("labels", "called"),
    [
        pytest.param({"kubernetes.io/metadata.name": "team-a"}, True, id="tenant-namespace"),
        pytest.param({"kubernetes.io/metadata.name": "kube-system"}, False, id="kube-system"),
        pytest.param({"kubernetes.io/metadata.name": "kube-node-lease"}, False, id="kube-node-lease"),
        pytest.param({"kubernetes.io/metadata.name": "OWN"}, False, id="own-namespace"),
        pytest.param({"kubernetes.io/metadata.name": "team-a", OPT_OUT_LABEL: ""}, False, id="opted-out"),
        pytest.param({"kubernetes.io/metadata.name": "team-a", OPT_OUT_LABEL: "true"}, False, id="opted-out-true"),
    ],
)
def test_webhook_namespace_selector(case: HookCase, labels: dict[str, str], called: bool) -> None:
    own = deployment(case.docs)["metadata"]["namespace"]
    labels = {k: (own if v == "OWN" else v) for k, v in labels.items()}
    selector = case.hook["namespaceSelector"]
    assert selector_matches(selector, labels) is called
    opt_out = [e for e in selector["matchExpressions"] if e["key"] == OPT_OUT_LABEL]
    assert opt_out == [{"key": OPT_OUT_LABEL, "operator": "DoesNotExist"}]


def test_webhook_skips_mirror_pods(case: HookCase) -> None:
    conditions = case.hook.get("matchConditions") or []
    mirror = "'kubernetes.io/config.mirror' in object.metadata.annotations"
    assert any(mirror in c["expression"] for c in conditions)
    assert all(c["expression"].startswith("!") for c in conditions), "conditions may only exclude"


def test_webhook_trust_anchor(case: HookCase, work: Path) -> None:
    client_config = case.hook["clientConfig"]
    if case.variant.startswith("cert-manager"):
        ref = case.config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        namespace, cert_name = ref.split("/")
        cert = only(case.docs, "Certificate", cert_name)
        assert cert["metadata"]["namespace"] == namespace
        # Injected from the CA Certificate itself: a renewed CA reaches the caBundle before any leaf it signs.
        assert cert["spec"]["isCA"] is True
        serving = [c for c in case.docs if c["kind"] == "Certificate" and c["spec"]["secretName"] ==
                   tls_secret_name(case.docs)]
        assert len(serving) == 1 and serving[0]["spec"]["issuerRef"]["name"] in {
            d["metadata"]["name"] for d in case.docs
            if d["kind"] == "Issuer" and d["spec"].get("ca", {}).get("secretName") == cert["spec"]["secretName"]}
        assert "caBundle" not in client_config, "cert-manager's CA injector owns caBundle"
    else:
        assert base64.b64decode(client_config["caBundle"]) == (work / "ca.pem").read_bytes()


@pytest.mark.parametrize("variant", DEPLOYABLE)
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        pytest.param("MutatingWebhookConfiguration",
                     {("", "v1", "pods", "CREATE"), ("resource.k8s.io", "v1", "resourceclaims", "CREATE"),
                      ("resource.k8s.io", "v1", "resourceclaimtemplates", "CREATE")}, id="mutating"),
        pytest.param(
            "ValidatingWebhookConfiguration",
            {("", "v1", "pods", "CREATE")}
            | {
                (group, "v1", resource, op)
                for group, resources in {
                    "apps": ("deployments", "replicasets", "statefulsets", "daemonsets"),
                    "batch": ("jobs", "cronjobs"),
                    "": ("replicationcontrollers", "podtemplates"),
                    "resource.k8s.io": ("resourceclaims", "resourceclaimtemplates"),
                }.items()
                for resource in resources
                for op in ("CREATE", "UPDATE")
            },
            id="validating",
        ),
    ],
)
def test_webhook_rules(
    rendered: dict[str, list[dict[str, Any]]], variant: str, kind: str, expected: set[tuple[str, ...]]
) -> None:
    (hook,) = only(rendered[variant], kind, NAME)["webhooks"]
    matched = {
        (group, version, resource, op)
        for rule in hook["rules"]
        for group in rule["apiGroups"]
        for version in rule["apiVersions"]
        for resource in rule["resources"]
        for op in rule["operations"]
    }
    assert matched == expected
    assert all(rule.get("scope") == "Namespaced" for rule in hook["rules"])


# ------------------------------------------------------------------------------- Deployment, Service, PDB


def tls_secret_name(docs: list[dict[str, Any]]) -> str:
    volumes = {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in container(docs)["volumeMounts"] if m["mountPath"] == "/etc/gpu-webhook/tls")
    name: str = volumes[mount["name"]]["secret"]["secretName"]
    return name


@pytest.mark.parametrize("variant", DEPLOYABLE)
@pytest.mark.parametrize(
    ("probe", "path"),
    [
        pytest.param("readinessProbe", "/readyz", id="readiness"),
        pytest.param("livenessProbe", "/healthz", id="liveness"),
    ],
)
def test_probes_hit_the_real_endpoints_over_https(
    rendered: dict[str, list[dict[str, Any]]], variant: str, probe: str, path: str
) -> None:
    docs = rendered[variant]
    get = container(docs)[probe]["httpGet"]
    assert (get["path"], get["scheme"], get["port"]) == (path, "HTTPS", "https")
    assert container_port(docs, get["port"]) == 8443


@pytest.mark.parametrize("variant", DEPLOYABLE)
@pytest.mark.parametrize(
    ("service_port", "target"),
    [pytest.param(443, 8443, id="https-443-to-8443"), pytest.param(9090, 9090, id="metrics-9090")],
)
def test_service_ports_reach_the_container(
    rendered: dict[str, list[dict[str, Any]]], variant: str, service_port: int, target: int
) -> None:
    docs = rendered[variant]
    service = only(docs, "Service", NAME)
    port = next(p for p in service["spec"]["ports"] if p["port"] == service_port)
    assert container_port(docs, port["targetPort"]) == target
    pod_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, pod_labels)


@pytest.mark.parametrize("variant", DEPLOYABLE)
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("spec.securityContext.runAsNonRoot", True, id="pod-runAsNonRoot"),
        pytest.param("spec.securityContext.runAsUser", 65532, id="pod-runAsUser"),
        pytest.param("spec.securityContext.seccompProfile.type", "RuntimeDefault", id="pod-seccomp"),
        pytest.param("container.securityContext.runAsNonRoot", True, id="runAsNonRoot"),
        pytest.param("container.securityContext.runAsUser", 65532, id="runAsUser"),
        pytest.param("container.securityContext.readOnlyRootFilesystem", True, id="readOnlyRootFilesystem"),
        pytest.param("container.securityContext.allowPrivilegeEscalation", False, id="no-privilege-escalation"),
        pytest.param("container.securityContext.capabilities.drop", ["ALL"], id="drop-all-capabilities"),
        pytest.param("container.securityContext.seccompProfile.type", "RuntimeDefault", id="seccomp"),
        pytest.param("spec.priorityClassName", "system-cluster-critical", id="priority"),
        pytest.param("spec.serviceAccountName", NAME, id="service-account"),
    ],
)
def test_pod_choices(rendered: dict[str, list[dict[str, Any]]], variant: str, path: str, expected: Any) -> None:
    docs = rendered[variant]
    node: Any = {"spec": deployment(docs)["spec"]["template"]["spec"], "container": container(docs)}
    for part in path.split("."):
        node = node[part]
    assert node == expected


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_service_account_token_only_with_cluster_awareness(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    docs = rendered[variant]
    pod = deployment(docs)["spec"]["template"]["spec"]
    roles = [d for d in docs if d["kind"] in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}]
    if variant.endswith("+components"):
        assert pod["automountServiceAccountToken"] is True
        role = only(docs, "ClusterRole")
        assert {v for r in role["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
        granted = {(g, res) for r in role["rules"] for g in r["apiGroups"] for res in r["resources"]}
        assert granted == {("", "nodes"), ("", "namespaces"), ("node.k8s.io", "runtimeclasses"),
                           ("resource.k8s.io", "resourceclaimtemplates"), ("resource.k8s.io", "resourceslices"),
                           ("resource.k8s.io", "deviceclasses"), ("resource.k8s.io", "resourceclaims")}
        watched = {(s.versions[0][0].rpartition("/")[0], s.name) for s in kube.sources(ApiClient())}
        assert granted == watched, "get/list/watch on exactly what the inventory watches"
        binding = only(docs, "ClusterRoleBinding")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": pod["serviceAccountName"],
                "namespace": deployment(docs)["metadata"]["namespace"],
            }
        ]
    else:
        assert pod["automountServiceAccountToken"] is False
        assert only(docs, "ServiceAccount", NAME)["automountServiceAccountToken"] is False
        assert roles == [], "the base needs no Kubernetes API access"


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_resources_have_requests_and_limits(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    resources = container(rendered[variant])["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), kind


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_replicas_spread_across_nodes(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    dep = deployment(rendered[variant])
    pod = dep["spec"]["template"]
    assert dep["spec"]["replicas"] >= 2
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    hard = [
        c
        for c in pod["spec"].get("topologySpreadConstraints", [])
        if c["topologyKey"] == "kubernetes.io/hostname" and c["whenUnsatisfiable"] == "DoNotSchedule"
    ]
    anti = pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
    anti_terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    spread = hard + [t for t in anti_terms if t["topologyKey"] == "kubernetes.io/hostname"]
    assert spread, "replicas must be spread across nodes"
    assert all(selector_matches(c["labelSelector"], pod["metadata"]["labels"]) for c in spread)
    assert all(c.get("maxSkew", 1) == 1 for c in hard)


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_pdb_selects_the_webhook_pods(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    docs = rendered[variant]
    pdb = only(docs, "PodDisruptionBudget", NAME)
    dep = deployment(docs)
    assert pdb["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert selector_matches(pdb["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])
    assert pdb["spec"]["minAvailable"] == 1 < dep["spec"]["replicas"]


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_graceful_termination_outlasts_the_drain(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    """The kubelet counts the preStop sleep in the grace period; then come the shutdown delay and the drain."""
    spec = deployment(rendered[variant])["spec"]["template"]["spec"]
    pre_stop = container(rendered[variant])["lifecycle"]["preStop"]["sleep"]["seconds"]
    settings = server_module("webhook.admission.settings").Settings()
    longest = max(settings.shutdown_delay_seconds, settings.shutdown_delay_max_seconds)
    assert spec["terminationGracePeriodSeconds"] > pre_stop + longest + GUNICORN_GRACEFUL_TIMEOUT


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_command_and_mounts(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    docs = rendered[variant]
    c = container(docs)
    assert c["command"] + c["args"] == [
        "gpu-webhook",
        "serve",
        "--rules",
        "/etc/gpu-webhook/rules",
        "--tls-dir",
        "/etc/gpu-webhook/tls",
    ]
    volumes = {v["name"]: v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    rules = volumes[mounts["/etc/gpu-webhook/rules"]["name"]]
    configmap = rules_configmap(docs)
    assert rules["configMap"]["name"] == configmap["metadata"]["name"]
    assert "items" not in rules["configMap"], "mount every rule file, not a chosen subset"
    assert tls_secret_name(docs) == "gpu-webhook-tls"
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]], "/tmp must be writable with a read-only root"
    assert mounts["/etc/gpu-webhook/rules"].get("readOnly") and mounts["/etc/gpu-webhook/tls"].get("readOnly")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_subpath_anywhere(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    """A subPath mount never sees ConfigMap or Secret updates (kubernetes#50345)."""
    offenders = [
        f"{d['kind']}/{d['metadata']['name']}{p}"
        for d in rendered[variant]
        for p, _ in walk(d)
        if p.endswith((".subPath", ".subPathExpr"))
    ]
    assert offenders == []


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_namespaced_objects_live_in_the_webhook_namespace(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "RuntimeClass",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for doc in rendered[variant]:
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"], doc["kind"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, f"{doc['kind']}/{doc['metadata']['name']}"


# ---------------------------------------------------------------------------------------------- rules


def rule_files() -> list[Path]:
    """What the server's loader reads from its rules directory (*.yaml, *.yml)."""
    return sorted(p for p in (REPO / "rules").iterdir() if re.fullmatch(r".*\.ya?ml", p.name))


def test_rules_directory_holds_no_kustomization_the_loader_would_read() -> None:
    assert not any(p.name.startswith("kustomization") for p in rule_files())
    assert (REPO / "rules" / "Kustomization").is_file()


@pytest.mark.parametrize("variant", DEPLOYABLE)
def test_configmap_carries_every_rule_file_verbatim(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    data = rules_configmap(rendered[variant])["data"]
    assert rule_files(), "rules/ has no rule file"
    assert data == {p.name: p.read_text() for p in rule_files()}


def test_a_rule_edit_applied_with_kustomize_rolls_the_pods(tmp_path: Path) -> None:
    """What the README and docs/deploy.md promise for `kubectl apply -k`: the ConfigMap's name carries a hash of
    the rules, so an edit makes a new ConfigMap and changes the Deployment's pod template, which rolls the Pods.
    (An edit of the mounted ConfigMap in place is reloaded without a restart: tests/admission/test_app.py.)"""
    ignore = shutil.ignore_patterns("*.crt", "*.key", "*.pem", "__pycache__")
    shutil.copytree(REPO / "manifests", tmp_path / "manifests", ignore=ignore)
    shutil.copytree(REPO / "rules", tmp_path / "rules", ignore=ignore)
    overlay = tmp_path / "manifests/overlays/cert-manager"

    def names() -> tuple[str, str]:
        objects = _kustomize(overlay)
        config_map = rules_configmap(objects)["metadata"]["name"]
        volumes = only(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
        mounted = next(v["configMap"]["name"] for v in volumes if "configMap" in v)
        return config_map, mounted

    before, mounted_before = names()
    rules = tmp_path / "rules/gpu-policy.yaml"
    rules.write_text(rules.read_text().replace("enforcement: {}", "enforcement: {gpu-node-name-preset: deny}"))
    after, mounted_after = names()
    assert before.startswith("gpu-webhook-rules-") and after.startswith("gpu-webhook-rules-")
    assert before != after, "the ConfigMap name must change with the rules"
    assert (mounted_before, mounted_after) == (before, after), "the Deployment mounts the new ConfigMap"


# ------------------------------------------------------------------------------------------- cert-manager


def serving_dns_names(service: str, namespace: str) -> set[str]:
    return {service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"}


@pytest.mark.parametrize("variant", ["cert-manager", "cert-manager+components"])
def test_certificate_chain(rendered: dict[str, list[dict[str, Any]]], variant: str) -> None:
    docs = rendered[variant]
    service = only(docs, "Service", NAME)
    serving = only(docs, "Certificate", "gpu-webhook-serving")["spec"]
    names = set(serving["dnsNames"])
    svc, ns = service["metadata"]["name"], service["metadata"]["namespace"]
    assert f"{svc}.{ns}.svc" in names, "the API server verifies <svc>.<ns>.svc"
    assert names == serving_dns_names(svc, ns)
    assert serving["secretName"] == tls_secret_name(docs)
    assert serving["privateKey"]["rotationPolicy"] == "Always"
    ca_issuer = only(docs, "Issuer", serving["issuerRef"]["name"])
    assert serving["issuerRef"]["kind"] == "Issuer"
    ca_cert = next(d for d in docs if d["kind"] == "Certificate" and d["spec"].get("isCA"))
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"] != serving["secretName"]
    assert ca_cert["spec"]["privateKey"]["algorithm"] == "ECDSA"
    assert ca_cert["spec"]["privateKey"]["rotationPolicy"] == "Never", "the renewed CA keeps its key (docs/deploy.md)"
    assert "selfSigned" in only(docs, "Issuer", ca_cert["spec"]["issuerRef"]["name"])["spec"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = only(docs, kind, NAME)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{ns}/gpu-webhook-ca"


# ------------------------------------------------------------------------------------------- self-managed


@pytest.mark.parametrize("variant", ["self-managed", "self-managed+components"])
def test_self_managed_secret_is_the_generated_pair(
    rendered: dict[str, list[dict[str, Any]]], work: Path, variant: str
) -> None:
    from cryptography import x509

    secret = only(rendered[variant], "Secret", "gpu-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    tls_dir = work / "manifests/overlays/self-managed/tls"
    for key in secret["data"]:
        assert base64.b64decode(secret["data"][key]) == (tls_dir / key).read_bytes()
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf.verify_directly_issued_by(ca)


def test_self_managed_overlay_refuses_to_render_without_certificates(tmp_path: Path) -> None:
    shutil.copytree(REPO / "manifests", tmp_path / "manifests", ignore=shutil.ignore_patterns("tls"))
    shutil.copytree(REPO / "rules", tmp_path / "rules")
    assert KUBECTL is not None
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(tmp_path / "manifests/overlays/self-managed")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0 and "tls" in proc.stderr


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        pytest.param("manifests/overlays/self-managed/tls/tls.key", True, id="overlay-key"),
        pytest.param("manifests/overlays/self-managed/tls/ca.crt", True, id="overlay-ca"),
        pytest.param("certs/ca.key", True, id="certs-ca-key"),
        pytest.param("certs/tls.key", True, id="certs-key"),
        pytest.param("certs/README.md", False, id="certs-readme"),
        pytest.param("certs/.gitignore", False, id="certs-gitignore"),
        pytest.param("manifests/overlays/self-managed/kustomization.yaml", False, id="overlay-kustomization"),
    ],
)
def test_keys_are_never_committed(path: str, ignored: bool) -> None:
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run([git, "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False, timeout=30)
    assert proc.returncode == (0 if ignored else 1)


# ---------------------------------------------------------------------------------------------- components


def test_servicemonitor_scrapes_the_metrics_port(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["cert-manager+components"]
    monitor = only(docs, "ServiceMonitor", NAME)["spec"]
    service = only(docs, "Service", NAME)
    assert selector_matches(monitor["selector"], service["metadata"]["labels"])
    assert service["metadata"]["namespace"] in monitor["namespaceSelector"]["matchNames"]
    (endpoint,) = monitor["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("metrics", "/metrics", "http")
    port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
    assert container_port(docs, port["targetPort"]) == 9090


def test_runtimeclass_nvidia(rendered: dict[str, list[dict[str, Any]]]) -> None:
    runtime_class = only(rendered["self-managed+components"], "RuntimeClass", "nvidia")
    assert runtime_class["handler"] == "nvidia"
    assert "scheduling" not in runtime_class, "a scheduling.nodeSelector could conflict with the GPU classes"


# --------------------------------------------------------------------------- agreement with the server code


def test_ports_and_drain_agree_with_settings(rendered: dict[str, list[dict[str, Any]]]) -> None:
    settings = server_module("webhook.admission.settings").Settings()
    docs = rendered["cert-manager"]
    assert container_port(docs, "https") == settings.port
    assert container_port(docs, "metrics") == settings.metrics_port
    grace = deployment(docs)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.shutdown_delay_max_seconds + settings.graceful_timeout_seconds


def test_every_env_var_is_read_by_the_server(rendered: dict[str, list[dict[str, Any]]]) -> None:
    settings_mod = server_module("webhook.admission.settings")
    env = {e["name"]: e["value"] for e in container(rendered["cert-manager"])["env"]}
    configured = settings_mod.Settings.from_env(env)
    assert configured.port == 8443
    defaults = settings_mod.Settings.from_env({})
    for name in env:
        assert name.startswith("GPU_WEBHOOK_")
        try:
            changed = settings_mod.Settings.from_env({name: "12345-not-a-default"}) != defaults
        except settings_mod.SettingsError:
            changed = True  # rejected: so it is read
        assert changed, f"{name} is not read by Settings.from_env"


def test_certificate_names_agree_with_the_certs_module(rendered: dict[str, list[dict[str, Any]]]) -> None:
    certs = server_module("webhook.admission.certs")
    serving = only(rendered["cert-manager"], "Certificate", "gpu-webhook-serving")
    assert set(serving["spec"]["dnsNames"]) == set(certs.service_dns_names(NAME, NAMESPACE))


def test_routes_agree_with_the_app() -> None:
    app_mod = server_module("webhook.admission.app")
    settings_mod = server_module("webhook.admission.settings")
    app = app_mod.create_app(settings_mod.Settings())
    routes = {rule.rule: rule.methods for rule in app.url_map.iter_rules()}
    for path, method in [("/mutate", "POST"), ("/validate", "POST"), ("/healthz", "GET"), ("/readyz", "GET")]:
        assert path in routes, f"{path} is not routed"
        assert method in routes[path]


# ------------------------------------------------------------------------------ examples in docs/deploy.md


def doc_yaml_block(marker: str) -> str:
    """The ```yaml block of docs/deploy.md that contains `marker`."""
    text = (REPO / "docs" / "deploy.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if marker in b]
    assert len(blocks) == 1, f"expected one yaml block containing {marker!r} in docs/deploy.md"
    return blocks[0]


def test_documented_rollout_overlay_narrows_and_fails_open(work: Path) -> None:
    directory = work / "manifests/overlays/rollout"
    directory.mkdir(exist_ok=True)
    (directory / "kustomization.yaml").write_text(doc_yaml_block("# manifests/overlays/rollout/kustomization.yaml"))
    docs = _kustomize(directory)
    tenant = {"kubernetes.io/metadata.name": "team-a"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = only(docs, kind, NAME)["webhooks"]
        assert hook["failurePolicy"] == "Ignore"
        assert not selector_matches(hook["namespaceSelector"], tenant)
        assert selector_matches(hook["namespaceSelector"], {**tenant, "gpu-webhook.io/rollout": "true"})
        assert not selector_matches(
            hook["namespaceSelector"], {"kubernetes.io/metadata.name": "kube-system", "gpu-webhook.io/rollout": "true"}
        )


def test_documented_opt_out_guard_policy_validates(kv: Any) -> None:
    for doc in yaml.safe_load_all(doc_yaml_block("kind: ValidatingAdmissionPolicy")):
        kv.validate(doc, "1.30.0", strict=True)


def test_cluster_awareness_role_is_what_the_inventory_watches(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The ClusterRole and webhook.cluster.kube's watched collections agree, in both directions."""
    kube = server_module("webhook.cluster.kube")
    role = only(rendered["cert-manager+components"], "ClusterRole", "gpu-webhook-cluster-awareness")
    granted = {(g, res) for r in role["rules"] for g in r["apiGroups"] for res in r["resources"]}
    watched = set()
    for source in kube.sources(kube.k8s.ApiClient()):
        group = source.versions[0][0].rpartition("/")[0]
        watched.add((group, source.name))
    assert granted == watched
