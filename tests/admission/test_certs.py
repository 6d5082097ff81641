"""Certificates (pure, `now` passed in) and the `certs` command that writes them atomically."""

from __future__ import annotations

import base64
import datetime as dt
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID
from support.admission import NOW

from webhook.admission import certs
from webhook.cli import server as cli_server


@pytest.fixture(scope="module")
def ca() -> certs.Issued:
    return certs.new_ca("test-ca", NOW, key=certs.new_key("ecdsa"))


def test_service_dns_names() -> None:
    assert certs.service_dns_names("gpu-webhook", "gpu-system") == (
        "gpu-webhook", "gpu-webhook.gpu-system", "gpu-webhook.gpu-system.svc",
        "gpu-webhook.gpu-system.svc.cluster.local",
    )


@pytest.mark.parametrize(
    ("key_type", "key_class"),
    [pytest.param("ecdsa", ec.EllipticCurvePrivateKey, id="ecdsa-p256"),
     pytest.param("rsa", rsa.RSAPrivateKey, id="rsa-2048")],
)
def test_serving_cert(ca: certs.Issued, key_type: certs.KeyType, key_class: type) -> None:
    names = certs.service_dns_names("svc", "ns")
    leaf = certs.new_serving_cert(ca, names, NOW, key=certs.new_key(key_type), ip_addresses=["127.0.0.1"])
    assert isinstance(leaf.key, key_class)
    if isinstance(leaf.key, ec.EllipticCurvePrivateKey):
        assert leaf.key.curve.name == "secp256r1"
    cert = leaf.cert
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == list(names)
    assert certs.covers(cert, ["svc.ns.svc"], ["127.0.0.1"])
    assert not certs.covers(cert, ["other.ns.svc"])
    assert cert.issuer == ca.cert.subject
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    assert cert.not_valid_before_utc <= NOW < cert.not_valid_after_utc
    assert cert.not_valid_after_utc == NOW + dt.timedelta(days=certs.SERVING_DAYS)
    cert.verify_directly_issued_by(ca.cert)  # raises if the signature is not the CA's


def test_ca_is_a_ca(ca: certs.Issued) -> None:
    constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is True and constraints.path_length == 0
    assert ca.cert.not_valid_after_utc == NOW + dt.timedelta(days=certs.CA_DAYS)


def test_serving_cert_never_outlives_its_ca() -> None:
    short_ca = certs.new_ca("short", NOW, key=certs.new_key(), days=10)
    leaf = certs.new_serving_cert(short_ca, ["a"], NOW, key=certs.new_key(), days=365)
    assert leaf.cert.not_valid_after_utc == short_ca.cert.not_valid_after_utc


def test_serving_cert_needs_a_name(ca: certs.Issued) -> None:
    with pytest.raises(ValueError, match="at least one"):
        certs.new_serving_cert(ca, [], NOW, key=certs.new_key())


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        pytest.param(dt.timedelta(days=0), False, id="fresh"),
        pytest.param(dt.timedelta(days=300), False, id="outside-lookahead"),
        pytest.param(dt.timedelta(days=340), True, id="inside-lookahead"),
        pytest.param(dt.timedelta(days=400), True, id="expired"),
        pytest.param(-dt.timedelta(days=1), True, id="not-yet-valid"),
    ],
)
def test_needs_renewal(ca: certs.Issued, offset: dt.timedelta, expected: bool) -> None:
    leaf = certs.new_serving_cert(ca, ["a"], NOW, key=certs.new_key())
    assert certs.needs_renewal(leaf.cert, NOW + offset, dt.timedelta(days=30)) is expected


def test_load_pair_refuses_a_mismatched_key(ca: certs.Issued) -> None:
    leaf = certs.new_serving_cert(ca, ["a"], NOW, key=certs.new_key())
    assert certs.load_pair(leaf.cert_pem(), leaf.key_pem()).cert == leaf.cert
    with pytest.raises(ValueError, match="does not match"):
        certs.load_pair(leaf.cert_pem(), certs.Issued(leaf.cert, certs.new_key()).key_pem())


def test_ca_bundle_is_base64_of_the_pem(ca: certs.Issued) -> None:
    assert base64.b64decode(certs.ca_bundle_b64(ca.cert_pem())) == ca.cert_pem()


# --- the `certs` command -------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_certs_command_writes_cert_manager_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert cli_server.main(["certs", "--service", "hook", "--namespace", "ns", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    ca_pem = (out / "ca.crt").read_bytes()
    assert base64.b64decode(printed) == ca_pem
    assert (out / "ca-bundle.b64").read_text().strip() == printed
    pair = certs.load_pair((out / "tls.crt").read_bytes(), (out / "tls.key").read_bytes())
    assert isinstance(pair.key, ec.EllipticCurvePrivateKey)
    assert certs.covers(pair.cert, ["hook", "hook.ns", "hook.ns.svc", "hook.ns.svc.cluster.local"])
    assert pair.cert.issuer == x509.load_pem_x509_certificate(ca_pem).subject
    assert _mode(out / "tls.key") == 0o600
    assert _mode(out / "ca.key") == 0o600
    assert _mode(out / "tls.crt") == 0o644
    # written like a kubelet volume: one `..data` link swapped atomically
    assert os.path.islink(out / "..data")
    assert os.readlink(out / "tls.crt") == "..data/tls.crt"


def test_certs_reissue_keeps_the_ca_and_replaces_the_leaf(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["certs", "--service", "hook", "--namespace", "ns", "--out", str(out)]
    assert cli_server.main(args) == 0
    first_bundle = capsys.readouterr().out
    first_leaf = (out / "tls.crt").read_bytes()
    first_target = os.path.realpath(out / "..data")
    assert cli_server.main([*args, "--key-type", "rsa"]) == 0
    assert capsys.readouterr().out == first_bundle
    assert (out / "tls.crt").read_bytes() != first_leaf
    assert isinstance(certs.load_pair((out / "tls.crt").read_bytes(), (out / "tls.key").read_bytes()).key,
                      rsa.RSAPrivateKey)
    assert not os.path.exists(first_target)  # the previous generation is removed after the swap
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("..")) == [
        "ca-bundle.b64", "ca.crt", "ca.key", "tls.crt", "tls.key"]


def test_certs_extra_names(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert cli_server.main(["certs", "--out", str(out), "--dns", "hook.example.com", "--ip", "10.0.0.7"]) == 0
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    assert certs.covers(cert, ["gpu-webhook.gpu-system.svc", "hook.example.com"], ["10.0.0.7"])


def test_dev_certs_are_reused_until_renewal(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert cli_server.ensure_dev_certs(out, NOW) is True
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    assert certs.covers(cert, ["gpu-webhook.gpu-system.svc", "localhost"], ["127.0.0.1"])
    assert cli_server.ensure_dev_certs(out, NOW + dt.timedelta(days=1)) is False
    assert cli_server.ensure_dev_certs(out, NOW + dt.timedelta(days=350)) is True
