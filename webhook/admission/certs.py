"""Certificates for serving the webhook: a CA and a serving certificate, built with `cryptography`.

Pure: `now` is always an argument and nothing touches the disk (the CLI writes the files). ECDSA P-256 is the
default key type (cheaper handshakes than RSA); RSA-2048 is available for older tooling.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KeyType = Literal["ecdsa", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

CA_DAYS = 3650
SERVING_DAYS = 365
CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Issued:
    """A certificate with its private key."""

    cert: x509.Certificate
    key: PrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def new_key(key_type: KeyType = "ecdsa") -> PrivateKey:
    """A fresh private key: ECDSA P-256 or RSA-2048."""
    if key_type == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def service_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names a Service is reached by; `<svc>.<ns>.svc` is the one the API server verifies."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def new_ca(common_name: str, now: dt.datetime, *, key: PrivateKey, days: int = CA_DAYS) -> Issued:
    """A self-signed CA certificate that may sign serving certificates only (path length 0)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(signs_certificates=True, enciphers_keys=False),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def new_serving_cert(
    ca: Issued,
    dns_names: Sequence[str],
    now: dt.datetime,
    *,
    key: PrivateKey,
    ip_addresses: Sequence[str] = (),
    days: int = SERVING_DAYS,
) -> Issued:
    """A TLS server certificate signed by `ca`, valid for `dns_names` and `ip_addresses` (SANs, not CN)."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    common_name = dns_names[2] if len(dns_names) > 2 else (dns_names or ip_addresses)[0]
    key_usage = _key_usage(signs_certificates=False, enciphers_keys=isinstance(key, rsa.RSAPrivateKey))
    not_after = min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(key_usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert, key)


def _key_usage(*, signs_certificates: bool, enciphers_keys: bool) -> x509.KeyUsage:
    """Digital signatures always; certificate and CRL signing for a CA; key encipherment for an RSA leaf."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=enciphers_keys,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def needs_renewal(cert: x509.Certificate, now: dt.datetime, lookahead: dt.timedelta) -> bool:
    """True when `cert` is not yet valid or expires within `lookahead` of `now`."""
    return now < cert.not_valid_before_utc or now + lookahead >= cert.not_valid_after_utc


def covers(cert: x509.Certificate, dns_names: Sequence[str], ip_addresses: Sequence[str] = ()) -> bool:
    """True when every name and address is among the certificate's SANs."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have_dns = set(san.get_values_for_type(x509.DNSName))
    have_ip = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return set(dns_names) <= have_dns and {str(ipaddress.ip_address(i)) for i in ip_addresses} <= have_ip


def ca_bundle_b64(ca_pem: bytes) -> str:
    """The CA certificate(s) in base64, as the webhook configuration's `clientConfig.caBundle` wants them."""
    return base64.b64encode(ca_pem).decode("ascii")


def load_pair(cert_pem: bytes, key_pem: bytes) -> Issued:
    """Parse a PEM certificate (the first of a chain) and key; raises ValueError when they do not match."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"unsupported private key type {type(key).__name__}: expected ECDSA or RSA")
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise ValueError("the private key does not match the certificate")
    return Issued(cert, key)
