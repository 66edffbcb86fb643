"""Fixtures: real ``kairos`` nodes in temp dirs on free ports, one per target.

- ``dev``: ``kairos dev`` (embedded store, authentication off, plaintext);
- ``serve``: ``kairos serve`` with TLS on both listeners and mutual TLS on gRPC (a CA, a node
  certificate and a client certificate made here with ``cryptography``), API keys required:
  the bootstrap admin key from ``DATA_DIR/admin-key`` creates a ``submit,read,definitions``
  key for the client and a ``worker`` key for workers.

Each conformance test prints ``conformance python <target> <id> ok|FAILED <detail>``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

import kairos

REPO = Path(__file__).resolve().parents[3]


def kairos_bin() -> Path:
    env = os.environ.get("KAIROS_BIN")
    candidates = [Path(env)] if env else [REPO / "target/release/kairos", REPO / "target/debug/kairos"]
    for c in candidates:
        if c.is_file():
            return c
    raise RuntimeError(f"no kairos binary: set KAIROS_BIN or build it (looked at {', '.join(map(str, candidates))})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Target:
    """A running node and how to reach it."""

    name: str
    grpc: str
    proc: subprocess.Popen[bytes]
    dir: Path
    tls: Optional[kairos.Tls] = None
    client_key: Optional[str] = None
    worker_key: Optional[str] = None
    admin_key: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def client(self, **kw: Any) -> kairos.Client:
        """A client with the `submit,read,definitions` key (serve)."""
        return kairos.Client(self.grpc, api_key=self.client_key or "", tls=self.tls, **kw)

    def worker_client(self) -> kairos.Client:
        """A client with the `worker` key (serve)."""
        return kairos.Client(self.grpc, api_key=self.worker_key or "", tls=self.tls)

    def worker_env(self) -> dict[str, str]:
        """What a worker in a child process needs to connect like this one."""
        env = dict(os.environ, KAIROS_ENDPOINT=self.grpc, KAIROS_API_KEY=self.worker_key or "")
        if self.tls is not None:
            env.update(
                KAIROS_CA_CERT=str(self.tls.ca_cert),
                KAIROS_CLIENT_CERT=str(self.tls.client_cert),
                KAIROS_CLIENT_KEY=str(self.tls.client_key),
            )
        return env


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, ctx: Optional[ssl.SSLContext] = None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kairos exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1, context=ctx) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"kairos not healthy after 30 s: {log.read_text()[-2000:]}")


def start_dev(dir: Path, http: int = 0, grpc_port: int = 0) -> Target:
    """`kairos dev` on `dir`/data (on the given ports: a restart of the same node)."""
    http, grpc_port = http or free_port(), grpc_port or free_port()
    log = dir / "node.log"
    proc = subprocess.Popen(
        [str(kairos_bin()), "dev", "--data-dir", str(dir / "data"), "--listen-http", f"127.0.0.1:{http}",
         "--listen-grpc", f"127.0.0.1:{grpc_port}", "--log", "warn"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )
    _wait_healthy(f"http://127.0.0.1:{http}", proc, log)
    t = Target("dev", f"http://127.0.0.1:{grpc_port}", proc, dir)
    t.extra["ports"] = (http, grpc_port)
    return t


def make_certs(dir: Path) -> dict[str, Path]:
    """A CA, a node certificate for localhost / 127.0.0.1 and a client certificate, all PEM."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(k: ec.EllipticCurvePrivateKey, p: Path) -> None:
        p.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    ca_key = key()
    ca = (
        x509.CertificateBuilder().subject_name(name("kairos test CA")).issuer_name(name("kairos test CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: Any, sans: list[x509.GeneralName]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        k = key()
        b = (
            x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca.subject).public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return b.sign(ca_key, hashes.SHA256()), k

    node, node_key = leaf("localhost", ExtendedKeyUsageOID.SERVER_AUTH,
                          [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client, client_key = leaf("kairos test client", ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName("client")])
    paths = {n: dir / f"{n}.pem" for n in ("ca", "node", "node-key", "client", "client-key")}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["node"].write_bytes(node.public_bytes(serialization.Encoding.PEM))
    paths["client"].write_bytes(client.public_bytes(serialization.Encoding.PEM))
    write_key(node_key, paths["node-key"])
    write_key(client_key, paths["client-key"])
    return paths


def start_serve(dir: Path) -> Target:
    certs = make_certs(dir)
    http, grpc_port = free_port(), free_port()
    log = dir / "node.log"
    data = dir / "data"
    proc = subprocess.Popen(
        [str(kairos_bin()), "serve", "--data-dir", str(data), "--listen-http", f"127.0.0.1:{http}",
         "--listen-grpc", f"127.0.0.1:{grpc_port}", "--log", "warn",
         "--tls-cert-file", str(certs["node"]), "--tls-key-file", str(certs["node-key"]),
         "--tls-client-ca-file", str(certs["ca"])],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    ctx = ssl.create_default_context(cafile=str(certs["ca"]))
    _wait_healthy(f"https://localhost:{http}", proc, log, ctx)
    admin_file = data / "admin-key"
    deadline = time.monotonic() + 10
    while not admin_file.is_file() or not admin_file.read_text().strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {admin_file}: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    admin_key = admin_file.read_text().strip().splitlines()[0]
    tls = kairos.Tls(ca_cert=certs["ca"], client_cert=certs["client"], client_key=certs["client-key"])
    t = Target("serve", f"https://localhost:{grpc_port}", proc, dir, tls=tls, admin_key=admin_key)
    t.extra["certs"] = certs

    async def keys() -> None:
        async with kairos.Client(t.grpc, api_key=admin_key, tls=tls) as admin:
            _, t.client_key = await admin.create_api_key(["submit", "read", "definitions"], name="py-client")
            _, t.worker_key = await admin.create_api_key(["worker"], name="py-worker")

    asyncio.run(keys())
    return t


def _stop(t: Target) -> None:
    t.proc.terminate()
    try:
        t.proc.wait(10)
    except subprocess.TimeoutExpired:
        t.proc.kill()
        t.proc.wait()


@pytest.fixture(scope="session")
def dev_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    t = start_dev(tmp_path_factory.mktemp("dev"))
    yield t
    _stop(t)


@pytest.fixture(scope="session")
def serve_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    t = start_serve(tmp_path_factory.mktemp("serve"))
    yield t
    _stop(t)


@pytest.fixture(params=["dev", "serve"])
def target(request: pytest.FixtureRequest) -> Target:
    return request.getfixturevalue(f"{request.param}_target")  # type: ignore[no-any-return]


# ---- the conformance lines -------------------------------------------------------------------

_LINES: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.failed):
        return
    marker = dict(report.user_properties).get("scenario")
    target_name = dict(report.user_properties).get("target")
    if marker is None:
        return
    if report.passed:
        line = f"conformance python {target_name} {marker} ok"
    else:
        detail = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
        line = f"conformance python {target_name} {marker} FAILED {detail}"
    _LINES.append(line)
    sys.stdout.write("\n" + line + "\n")
    sys.stdout.flush()


@pytest.fixture(autouse=True)
def _scenario_properties(request: pytest.FixtureRequest, record_property: Any) -> None:
    m = request.node.get_closest_marker("scenario")
    if m is not None:
        record_property("scenario", m.args[0])
        callspec = getattr(request.node, "callspec", None)
        record_property("target", callspec.params.get("target", "dev") if callspec else "dev")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _LINES:
        terminalreporter.section("conformance")
        for line in _LINES:
            terminalreporter.write_line(line)
