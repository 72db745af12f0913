"""Throwaway TLS material for a test broker or PostgreSQL server: a CA, a server certificate for
127.0.0.1 and localhost, and a client certificate whose key is encrypted as ``openssl`` 3 encrypts one by
default (PKCS#8, PBES2 with AES-256)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: ``ca`` signs both certificates; ``server`` holds the broker's key and certificate,
    ``server_certificate`` and ``server_key`` the same apart (as PostgreSQL's ``ssl_cert_file`` and
    ``ssl_key_file`` take them); ``client_key`` is encrypted with ``client_key_password``."""

    ca: Path
    server: Path
    server_certificate: Path
    server_key: Path
    client_certificate: Path
    client_key: Path
    client_key_password: str


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    signer: ec.EllipticCurvePrivateKey,
    extensions: list[x509.ExtensionType],
) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=isinstance(extension, x509.BasicConstraints))
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _plain(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_tls_files(directory: Path, *, ca_name: str = "ca") -> TlsFiles:
    """A fresh CA and the broker's and a client's certificates under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, [x509.BasicConstraints(ca=True, path_length=None)])
    server = _certificate(
        "127.0.0.1",
        server_key,
        ca_name,
        ca_key,
        [x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])],
    )
    client = _certificate("cdc", client_key, ca_name, ca_key, [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])])
    password = "k-secret"
    files = TlsFiles(
        directory / f"{ca_name}.pem",
        directory / "server-keystore.pem",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.pem",
        directory / "client-encrypted.key",
        password,
    )
    files.ca.write_bytes(ca)
    files.server.write_bytes(_plain(server_key) + server)  # the broker's PEM keystore: key, then certificate
    files.server_certificate.write_bytes(server)
    files.server_key.write_bytes(_plain(server_key))
    files.server_key.chmod(0o600)  # PostgreSQL refuses a key others may read
    files.client_certificate.write_bytes(client)
    files.client_key.write_bytes(
        client_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        )
    )
    return files
