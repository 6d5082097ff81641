"""The Helm chart (charts/gpu-webhook), rendered and linted by the real helm.

helm is built from the Go module proxy by tests/e2e/build_helm.sh (cached outside the repository; a warm run takes
well under a second). Without Go, or when the build fails, these tests skip and say why, except on CI (CI=true),
where they fail.

Every documented values combination is rendered with `helm template` and validated against the Kubernetes OpenAPI
schemas (kubernetes-validate --strict); the values schema is shown to reject a mistyped rule field by name; and the
chart rendered with its defaults is compared with `kubectl kustomize manifests/overlays/cert-manager` (and both with
every optional component on), object by object and field by field: every difference is listed in INTENDED with its
reason, and every entry there still occurs.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.manifests import strict_errors

from webhook.admission.loader import load_policy
from webhook.policy import native, native_cel

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpu-webhook"
BUILD_HELM = REPO / "tests" / "e2e" / "build_helm.sh"
BUILD_E2E = REPO / "tests" / "e2e" / "build.sh"
RELEASE = "gpu-webhook"
NAMESPACE = "gpu-system"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
PACKAGED_RULES = load_policy(REPO / "rules")
COMPONENTS_ON = {"clusterAwareness": {"enabled": True}, "serviceMonitor": {"enabled": True},
                 "runtimeClass": {"create": True},
                 "monitoring": {"dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}

Doc = dict[str, Any]


def _on_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    """Skip with the reason; on CI, fail: a missing tool must not turn the chart's tests off there."""
    if _on_ci():
        pytest.fail(f"{reason} (CI=true: not skipping)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary built by tests/e2e/build_helm.sh."""
    if shutil.which("go") is None:
        _unavailable("no Go toolchain on PATH: helm is built from helm.sh/helm/v4 by tests/e2e/build_helm.sh")
    done = subprocess.run(["bash", str(BUILD_HELM)], capture_output=True, text=True, timeout=3600, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        _unavailable(f"tests/e2e/build_helm.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
    binary = Path(lines[-1]) / "helm"
    assert binary.is_file(), f"build_helm.sh printed {lines[-1]}, which has no helm"
    return binary


@pytest.fixture(scope="session")
def kubectl() -> Path:
    """kubectl from PATH, else the one the e2e build made (never built here)."""
    found = shutil.which("kubectl")
    if found:
        return Path(found)
    done = subprocess.run(["bash", str(BUILD_E2E), "--print-dir"], capture_output=True, text=True, check=False)
    candidate = Path(done.stdout.strip()) / "kubectl"
    if done.returncode == 0 and candidate.is_file():
        return candidate
    pytest.skip("kubectl is not on PATH and tests/e2e/build.sh has not built one: needed for `kubectl kustomize`")


@dataclass(frozen=True)
class Helm:
    """Runs helm on the chart with values given as a dict (written to a file, as a user would pass -f)."""

    binary: Path
    workdir: Path

    def run(self, *args: str, values: Doc | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        extra: list[str] = []
        if values is not None:
            path = self.workdir / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
            path.write_text(yaml.safe_dump(values))
            extra = ["-f", str(path)]
        env = {**os.environ, "HELM_CACHE_HOME": str(self.workdir / "cache"),
               "HELM_CONFIG_HOME": str(self.workdir / "config"), "HELM_DATA_HOME": str(self.workdir / "data")}
        env.pop("KUBECONFIG", None)
        done = subprocess.run([str(self.binary), *args, *extra], capture_output=True, text=True, timeout=120,
                              check=False, env=env)
        if check:
            assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
        return done

    def template(self, values: Doc | None = None, *args: str) -> list[Doc]:
        done = self.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args, values=values)
        return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="session")
def chart(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm, tmp_path_factory.mktemp("helm"))


def only(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def kinds(docs: list[Doc]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}



# ---------------------------------------------------------------------------------------- values combinations


@pytest.fixture(scope="session")
def provided_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt, tls.crt, tls.key, ca-bundle.b64 as `gpu-webhook certs` writes them for gpu-webhook.gpu-system."""
    out = tmp_path_factory.mktemp("certs")
    subprocess.run([sys.executable, "-m", "webhook", "certs", "--service", RELEASE, "--namespace", NAMESPACE,
                    "--out", str(out)], check=True, capture_output=True, cwd=REPO, timeout=60)
    return out


def variants(certs: Path) -> dict[str, Doc]:
    """The values combinations docs/deploy.md documents, by name."""
    pem = {name: (certs / name).read_text() for name in ("ca.crt", "tls.crt", "tls.key", "ca-bundle.b64")}
    provided = {"caCert": pem["ca.crt"], "tlsCert": pem["tls.crt"], "tlsKey": pem["tls.key"]}
    return {
        "default": {},
        "cert-manager-issuer": {"certificates": {"certManager": {
            "issuerRef": {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "internal-ca"}}}},
        "generate": {"certificates": {"mode": "generate"}},
        "provided": {"certificates": {"mode": "provided", "provided": provided}},
        "provided-existing-secret": {"certificates": {"mode": "provided", "provided": {
            "caBundle": pem["ca-bundle.b64"], "existingSecret": "my-webhook-tls"}}},
        "url": {"webhook": {"url": "https://192.0.2.10:8443"},
                "certificates": {"mode": "provided", "provided": {"caCert": pem["ca.crt"]}}},
        "cluster-awareness": {"clusterAwareness": {"enabled": True}},
        "servicemonitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
        "runtimeclass": {"runtimeClass": {"create": True}},
        "monitoring": {"monitoring": {"dashboard": {"enabled": True, "labels": {"grafana_dashboard": "1"}},
                                      "prometheusRule": {"enabled": True,
                                                         "labels": {"release": "kube-prometheus-stack"}}}},
        "namespace": {"namespace": {"create": True}},
        "all-components": copy.deepcopy(COMPONENTS_ON),
    }


VARIANT_NAMES = ["default", "cert-manager-issuer", "generate", "provided", "provided-existing-secret", "url",
                 "cluster-awareness", "servicemonitor", "runtimeclass", "monitoring", "namespace", "all-components"]


@pytest.fixture(scope="session")
def rendered(chart: Helm, provided_certs: Path) -> dict[str, list[Doc]]:
    all_variants = variants(provided_certs)
    assert sorted(all_variants) == sorted(VARIANT_NAMES)
    return {name: chart.template(values) for name, values in all_variants.items()}


SERVER = {("ServiceAccount", RELEASE), ("ConfigMap", "gpu-webhook-rules"), ("Service", RELEASE),
          ("Deployment", RELEASE), ("PodDisruptionBudget", RELEASE)}
HOOKS = {(kind, RELEASE) for kind in WEBHOOK_KINDS}
CERT_MANAGER = {("Issuer", "gpu-webhook-selfsigned"), ("Certificate", "gpu-webhook-ca"),
                ("Issuer", "gpu-webhook-ca"), ("Certificate", "gpu-webhook-serving")}
MONITORING = {("ConfigMap", "gpu-webhook-dashboard"), ("PrometheusRule", RELEASE)}
RBAC = {("ClusterRole", "gpu-webhook-cluster-awareness"), ("ClusterRoleBinding", "gpu-webhook-cluster-awareness")}
EXPECTED_OBJECTS: dict[str, set[tuple[str, str]]] = {
    "default": SERVER | HOOKS | CERT_MANAGER,
    "cert-manager-issuer": SERVER | HOOKS | {("Certificate", "gpu-webhook-serving")},
    "generate": SERVER | HOOKS | {("Secret", "gpu-webhook-ca"), ("Secret", "gpu-webhook-tls")},
    "provided": SERVER | HOOKS | {("Secret", "gpu-webhook-tls")},
    "provided-existing-secret": SERVER | HOOKS,
    "url": HOOKS,
    "cluster-awareness": SERVER | HOOKS | CERT_MANAGER | RBAC,
    "servicemonitor": SERVER | HOOKS | CERT_MANAGER | {("ServiceMonitor", RELEASE)},
    "runtimeclass": SERVER | HOOKS | CERT_MANAGER | {("RuntimeClass", "nvidia")},
    "monitoring": SERVER | HOOKS | CERT_MANAGER | MONITORING,
    "namespace": SERVER | HOOKS | CERT_MANAGER | {("Namespace", NAMESPACE)},
    "all-components": SERVER | HOOKS | CERT_MANAGER | RBAC | MONITORING
                      | {("ServiceMonitor", RELEASE), ("RuntimeClass", "nvidia")},
}


def test_lint_strict(chart: Helm) -> None:
    done = chart.run("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in done.stdout, done.stdout


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_lint_strict_with_each_variant(chart: Helm, provided_certs: Path, variant: str) -> None:
    done = chart.run("lint", "--strict", "--namespace", NAMESPACE, str(CHART), values=variants(provided_certs)[variant])
    assert "0 chart(s) failed" in done.stdout, done.stdout


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_variant_renders_the_expected_objects(rendered: dict[str, list[Doc]], variant: str) -> None:
    docs = rendered[variant]
    assert kinds(docs) == EXPECTED_OBJECTS[variant]
    assert len(docs) == len(EXPECTED_OBJECTS[variant]), "an object is rendered twice"
    for doc in docs:
        if doc["kind"] not in ("Namespace", "RuntimeClass", "ClusterRole", "ClusterRoleBinding", *WEBHOOK_KINDS):
            assert doc["metadata"]["namespace"] == NAMESPACE, f"{doc['kind']} is not in the release namespace"


@pytest.fixture(scope="module")
def kv() -> Any:
    return pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")


@pytest.mark.parametrize("variant", VARIANT_NAMES)
@pytest.mark.parametrize("version", ["1.30.0", "latest"])
def test_variant_validates_strictly(rendered: dict[str, list[Doc]], kv: Any, variant: str, version: str) -> None:
    k8s_version = kv.latest_version() if version == "latest" else version
    errors = strict_errors(kv, rendered[variant], k8s_version)
    assert not errors, f"against Kubernetes {k8s_version}:\n" + "\n".join(errors)


# ------------------------------------------------------------------------------------------- certificate modes


def _hooks(docs: list[Doc]) -> list[Doc]:
    out = []
    for kind in WEBHOOK_KINDS:
        (hook,) = only(docs, kind, RELEASE)["webhooks"]
        out.append(hook)
    return out


def test_cert_manager_mode_injects_the_ca_from_the_ca_certificate(rendered: dict[str, list[Doc]]) -> None:
    docs = rendered["default"]
    for kind in WEBHOOK_KINDS:
        config = only(docs, kind, RELEASE)
        injected = {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/gpu-webhook-ca"}
        assert config["metadata"]["annotations"] == injected
        assert "caBundle" not in config["webhooks"][0]["clientConfig"], "the CA injector owns caBundle"
    serving = only(docs, "Certificate", "gpu-webhook-serving")["spec"]
    assert serving["secretName"] == "gpu-webhook-tls"
    assert f"{RELEASE}.{NAMESPACE}.svc" in serving["dnsNames"]
    assert serving["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer", "name": "gpu-webhook-ca"}
    secret_volume = only(docs, "Deployment")["spec"]["template"]["spec"]["volumes"][1]["secret"]
    assert secret_volume["secretName"] == "gpu-webhook-tls"


def test_cert_manager_mode_with_an_issuer_of_your_own(rendered: dict[str, list[Doc]]) -> None:
    serving = only(rendered["cert-manager-issuer"], "Certificate", "gpu-webhook-serving")["spec"]
    assert serving["issuerRef"] == {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "internal-ca"}
    # No CA Certificate of the chart: the CA is what the serving Secret's ca.crt holds.
    for kind in WEBHOOK_KINDS:
        annotations = only(rendered["cert-manager-issuer"], kind, RELEASE)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/gpu-webhook-serving"}


def _load_cert(b64: str) -> Any:
    from cryptography import x509

    return x509.load_pem_x509_certificate(base64.b64decode(b64))


def test_generated_certificates_chain_to_the_injected_ca(rendered: dict[str, list[Doc]]) -> None:
    from cryptography import x509

    docs = rendered["generate"]
    secret = only(docs, "Secret", "gpu-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca_secret = only(docs, "Secret", "gpu-webhook-ca")
    assert ca_secret["data"]["tls.crt"] == secret["data"]["ca.crt"]
    for hook in _hooks(docs):
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"], "one CA, made once"
    leaf, ca = _load_cert(secret["data"]["tls.crt"]), _load_cert(secret["data"]["ca.crt"])
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{RELEASE}.{NAMESPACE}.svc" in names
    for item in (secret, ca_secret):
        assert int(item["metadata"]["annotations"]["gpu-webhook.io/not-after"]) > 0


def test_provided_certificates_from_gpu_webhook_certs(rendered: dict[str, list[Doc]], provided_certs: Path) -> None:
    docs = rendered["provided"]
    secret = only(docs, "Secret", "gpu-webhook-tls")
    for key in ("tls.crt", "tls.key", "ca.crt"):
        assert base64.b64decode(secret["data"][key]) == (provided_certs / key).read_bytes()
    bundle = (provided_certs / "ca-bundle.b64").read_text().strip()
    for variant in ("provided", "provided-existing-secret"):
        for hook in _hooks(rendered[variant]):
            assert hook["clientConfig"]["caBundle"] == bundle
    volume = only(rendered["provided-existing-secret"], "Deployment")["spec"]["template"]["spec"]["volumes"][1]
    assert volume["secret"]["secretName"] == "my-webhook-tls"


def test_url_mode_calls_the_url_and_installs_no_server(rendered: dict[str, list[Doc]], provided_certs: Path) -> None:
    bundle = (provided_certs / "ca-bundle.b64").read_text().strip()
    mutate, validate = _hooks(rendered["url"])
    assert mutate["clientConfig"] == {"url": "https://192.0.2.10:8443/mutate", "caBundle": bundle}
    assert validate["clientConfig"] == {"url": "https://192.0.2.10:8443/validate", "caBundle": bundle}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"webhook": {"url": "https://192.0.2.10:8443"}}, "certificates.mode=provided", id="url-needs-ca"),
        pytest.param({"certificates": {"mode": "provided"}}, "certificates.provided.caCert", id="provided-needs-ca"),
        pytest.param({"certificates": {"mode": "provided", "provided": {"caCert": "x"}}},
                     "certificates.provided.tlsCert", id="provided-needs-serving-cert"),
        pytest.param({"certificates": {"mode": "self-signed"}}, "mode", id="unknown-mode"),
        pytest.param({"webhook": {"url": "http://192.0.2.10:8443"},
                      "certificates": {"mode": "provided", "provided": {"caCert": "x"}}}, "url", id="url-not-https"),
        pytest.param({"replicaCont": 3}, "replicaCont", id="values-typo"),
        pytest.param({"webhook": {"validating": {"timeoutSeconds": 31}}}, "timeoutSeconds", id="timeout-too-long"),
        pytest.param({"webhook": {"mutating": {"failurePolicy": "ignore"}}}, "failurePolicy", id="policy-case"),
    ],
)
def test_wrong_values_are_refused_with_the_reason(chart: Helm, values: Doc, message: str) -> None:
    done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values, check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# ------------------------------------------------------------------------------------------------------ rules


def _rule_files() -> dict[str, Any]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted((REPO / "rules").glob("*.y*ml"))}


def _configmap_rules(docs: list[Doc]) -> dict[str, Any]:
    data = only(docs, "ConfigMap", "gpu-webhook-rules")["data"]
    return {name: yaml.safe_load(text) for name, text in data.items()}


def test_chart_copies_of_the_schema_and_rules_are_up_to_date() -> None:
    done = subprocess.run([sys.executable, str(REPO / "charts" / "sync_chart.py"), "--check"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$defs"]["gpuPolicy"] == json.loads((REPO / "webhook/schema/gpu-policy.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["rules"] == _rule_files()


def test_default_configmap_holds_the_shipped_rules(rendered: dict[str, list[Doc]], tmp_path: Path) -> None:
    rules = _configmap_rules(rendered["default"])
    assert rules == _rule_files()
    # The server's own loader accepts what the chart renders.
    for name, text in only(rendered["default"], "ConfigMap", "gpu-webhook-rules")["data"].items():
        (tmp_path / name).write_text(text)
    done = subprocess.run([sys.executable, "-m", "webhook", "lint", str(tmp_path)], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        pytest.param({"spec": {"gpuResourcez": {}}}, "gpuResourcez", id="spec-field"),
        pytest.param({"spec": {"classes": {"axes": {"workload": {"values": {"inference": {"nodeSelectr": {}}}}}}}},
                     "nodeSelectr", id="nested-field"),
        pytest.param({"spec": {"classes": {"axes": {"gpu-type": {"values": {"t4": {"maxGPUsPerPod": "eight"}}}}}}},
                     "maxGPUsPerPod", id="wrong-type"),
        pytest.param({"kind": "GpuPolicy"}, "kind", id="kind"),
    ],
)
def test_rule_typo_fails_helm_template_naming_the_field(chart: Helm, edit: Doc, field: str) -> None:
    import jsonschema

    values = {"rules": {"gpu-policy.yaml": edit}}
    done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values, check=False)
    assert done.returncode != 0, "helm accepted a mistyped rule file"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert field in done.stderr, done.stderr
    assert "/rules/gpu-policy.yaml" in done.stderr, done.stderr
    # The server's schema refuses the same merged document: helm checks what the server would check.
    merged = _deep_merge(_rule_files()["gpu-policy.yaml"], edit)
    schema = json.loads((REPO / "webhook/schema/gpu-policy.schema.json").read_text())
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(merged))


def _deep_merge(base: Any, over: Any) -> Any:
    """helm's coalescing of a user's values into the chart's: maps key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = _deep_merge(base.get(key), value)
        return out
    return copy.deepcopy(over)


def test_rule_edits_merge_into_the_defaults_and_roll_the_pods(chart: Helm) -> None:
    edit = {"rules": {"gpu-policy.yaml": {"spec": {"enforcement": {"gpu-limits-required": "warn"},
                                                   "gpuResources": {"amd.com/gpu": None}}}}}
    before, after = chart.template(), chart.template(edit)
    rules = _configmap_rules(after)["gpu-policy.yaml"]
    assert rules == _deep_merge(_rule_files()["gpu-policy.yaml"], edit["rules"]["gpu-policy.yaml"])
    assert rules["spec"]["enforcement"] == {"gpu-limits-required": "warn"}
    assert "amd.com/gpu" not in rules["spec"]["gpuResources"]

    def checksum(docs: list[Doc]) -> str:
        return str(only(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/rules"])

    assert checksum(before) == checksum(chart.template()), "the checksum must not change without a rule change"
    assert checksum(before) != checksum(after)
    still = chart.template({**edit, "rollOnRulesChange": False})
    assert "checksum/rules" not in only(still, "Deployment")["spec"]["template"]["metadata"]["annotations"]


def test_rule_files_can_be_replaced(chart: Helm) -> None:
    own = copy.deepcopy(_rule_files()["gpu-policy.yaml"])
    own["metadata"]["name"] = "ours"
    docs = chart.template({"rules": {"gpu-policy.yaml": None, "ours.yaml": own}})
    assert _configmap_rules(docs) == {"ours.yaml": own}
    done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                     values={"rules": {"gpu-policy.yaml": None}}, check=False)
    assert done.returncode != 0 and "rules" in done.stderr, "no rule file at all must be refused"


# ------------------------------------------------------------------------------------------------------ drift


@dataclass(frozen=True)
class Intended:
    """A difference between the chart (defaults) and the kustomize overlay that is on purpose."""

    kind: str  # regex on the kind
    path: str  # regex on the flattened field path
    change: str  # "added" (only in the chart), "removed" (only in kustomize) or "changed"
    reason: str


HELM_LABELS = r"(helm\.sh/chart|app\.kubernetes\.io/(instance|version|managed-by))"
INTENDED = [
    Intended("Namespace", r"^$", "removed",
             "the chart installs into the release namespace (`helm install -n gpu-system --create-namespace`); "
             "namespace.create=true renders it, with the same Pod Security labels, for helm template/GitOps"),
    Intended(".*", rf"^\.metadata\.labels\.{HELM_LABELS}$", "added",
             "helm's recommended labels (release, chart version, manager) on every object"),
    Intended("RuntimeClass", r"^\.metadata\.labels\.app\.kubernetes\.io/name$", "added",
             "the chart labels every object it owns with its name (the component only sets part-of)"),
    Intended("Issuer|Certificate", r"^\.metadata\.labels\.app\.kubernetes\.io/(name|part-of)$", "added",
             "the chart labels every object it owns (the overlay's certificates.yaml has no labels)"),
    Intended("Deployment", r"^\.spec\.template\.metadata\.labels\..*$", "added",
             "the Pods carry the same labels as every other object (kustomize's labels transformer skips templates)"),
    Intended("Deployment|Service|PodDisruptionBudget|ServiceMonitor",
             r"^\.spec\.((template\.spec\.topologySpreadConstraints\[\d\]\.labelSelector\.)?|selector\.)?"
             r"(matchLabels\.)?app\.kubernetes\.io/instance$", "added",
             "selectors include the release, so two releases never select each other's Pods"),
    Intended("ConfigMap", r"^\.metadata\.name$", "changed",
             "no content-hash suffix: the checksum/rules annotation on the Pod template rolls the Pods instead"),
    Intended("Deployment", r"^\.spec\.template\.spec\.volumes\[0\]\.configMap\.name$", "changed",
             "follows the ConfigMap's name (no hash suffix)"),
    Intended("Deployment", r"^\.spec\.template\.metadata\.annotations\.checksum/rules$", "added",
             "`helm upgrade` with a rule edit rolls the Pods (rollOnRulesChange)"),
]


def flatten(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Leaf paths of a document: `.a.b[0].c` -> value; empty maps and lists are leaves too."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from flatten(value, f"{path}.{key}")
    elif isinstance(node, list) and node:
        for i, value in enumerate(node):
            yield from flatten(value, f"{path}[{i}]")
    else:
        yield path, node


def _normalized(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    """Objects by (kind, name without kustomize's hash suffix); ConfigMap data parsed (comments are not carried)."""
    out = {}
    for doc in docs:
        doc = copy.deepcopy(doc)
        name = doc["metadata"]["name"]
        if doc["kind"] == "ConfigMap":
            name = re.sub(r"-[a-z0-9]{10}$", "", name)
            doc["data"] = {key: yaml.safe_load(text) for key, text in doc["data"].items()}
        out[(doc["kind"], name)] = doc
    return out


def drift(chart_docs: list[Doc], kustomized: list[Doc]) -> list[tuple[str, str, str, Any, Any]]:
    """(kind, path, change, kustomize value, chart value) for every field that differs; path "" = whole object."""
    ours, theirs = _normalized(chart_docs), _normalized(kustomized)
    found: list[tuple[str, str, str, Any, Any]] = []
    for key in sorted(ours.keys() | theirs.keys()):
        kind = key[0]
        if key not in ours or key not in theirs:
            found.append((kind, "", "removed" if key not in ours else "added", key, None))
            continue
        mine, other = dict(flatten(ours[key])), dict(flatten(theirs[key]))
        for path in sorted(mine.keys() | other.keys()):
            if path not in other:
                found.append((kind, path, "added", None, mine[path]))
            elif path not in mine:
                found.append((kind, path, "removed", other[path], None))
            elif mine[path] != other[path]:
                found.append((kind, path, "changed", other[path], mine[path]))
    return found


def _explained(item: tuple[str, str, str, Any, Any], rule: Intended) -> bool:
    kind, path, change, _, _ = item
    return bool(re.fullmatch(rule.kind, kind) and re.fullmatch(rule.path, path) and change == rule.change)


def _kustomize(kubectl: Path, directory: Path) -> list[Doc]:
    done = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_chart_and_kustomize_do_not_drift(chart: Helm, kubectl: Path, tmp_path: Path) -> None:
    """Defaults vs overlays/cert-manager, and both with every optional component: only INTENDED differences."""
    # kustomize takes only relative paths to other kustomizations: work in a copy of the tree.
    for tree in ("manifests", "rules"):
        shutil.copytree(REPO / tree, tmp_path / tree, ignore=shutil.ignore_patterns("tls", "__pycache__"))
    with_components = tmp_path / "combos" / "with-components"
    with_components.mkdir(parents=True)
    (with_components / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../manifests/overlays/cert-manager"],
        "components": [f"../../manifests/components/{c}"
                       for c in ("servicemonitor", "runtimeclass-nvidia", "cluster-awareness", "grafana-dashboard",
                                 "prometheus-rule")],
    }))
    pairs = {
        "defaults": (chart.template(), _kustomize(kubectl, tmp_path / "manifests/overlays/cert-manager")),
        "components": (chart.template(copy.deepcopy(COMPONENTS_ON)), _kustomize(kubectl, with_components)),
    }
    unexplained, used = [], set()
    for label, (chart_docs, kustomized) in pairs.items():
        assert len(kinds(chart_docs)) >= 10 and len(kinds(kustomized)) >= 10, label
        for item in drift(chart_docs, kustomized):
            rules = [i for i, rule in enumerate(INTENDED) if _explained(item, rule)]
            used.update(rules)
            if not rules:
                unexplained.append(f"{label}: {item[0]} {item[1] or '(object)'} {item[2]}: "
                                   f"kustomize={item[3]!r} chart={item[4]!r}")
    assert not unexplained, "chart and manifests/ drifted:\n" + "\n".join(unexplained)
    stale = [INTENDED[i] for i in range(len(INTENDED)) if i not in used]
    assert not stale, f"INTENDED lists differences that no longer occur: {stale}"


def test_drift_check_sees_a_real_difference(chart: Helm, kubectl: Path) -> None:
    """The comparison is not vacuous: a changed failure policy or security context is reported."""
    kustomized = _kustomize(kubectl, REPO / "manifests/overlays/cert-manager")
    docs = chart.template({"webhook": {"validating": {"failurePolicy": "Ignore"}},
                           "securityContext": {"readOnlyRootFilesystem": False}})
    found = [item for item in drift(docs, kustomized) if not any(_explained(item, r) for r in INTENDED)]
    paths = {(kind, path) for kind, path, *_ in found}
    assert ("ValidatingWebhookConfiguration", ".webhooks[0].failurePolicy") in paths
    assert ("Deployment", ".spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem") in paths


def test_kustomize_labels_are_kept(chart: Helm, kubectl: Path) -> None:
    """The chart only adds labels: every label kustomize sets is on the chart's object with the same value."""
    ours = _normalized(chart.template())
    for key, doc in _normalized(_kustomize(kubectl, REPO / "manifests/overlays/cert-manager")).items():
        if key not in ours:
            continue
        labels = ours[key]["metadata"].get("labels", {})
        for name, value in doc["metadata"].get("labels", {}).items():
            assert labels.get(name) == value, f"{key}: label {name}"


# ------------------------------------------------------------------------------------------------------ modes


def _render_values(tmp_path_factory: pytest.TempPathFactory, mode: str) -> Path:
    """The values file `gpu-webhook policies render --format helm-values` writes for the shipped rules."""
    out = tmp_path_factory.mktemp("native") / f"{mode}-values.yaml"
    done = subprocess.run([sys.executable, "-m", "webhook", "policies", "render", "--rules", str(REPO / "rules"),
                           "--mode", mode, "--format", "helm-values"], capture_output=True, text=True, cwd=REPO,
                          timeout=120, check=True)
    out.write_text(done.stdout)
    return out


@pytest.fixture(scope="session")
def mode_renders(chart: Helm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Doc]]:
    """helm template of each mode; native and hybrid with the rendered values file passed with -f."""
    renders = {"webhook": chart.template({"mode": "webhook"})}
    for mode in ("native", "hybrid"):
        values = _render_values(tmp_path_factory, mode)
        done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values))
        renders[mode] = [d for d in yaml.safe_load_all(done.stdout) if d]
    return renders


NATIVE_POLICIES = {(d["kind"], d["metadata"]["name"]) for d in native_cel.policies()}
NATIVE = NATIVE_POLICIES | {("GPUClassMap", native.PARAMS_NAME)}


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_lint_strict_in_each_mode(chart: Helm, tmp_path_factory: pytest.TempPathFactory, mode: str) -> None:
    values = _render_values(tmp_path_factory, mode)
    done = chart.run("lint", "--strict", "--namespace", NAMESPACE, str(CHART), "-f", str(values))
    assert "0 chart(s) failed" in done.stdout, done.stdout


def test_webhook_mode_renders_what_the_chart_rendered_before_modes(chart: Helm) -> None:
    """mode=webhook is the default, and its output is byte-for-byte the default render."""
    assert yaml.safe_load((CHART / "values.yaml").read_text())["mode"] == "webhook"
    explicit = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values={"mode": "webhook"})
    default = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert explicit.stdout == default.stdout
    assert not {kind for kind, _ in kinds([d for d in yaml.safe_load_all(default.stdout) if d])} & {
        kind for kind, _ in NATIVE}


def test_native_mode_renders_only_the_policies_and_their_params(mode_renders: dict[str, list[Doc]]) -> None:
    docs = mode_renders["native"]
    assert kinds(docs) == NATIVE
    assert len(docs) == len(NATIVE)
    assert not {kind for kind, _ in kinds(docs)} & {"Deployment", "Service", "Secret", "Certificate", "Issuer",
                                                    "PodDisruptionBudget", "ConfigMap", *WEBHOOK_KINDS}


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_native_objects_are_the_compilers(mode_renders: dict[str, list[Doc]], mode: str) -> None:
    """The chart's policies and bindings are the compiler's, and its params are those of the shipped rules."""
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in mode_renders[mode]}
    for wanted in native.render(PACKAGED_RULES)[1:]:
        found = by_name[(wanted["kind"], wanted["metadata"]["name"])]
        if wanted["kind"] == native.PARAMS_KIND:
            assert found["spec"] == wanted["spec"]
            assert found["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        else:
            assert found == wanted


def test_hybrid_mode_adds_the_policies_and_narrows_both_webhooks(mode_renders: dict[str, list[Doc]]) -> None:
    webhook, hybrid = mode_renders["webhook"], mode_renders["hybrid"]
    assert kinds(hybrid) == kinds(webhook) | NATIVE
    before = only(webhook, "MutatingWebhookConfiguration")["webhooks"][0]["matchConditions"]
    after = only(hybrid, "MutatingWebhookConfiguration")["webhooks"][0]["matchConditions"]
    assert after == before + native.hybrid_match_conditions(PACKAGED_RULES)
    (plain,) = only(webhook, "ValidatingWebhookConfiguration")["webhooks"]
    (narrowed,) = only(hybrid, "ValidatingWebhookConfiguration")["webhooks"]
    assert narrowed["matchConditions"] == plain["matchConditions"] + native.hybrid_validating_conditions()
    assert {**narrowed, "matchConditions": []} == {**plain, "matchConditions": []}


@pytest.mark.parametrize("mode", ["native", "hybrid"])
@pytest.mark.parametrize("version", ["1.36.0", "latest"])
def test_mode_validates_strictly(mode_renders: dict[str, list[Doc]], kv: Any, mode: str, version: str) -> None:
    """MutatingAdmissionPolicy is admissionregistration.k8s.io/v1 from Kubernetes 1.36: native modes need it."""
    k8s_version = kv.latest_version() if version == "latest" else version
    docs = [d for d in mode_renders[mode] if d["kind"] != native.PARAMS_KIND]
    errors = strict_errors(kv, docs, k8s_version)
    assert not errors, f"against Kubernetes {k8s_version}:\n" + "\n".join(errors)


def test_params_object_matches_the_crd_in_crds(mode_renders: dict[str, list[Doc]]) -> None:
    """The chart's crds/ holds the compiler's CRD, and the params the chart renders validate against it."""
    jsonschema = pytest.importorskip("jsonschema")
    (crd_file,) = (CHART / "crds").iterdir()
    crd = yaml.safe_load(crd_file.read_text())
    assert crd == native.crd()
    params = only(mode_renders["native"], native.PARAMS_KIND)
    jsonschema.validate(params, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def test_native_mode_includes_the_crd_with_include_crds(chart: Helm, tmp_path_factory: pytest.TempPathFactory) -> None:
    values = _render_values(tmp_path_factory, "native")
    done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds", "-f", str(values))
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert ("CustomResourceDefinition", f"{native.PARAMS_PLURAL}.{native.GROUP}") in kinds(docs)


def test_params_given_as_text_with_set_file(chart: Helm, mode_renders: dict[str, list[Doc]], tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(native.params_object(PACKAGED_RULES)))
    done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "mode=native",
                     "--set-file", f"native.params={params}")
    assert [d for d in yaml.safe_load_all(done.stdout) if d] == mode_renders["native"]


RENDER_COMMAND = "gpu-webhook policies render --rules <your rule directory> --mode {mode} --format helm-values"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"mode": "native"}, RENDER_COMMAND.format(mode="native"), id="native-needs-params"),
        pytest.param({"mode": "hybrid"}, RENDER_COMMAND.format(mode="hybrid"), id="hybrid-needs-params"),
        pytest.param({"mode": "hybrid", "native": {"params": native.params_object(PACKAGED_RULES)}},
                     "native.hybridMatchConditions: run " + RENDER_COMMAND.format(mode="hybrid"),
                     id="hybrid-needs-conditions"),
        pytest.param({"mode": "native", "native": {"params": {"mode": "native", "native": {}}}},
                     "native.params must be the GPUClassMap object", id="params-not-a-gpuclassmap"),
        pytest.param({"mode": "native", "native": {"params": "kind: [unclosed"}},
                     "native.params must be the GPUClassMap object", id="params-not-yaml"),
        pytest.param({"mode": "Native"}, "mode", id="unknown-mode"),
    ],
)
def test_mode_values_are_refused_with_the_command_to_run(chart: Helm, values: Doc, message: str) -> None:
    done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values, check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# ------------------------------------------------------------------------------------ Kubernetes versions

# What the chart asks of the cluster (docs/deploy.md, "Kubernetes versions"): the chart's kubeVersion for every
# mode, Kubernetes 1.36 (MutatingAdmissionPolicy v1) for native and hybrid.
VERSION_CASES = [
    pytest.param("webhook", "1.30.0", None, id="webhook-1.30"),
    pytest.param("webhook", "1.34.4", None, id="webhook-1.34"),
    pytest.param("webhook", "1.29.9", "chart requires kubeVersion: >=1.30.0-0", id="webhook-1.29-refused"),
    pytest.param("native", "1.30.14", "mode=native needs Kubernetes >= 1.36", id="native-1.30-refused"),
    pytest.param("native", "1.35.4", "mode=native needs Kubernetes >= 1.36", id="native-1.35-refused"),
    pytest.param("hybrid", "1.34.4", "mode=hybrid needs Kubernetes >= 1.36", id="hybrid-1.34-refused"),
    pytest.param("native", "1.36.0", None, id="native-1.36"),
    pytest.param("hybrid", "1.36.0-eks-1a2b3c", None, id="hybrid-1.36-vendor-suffix"),
]


@pytest.mark.parametrize(("mode", "version", "message"), VERSION_CASES)
def test_kube_version_gates_each_mode(chart: Helm, tmp_path_factory: pytest.TempPathFactory, mode: str,
                                      version: str, message: str | None) -> None:
    """helm template --kube-version stands for the cluster's version (.Capabilities.KubeVersion on install)."""
    args = ["-f", str(_render_values(tmp_path_factory, mode))] if mode != "webhook" else []
    done = chart.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", version, *args,
                     check=False)
    if message is None:
        assert done.returncode == 0, done.stderr
        assert "kind: Deployment" in done.stdout or mode == "native"
    else:
        assert done.returncode != 0, f"{mode} on Kubernetes {version} rendered"
        assert message in done.stderr, done.stderr
        if mode != "webhook":
            assert f"the cluster is v{version}" in done.stderr and "install with mode=webhook" in done.stderr

