"""A throwaway PKI for one dev cluster: a CA, the API server's serving cert, a client cert per
component (identity = CN, groups = O, exactly as kube-apiserver reads them) and the service-account
signing key. ECDSA P-256 keeps generation to milliseconds."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Names the API server answers to; 10.96.0.1 is the `kubernetes` service IP of SERVICE_CIDR.
SERVICE_CIDR = "10.96.0.0/16"
_SERVING_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_SERVING_IPS = ("127.0.0.1", "10.96.0.1")
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Identity:
    """A client identity: the user name (certificate CN) and its groups (O)."""

    user: str
    groups: tuple[str, ...] = ()


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(common_name: str, orgs: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + _VALIDITY)
    )


class Pki:
    """Creates and holds the key material under one directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = KeyPair(directory / "ca.crt", directory / "ca.key")
        self.serving = KeyPair(directory / "apiserver.crt", directory / "apiserver.key")
        self.sa_key = directory / "sa.key"
        self.sa_pub = directory / "sa.pub"

    def client(self, component: str) -> KeyPair:
        return KeyPair(self.dir / f"{component}.crt", self.dir / f"{component}.key")

    def create(self, clients: dict[str, Identity]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ca_key = _new_key()
        ca_name = _name("gpuq-devcluster-ca")
        ca_cert = (
            _builder(ca_name, ca_name, ca_key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(ca_key, self.ca.key)
        self.ca.cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in _SERVING_DNS]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVING_IPS]
        self._issue(
            self.serving,
            _name("kube-apiserver"),
            ca_cert,
            ca_key,
            ExtendedKeyUsageOID.SERVER_AUTH,
            x509.SubjectAlternativeName(sans),
        )
        for component, identity in clients.items():
            self._issue(
                self.client(component),
                _name(identity.user, identity.groups),
                ca_cert,
                ca_key,
                ExtendedKeyUsageOID.CLIENT_AUTH,
            )

        sa_key = _new_key()
        _write_key(sa_key, self.sa_key)
        self.sa_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    @staticmethod
    def _issue(
        pair: KeyPair,
        subject: x509.Name,
        ca_cert: x509.Certificate,
        ca_key: ec.EllipticCurvePrivateKey,
        usage: x509.ObjectIdentifier,
        sans: x509.SubjectAlternativeName | None = None,
    ) -> None:
        key = _new_key()
        builder = (
            _builder(subject, ca_cert.subject, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans is not None:
            builder = builder.add_extension(sans, critical=False)
        _write_key(key, pair.key)
        pair.cert.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, context: str) -> None:
    """A self-contained kubeconfig (certificates embedded) so it keeps working when copied."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [
            {
                "name": context,
                "user": {"client-certificate-data": b64(client.cert), "client-key-data": b64(client.key)},
            }
        ],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
