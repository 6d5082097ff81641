"""Security properties: TLS versions and ciphers on the wire, the served chain, mTLS end to end, no
opt-out written in a Pod, and rule files that are data only.

TLS tests talk to a real `gpu-webhook serve` (gunicorn) over loopback; the policy tests use Flask's test
client with the real engine and rules. See docs/security.md for the threat model these support.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry
from support.admission import (
    Pki,
    Server,
    body,
    client_context,
    kubelet_write,
    post,
    review,
    rules_files,
    start_server,
    with_uid,
)

from webhook.admission.app import create_app, server_of
from webhook.admission.loader import load_policy
from webhook.admission.policy_store import PolicyStore
from webhook.admission.settings import Settings
from webhook.admission.tls import ServingTls
from webhook.cli.server import issue
from webhook.policy.rules import RuleError

SERVICE_NAME = "gpu-webhook.gpu-system.svc"
# OpenSSL names of cipher families nobody should negotiate (TLS 1.2 and below).
WEAK_MARKERS = ("NULL", "RC4", "DES", "3DES", "EXP", "EXPORT", "ADH", "AECDH", "anon", "MD5", "PSK", "SRP",
                "IDEA", "SEED", "CAMELLIA", "ARIA", "CCM8")


def _permissive_client(ca_pem: bytes, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that would speak only `version`, with OpenSSL's security level lowered so that a refusal
    comes from the server, not from the client's own policy."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=ca_pem.decode())
    context.set_ciphers("ALL:@SECLEVEL=0")
    context.minimum_version = version
    context.maximum_version = version
    return context


def _handshake(port: int, context: ssl.SSLContext, hostname: str = "localhost") -> tuple[str, str]:
    """(protocol, cipher) of one handshake to 127.0.0.1:port, or an ssl.SSLError / OSError."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=hostname) as tls:
        cipher = tls.cipher()
        assert cipher is not None
        return str(tls.version()), cipher[0]


@pytest.fixture(scope="module")
def rsa_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Pki]]:
    """RSA-2048, the key type that admits the most TLS 1.2 suites (RSA and ECDHE-RSA)."""
    tmp = tmp_path_factory.mktemp("rsa")
    pki = Pki("rsa")
    kubelet_write(tmp / "tls", pki.secret())
    server = start_server(tmp, "--tls-dir", str(tmp / "tls"), trust=client_context(pki.ca), workers=1)
    try:
        yield server, pki
    finally:
        server.stop()


# --- protocol versions ------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1], ids=["tls1.0", "tls1.1"])
def test_old_protocols_are_refused(rsa_server: tuple[Server, Pki], version: ssl.TLSVersion) -> None:
    server, pki = rsa_server
    client = _permissive_client(pki.ca.cert_pem(), version)
    # control: this client can speak `version` with a server that allows it (so the refusal is the webhook's)
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.set_ciphers("ALL:@SECLEVEL=0")
    permissive.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    pem = server.log_path.parent / "control.pem"
    leaf = pki.leaf()
    pem.write_bytes(leaf.cert_pem() + leaf.key_pem())
    permissive.load_cert_chain(str(pem))
    left, right = socket.socketpair()
    result: list[str | None] = []

    def serve() -> None:
        try:
            with permissive.wrap_socket(right, server_side=True) as tls:
                result.append(tls.version())
        except (ssl.SSLError, OSError):
            result.append(None)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(left, server_hostname="localhost") as tls:
            assert tls.version() in ("TLSv1", "TLSv1.1")
    except ssl.SSLError as exc:  # this OpenSSL build cannot speak the old protocol at all: nothing to prove
        pytest.skip(f"the local OpenSSL refuses {version.name} as a client: {exc}")
    finally:
        left.close()
        thread.join(5)
        right.close()
    with pytest.raises((ssl.SSLError, OSError)):
        _handshake(server.port, client)


@pytest.mark.parametrize(("version", "name"), [(ssl.TLSVersion.TLSv1_2, "TLSv1.2"),
                                               (ssl.TLSVersion.TLSv1_3, "TLSv1.3")])
def test_tls_1_2_and_1_3_are_accepted(rsa_server: tuple[Server, Pki], version: ssl.TLSVersion, name: str) -> None:
    server, pki = rsa_server
    context = client_context(pki.ca)
    context.minimum_version = context.maximum_version = version
    assert _handshake(server.port, context)[0] == name


# --- ciphers -----------------------------------------------------------------------------------------


def _tls12_suites() -> list[str]:
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.set_ciphers("ALL:COMPLEMENTOFALL:@SECLEVEL=0")
    return sorted({c["name"] for c in probe.get_ciphers() if c["protocol"] == "TLSv1.2" or
                   c["protocol"] in ("TLSv1.0", "SSLv3")})


def test_no_weak_cipher_is_negotiated_on_the_wire(rsa_server: tuple[Server, Pki]) -> None:
    """Offer the server every TLS 1.2 suite this OpenSSL knows, one at a time: record what it accepts."""
    server, pki = rsa_server
    accepted = []
    for suite in _tls12_suites():
        context = _permissive_client(pki.ca.cert_pem(), ssl.TLSVersion.TLSv1_2)
        try:
            context.set_ciphers(f"{suite}:@SECLEVEL=0")
        except ssl.SSLError:
            continue
        try:
            accepted.append(_handshake(server.port, context)[1])
        except (ssl.SSLError, OSError):
            continue
    assert accepted, "no TLS 1.2 suite accepted at all"
    weak = [s for s in accepted if any(m in s for m in WEAK_MARKERS)]
    assert not weak, weak
    assert all("GCM" in s or "CHACHA20" in s or "SHA256" in s or "SHA384" in s for s in accepted), accepted
    assert not [s for s in accepted if s.endswith("-SHA") or s.startswith("AES")], \
        f"CBC with SHA-1 or static RSA key exchange (no forward secrecy): {accepted}"
    # what is negotiated on the wire is what the server's context enables (Python's default server string)
    with_ecdhe_rsa = {c["name"] for c in ServingTls(server.log_path.parent / "tls").context().get_ciphers()
                      if c["protocol"] == "TLSv1.2" and "ECDSA" not in c["name"]}
    assert set(accepted) <= with_ecdhe_rsa


def test_tls_1_3_suites_are_the_standard_aead_ones(rsa_server: tuple[Server, Pki]) -> None:
    server, pki = rsa_server
    context = client_context(pki.ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    version, cipher = _handshake(server.port, context)
    assert version == "TLSv1.3"
    assert cipher in ("TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256")


def test_server_context_enables_no_weak_cipher(tmp_path: Path) -> None:
    pki = Pki("ecdsa")
    kubelet_write(tmp_path, pki.secret())
    context = ServingTls(tmp_path).context()
    names = [c["name"] for c in context.get_ciphers()]
    assert names
    assert not [n for n in names if any(m in n for m in WEAK_MARKERS)]
    assert not [n for n in names if n.endswith("-SHA")], "CBC with SHA-1 is enabled"
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_COMPRESSION


# --- the served chain --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def issued_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """A server on certificates from the `certs` command's code, for the Service name (and 127.0.0.1)."""
    tmp = tmp_path_factory.mktemp("issued")
    from webhook.admission import certs

    names = [*certs.service_dns_names("gpu-webhook", "gpu-system"), "localhost"]
    issue(tmp / "tls", names, ["127.0.0.1"], dt.datetime.now(dt.UTC))
    trust = ssl.create_default_context(cafile=str(tmp / "tls" / "ca.crt"))
    server = start_server(tmp, "--tls-dir", str(tmp / "tls"), trust=trust, workers=1)
    try:
        yield server, tmp / "tls" / "ca.crt"
    finally:
        server.stop()


def test_chain_verifies_for_the_service_name(issued_server: tuple[Server, Path]) -> None:
    server, ca = issued_server
    context = ssl.create_default_context(cafile=str(ca))  # CERT_REQUIRED + hostname check, as the API server
    assert _handshake(server.port, context, SERVICE_NAME)[0] in ("TLSv1.2", "TLSv1.3")


@pytest.mark.parametrize("hostname", ["gpu-webhook.other-ns.svc", "evil.example.com", "gpu-webhook.gpu-system"
                                      ".svc.evil.example"])
def test_chain_does_not_verify_for_other_names(issued_server: tuple[Server, Path], hostname: str) -> None:
    server, ca = issued_server
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server.port, ssl.create_default_context(cafile=str(ca)), hostname)


def test_chain_does_not_verify_against_another_ca(issued_server: tuple[Server, Path]) -> None:
    server, _ = issued_server
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server.port, client_context(Pki("ecdsa").ca), SERVICE_NAME)


# --- mTLS ---------------------------------------------------------------------------------------------


def test_mutual_tls_refuses_strangers_end_to_end(tmp_path: Path) -> None:
    from support.admission import client_cert

    pki, apiserver_ca, other_ca = Pki("ecdsa"), Pki("ecdsa"), Pki("ecdsa")
    kubelet_write(tmp_path / "tls", pki.secret())
    (tmp_path / "client-ca.crt").write_bytes(apiserver_ca.ca.cert_pem())
    right = client_context(pki.ca, client=client_cert(apiserver_ca.ca), tmp=tmp_path)
    server = start_server(tmp_path, "--tls-dir", str(tmp_path / "tls"), "--client-ca",
                          str(tmp_path / "client-ca.crt"), trust=right, workers=1)
    try:
        document = with_uid(review("pod-create-from-replicaset-gpu"))
        status, answer = post(server.connection(right), "/mutate", document)
        assert status == 200 and answer["response"]["uid"] == document["request"]["uid"]
        wrong = {
            "no-client-cert": client_context(pki.ca),
            "cert-from-another-ca": client_context(pki.ca, client=client_cert(other_ca.ca), tmp=tmp_path),
            "server-cert-as-client": client_context(pki.ca, client=pki.leaf(), tmp=tmp_path),
        }
        for name, context in wrong.items():
            for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
                context.minimum_version = context.maximum_version = version
                conn = server.connection(context)
                with pytest.raises((ssl.SSLError, OSError)):  # TLS 1.3: refused at the first read
                    post(conn, "/mutate", with_uid(document))
                    pytest.fail(f"{name} over {version.name} got an answer")
                conn.close()
        status, _ = post(server.connection(right), "/validate", with_uid(document))
        assert status == 200
    finally:
        server.stop()


# --- nothing in a Pod is an opt-out -----------------------------------------------------------------


@pytest.fixture
def app() -> Iterator[Flask]:
    app = create_app(Settings(rules_poll_seconds=0), registry=CollectorRegistry())
    yield app
    server_of(app).store.stop()



def _answer(client: FlaskClient, path: str, document: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, data=body(document), content_type="application/json")
    assert response.status_code == 200
    result: dict[str, Any] = response.get_json()["response"]
    return result


OPT_OUTS: list[tuple[str, str, str]] = [  # (where, key, value) written by the developer
    ("annotations", "gpu-webhook.io/class", "workload=training,gpu-type=a100"),
    ("annotations", "gpu-webhook.io/rules", "0000000000000000"),
    ("annotations", "gpu-webhook.io/exempt", "true"),
    ("labels", "gpu-webhook.io/exempt", "true"),
    ("labels", "exempt", "true"),
    ("annotations", "gpu-webhook.io/skip", "true"),
    ("annotations", "admission.gatekeeper.sh/ignore", "true"),
    ("labels", "admission.gatekeeper.sh/ignore", "true"),
    ("labels", "control-plane", "true"),
    ("labels", "kubernetes.io/metadata.name", "kube-system"),
    ("annotations", "scheduler.alpha.kubernetes.io/critical-pod", ""),
]


def _with_metadata(document: dict[str, Any], where: str, key: str, value: str, *, template: bool = False
                   ) -> dict[str, Any]:
    document = copy.deepcopy(document)
    obj = document["request"]["object"]
    if template:
        spec = obj["spec"]["jobTemplate"]["spec"] if "jobTemplate" in obj["spec"] else obj["spec"]
        spec["template"].setdefault("metadata", {}).setdefault(where, {})[key] = value
    obj.setdefault("metadata", {}).setdefault(where, {})[key] = value
    return document


@pytest.mark.parametrize(("where", "key", "value"), OPT_OUTS, ids=[f"{w}:{k}" for w, k, _ in OPT_OUTS])
@pytest.mark.parametrize("fixture", ["pod-create-gpu-mismatch", "pod-create-gpu-fraction",
                                     "cronjob-create-gpu-mismatch"])
def test_no_label_or_annotation_skips_validation(client: FlaskClient, fixture: str, where: str, key: str,
                                                 value: str) -> None:
    document = _with_metadata(review(fixture), where, key, value, template="cronjob" in fixture)
    for path in ("/mutate", "/validate"):
        answer = _answer(client, path, document)
        assert answer["allowed"] is False, (path, answer)
        assert "patch" not in answer


@pytest.mark.parametrize(("where", "key", "value"), OPT_OUTS, ids=[f"{w}:{k}" for w, k, _ in OPT_OUTS])
def test_no_label_or_annotation_skips_mutation(client: FlaskClient, where: str, key: str, value: str) -> None:
    plain = _answer(client, "/mutate", review("pod-create-from-replicaset-gpu"))
    document = _with_metadata(review("pod-create-from-replicaset-gpu"), where, key, value)
    answer = _answer(client, "/mutate", document)
    assert answer["allowed"] is True and answer.get("patchType") == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    plain_ops = json.loads(base64.b64decode(plain["patch"]))
    placement = {op["path"] for op in plain_ops if op["path"].startswith("/spec")}
    assert placement <= {op["path"] for op in ops}, "the class placement was skipped"


def test_the_object_namespace_is_not_trusted(client: FlaskClient) -> None:
    """request.namespace is authoritative: an exempt namespace written in the object does not exempt it."""
    document = review("pod-create-gpu-mismatch")
    document["request"]["object"]["metadata"]["namespace"] = "kube-system"
    assert _answer(client, "/validate", document)["allowed"] is False
    document["request"]["namespace"] = "kube-system"  # the real exemption: the rule file's exemptNamespaces
    assert _answer(client, "/validate", document)["allowed"] is True


def test_mirror_annotation_on_a_non_pod_changes_nothing(client: FlaskClient) -> None:
    document = _with_metadata(review("cronjob-create-gpu-mismatch"), "annotations", "kubernetes.io/config.mirror",
                              "abc", template=True)
    assert _answer(client, "/validate", document)["allowed"] is False
    deployment = _with_metadata(review("deployment-create-gpu-template"), "annotations",
                                "kubernetes.io/config.mirror", "abc", template=True)
    assert _answer(client, "/validate", deployment) == _answer(client, "/validate",
                                                               review("deployment-create-gpu-template"))


def test_mirror_annotation_on_a_pod_skips_only_the_patch(client: FlaskClient) -> None:
    """By design (README): mirror Pods are validated, never patched. The annotation does not skip validation;
    at /validate it does skip `gpu-class-missing` (the placement a mirror Pod cannot receive): see
    docs/security.md for why a user gains nothing from it (the kubelet never runs an API-created mirror Pod)."""
    for fixture in ("pod-create-gpu-mismatch", "pod-create-gpu-fraction", "pod-create-gpu-requests-only"):
        document = _with_metadata(review(fixture), "annotations", "kubernetes.io/config.mirror", "hash")
        assert _answer(client, "/validate", document)["allowed"] is False
        assert _answer(client, "/mutate", document)["allowed"] is False
    mirror = _with_metadata(review("pod-create-from-replicaset-gpu"), "annotations", "kubernetes.io/config.mirror",
                            "hash")
    answer = _answer(client, "/mutate", mirror)
    assert answer["allowed"] is True and "patch" not in answer
    assert _answer(client, "/validate", mirror)["allowed"] is True  # gpu-class-missing is not raised for it


# --- rule files are data ----------------------------------------------------------------------------

PYTHON_TAGS = [
    pytest.param("!!python/object/apply:os.system ['touch {marker}']", id="object-apply"),
    pytest.param("!!python/object/new:os.system ['touch {marker}']", id="object-new"),
    pytest.param("!!python/name:os.system", id="name"),
    pytest.param("!!python/module:os", id="module"),
    pytest.param("!!python/object:webhook.policy.rules.Policy {{}}", id="object"),
]


def _tagged(tmp_path: Path, tag: str) -> tuple[Path, Path]:
    marker = tmp_path / "pwned"
    rules = tmp_path / "rules"
    rules.mkdir()
    text = rules_files("t4-default")["gpu-policy.yaml"].decode()
    text = text.replace("  name: platform-defaults", "  name: platform-defaults\n  x: " + tag.format(marker=marker),
                        1)
    (rules / "evil.yaml").write_text(text)
    return rules, marker


@pytest.mark.parametrize("tag", PYTHON_TAGS)
def test_python_yaml_tags_are_refused_at_load(tmp_path: Path, tag: str) -> None:
    rules, marker = _tagged(tmp_path, tag)
    with pytest.raises(RuleError) as error:
        load_policy(rules)
    assert "evil.yaml" in str(error.value)
    assert not marker.exists()


def test_python_yaml_tag_in_a_hot_reload_is_refused(tmp_path: Path) -> None:
    rules = tmp_path / "live"
    kubelet_write(rules, rules_files("t4-default"))
    store = PolicyStore(rules)
    good = store.policy.digest
    evil, marker = _tagged(tmp_path, "!!python/object/apply:os.system ['touch {marker}']")
    kubelet_write(rules, {"gpu-policy.yaml": (evil / "evil.yaml").read_bytes()})
    assert store.refresh() is False
    assert store.policy.digest == good and not marker.exists()
    assert store.last_error is not None and "gpu-policy.yaml" in store.last_error
