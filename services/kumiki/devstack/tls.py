"""A development certificate authority and the certificates it issues, for `kumiki up --tls` and the tests.

Everything is generated here with the `cryptography` package: an EC P-256 CA (30 days), and for each name a
certificate usable as a server (its SANs: 127.0.0.1, ::1, localhost and the name) and as a client (its common
name is the caller's identity, which quota and placement check against queue owners). Keys are PKCS#8 PEM,
unencrypted, mode 0600: development only, never a production CA. In a cluster, mount real certificates from
Secrets (charts/kumiki values `tls.*`); the variables a service reads are the same.

    pki = DevelopmentCA.create(folder)            # or DevelopmentCA.load_or_create(folder)
    placement = pki.issue("placement")            # CertificateFiles(certfile, keyfile, bundle, cafile)
    env = service_tls_env(pki, "placement")       # KUMIKI_TLS_*, KUMIKI_GRPC_* (+ KUMIKI_QUOTA_* for placement)
    env = client_tls_env(pki, "kumiki-cli")       # KUMIKI_GRPC_*: what grpcutil.client_channel reads
    credentials = pki.channel_credentials("kumiki-cli")   # a gRPC client with a certificate
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "Kumiki development CA"
VALID_DAYS = 30
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class CertificateFiles:
    """One identity's files. `bundle`: key then certificate in one PEM (Kafka's PEM keystore wants that)."""

    name: str
    certfile: Path
    keyfile: Path
    bundle: Path
    cafile: Path


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Kumiki"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _hosts(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


@dataclass(frozen=True)
class DevelopmentCA:
    folder: Path
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @property
    def cafile(self) -> Path:
        return self.folder / "ca.pem"

    @classmethod
    def create(cls, folder: Path, common_name: str = CA_NAME, days: int = VALID_DAYS) -> DevelopmentCA:
        """A new CA in `folder` (ca.pem, ca-key.pem), replacing any there."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        folder.mkdir(parents=True, exist_ok=True)
        _write_private(folder / "ca-key.pem", _key_pem(key))
        (folder / "ca.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return cls(folder, key, certificate)

    @classmethod
    def load(cls, folder: Path) -> DevelopmentCA:
        key = serialization.load_pem_private_key((folder / "ca-key.pem").read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{folder / 'ca-key.pem'}: not an EC key")
        certificate = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
        return cls(folder, key, certificate)

    @classmethod
    def load_or_create(cls, folder: Path) -> DevelopmentCA:
        """The CA already in `folder` while it is valid for at least another day; a new one otherwise."""
        if (folder / "ca.pem").exists() and (folder / "ca-key.pem").exists():
            ca = cls.load(folder)
            if ca.certificate.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1):
                return ca
        return cls.create(folder)

    def issue(self, name: str, hosts: tuple[str, ...] = LOOPBACK_HOSTS, days: int = VALID_DAYS) -> CertificateFiles:
        """A certificate and key for `name` (its common name: the identity), server and client use, written
        as NAME.pem, NAME-key.pem and NAME-bundle.pem in the CA's folder."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans = _hosts(tuple(dict.fromkeys((*hosts, name))))
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(min(now + datetime.timedelta(days=days), self.certificate.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
        files = CertificateFiles(
            name,
            self.folder / f"{name}.pem",
            self.folder / f"{name}-key.pem",
            self.folder / f"{name}-bundle.pem",
            self.cafile,
        )
        files.certfile.write_bytes(cert_pem)
        _write_private(files.keyfile, _key_pem(key))
        _write_private(files.bundle, _key_pem(key) + cert_pem)
        return files

    def channel_credentials(self, name: str | None = None) -> object:
        """gRPC channel credentials trusting this CA; with `name`, presenting that identity's certificate."""
        import grpc

        if name is None:
            return grpc.ssl_channel_credentials(root_certificates=self.cafile.read_bytes())
        files = self.issue(name) if not (self.folder / f"{name}.pem").exists() else self.files(name)
        return grpc.ssl_channel_credentials(
            root_certificates=self.cafile.read_bytes(),
            private_key=files.keyfile.read_bytes(),
            certificate_chain=files.certfile.read_bytes(),
        )

    def files(self, name: str) -> CertificateFiles:
        return CertificateFiles(
            name, self.folder / f"{name}.pem", self.folder / f"{name}-key.pem", self.folder / f"{name}-bundle.pem",
            self.cafile,
        )  # fmt: skip


def client_tls_env(ca: DevelopmentCA, identity: str) -> dict[str, str]:
    """The variables that make a process call Kumiki services over mTLS as `identity`
    (kumiki.common.grpcutil.client_channel reads them): the CLI, the replay, the binder, the SDK."""
    files = ca.files(identity) if (ca.folder / f"{identity}.pem").exists() else ca.issue(identity)
    return {
        "KUMIKI_GRPC_CAFILE": str(ca.cafile),
        "KUMIKI_GRPC_CERTFILE": str(files.certfile),
        "KUMIKI_GRPC_KEYFILE": str(files.keyfile),
    }


def service_tls_env(ca: DevelopmentCA, service: str) -> dict[str, str]:
    """The variables that make `service` serve gRPC with mTLS (clients need a certificate from `ca`) and call
    other services with its own certificate (KUMIKI_GRPC_*); for placement also its mTLS client identity towards
    quota (KUMIKI_QUOTA_CAFILE/CERTFILE/KEYFILE, which its admission client reads)."""
    files = ca.files(service) if (ca.folder / f"{service}.pem").exists() else ca.issue(service)
    env = {
        "KUMIKI_TLS_CERTFILE": str(files.certfile),
        "KUMIKI_TLS_KEYFILE": str(files.keyfile),
        "KUMIKI_TLS_CLIENT_CAFILE": str(ca.cafile),
        **client_tls_env(ca, service),
    }
    if service == "placement":
        env.update(
            KUMIKI_QUOTA_CAFILE=str(ca.cafile),
            KUMIKI_QUOTA_CERTFILE=str(files.certfile),
            KUMIKI_QUOTA_KEYFILE=str(files.keyfile),
        )
    return env
