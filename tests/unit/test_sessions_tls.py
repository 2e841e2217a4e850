"""The call API over HTTPS (`dsb operator --session-tls-cert/--session-tls-key`): start_session_api serves TLS with
the given certificate, and the client verifies it with the CA bundle it is given (verify=, $DSB_SESSION_CA)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from durable_sandbox.client import AsyncSandboxClient
from durable_sandbox.sessions.http import start_session_api
from durable_sandbox.stores.sqlite import SqliteStore
from tests.unit.sessions_support import local_gate, service


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "durable-sandbox-sessions")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_the_call_api_serves_https_and_the_client_verifies_it(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    svc = service(SqliteStore(tmp_path / "runs.db"), await local_gate(tmp_path / "home"))
    api = await start_session_api(svc, host="127.0.0.1", port=0, certfile=str(cert), keyfile=str(key))
    try:
        url = f"https://127.0.0.1:{api.port}"
        async with AsyncSandboxClient.attach("box", namespace="demo", url=url, token="good-token",
                                             verify=str(cert)) as box:
            assert (await box.run("echo over tls", operation_id="t1")).stdout == "over tls\n"
        async with httpx.AsyncClient(verify=True) as unverified:  # the system's CAs do not know this certificate
            with pytest.raises(httpx.ConnectError):
                await unverified.get(f"{url}/healthz")
        async with httpx.AsyncClient() as plain:  # plain HTTP to the TLS port is no call
            with pytest.raises(httpx.HTTPError):
                await plain.post(f"http://127.0.0.1:{api.port}/v1/namespaces/demo/sandboxes/box/shell",
                                 json={"operationId": "t2", "command": "true"})
    finally:
        await api.stop()
