"""HTTPS served by the broker itself: real uvicorn, real sockets, certificates made by trustme."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import trustme
from cryptography import x509

from broker.runtime.settings import SettingsError
from broker.runtime.tls import CertificateFiles, RenewingContext
from tests.support.brokers import (
    ADMIN_KEY,
    CertificateAuthority,
    HTTPSBroker,
    free_port,
    served_serial,
    wait_for_port,
)

ROOT = Path(__file__).resolve().parents[2]


def events(lines: Iterator[str], count: int) -> list[tuple[str, str, dict[str, object]]]:
    """The next `count` events of a stream's lines (comments and retry hints skipped): type,
    id, data."""
    found: list[tuple[str, str, dict[str, object]]] = []
    kind = cursor = ""
    for line in lines:
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("id:"):
            cursor = line[3:].strip()
        elif line.startswith("data:") and kind:
            found.append((kind, cursor, json.loads(line[5:])))
            kind = ""
            if len(found) == count:
                return found
    raise AssertionError(f"the stream ended after {found}")


# ---- serving ----


def test_broker_serves_https_to_clients_that_trust_its_ca(https_broker: HTTPSBroker) -> None:
    with https_broker.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        put = client.put("/v1/namespaces/tls/memory/k", json={"value": 1})
        assert put.status_code == 201
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{https_broker.url}/healthz", timeout=10)  # the public CAs do not know it
    with pytest.raises(httpx.RemoteProtocolError):  # plain HTTP gets no answer
        httpx.get(f"http://127.0.0.1:{https_broker.port}/healthz", timeout=10)


def test_sse_resumes_from_last_event_id_over_tls(https_broker: HTTPSBroker) -> None:
    ns = f"t-{uuid.uuid4().hex[:12]}"
    with https_broker.client() as client:
        with client.stream("GET", "/v1/subscribe", params={"namespace": ns, "pattern": "*"},
                           headers={"Accept": "text/event-stream"}) as stream:
            for n in (1, 2):
                client.put(f"/v1/namespaces/{ns}/memory/k{n}", json={"value": n})
            seen = events(stream.iter_lines(), 2)
        assert [data["key"] for _, _, data in seen] == ["k1", "k2"]
        for n in (3, 4):
            client.put(f"/v1/namespaces/{ns}/memory/k{n}", json={"value": n})
        with client.stream("GET", "/v1/subscribe", params={"namespace": ns, "pattern": "*"},
                           headers={"Accept": "text/event-stream",
                                    "Last-Event-ID": seen[-1][1]}) as stream:
            resumed = events(stream.iter_lines(), 2)
    assert [data["key"] for _, _, data in resumed] == ["k3", "k4"]


def test_renewed_certificate_reaches_new_connections_while_a_stream_keeps_delivering(
    https_broker: HTTPSBroker,
) -> None:
    authority = https_broker.authority
    trust = authority.client_context()
    first = authority.serial
    assert served_serial(https_broker.port, trust) == first
    ns = f"t-{uuid.uuid4().hex[:12]}"
    with https_broker.client() as writer, https_broker.client() as reader, \
            reader.stream("GET", "/v1/subscribe", params={"namespace": ns, "pattern": "*"},
                          headers={"Accept": "text/event-stream"}) as stream:
        lines = stream.iter_lines()
        writer.put(f"/v1/namespaces/{ns}/memory/before", json={"value": 1})
        assert events(lines, 1)[0][2]["key"] == "before"

        renewed = authority.issue()
        assert renewed != first
        assert served_serial(https_broker.port, trust) == renewed
        writer.put(f"/v1/namespaces/{ns}/memory/after", json={"value": 2})
        assert events(lines, 1)[0][2]["key"] == "after"  # the same connection, still open
        tls = stream.extensions["network_stream"].get_extra_info("ssl_object")
        kept = x509.load_der_x509_certificate(tls.getpeercert(True))
        assert kept.serial_number == first


def test_half_written_renewal_keeps_the_old_certificate_until_both_files_agree(
    certificate_authority: CertificateAuthority, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = certificate_authority.files
    renewing = RenewingContext(files)
    before = renewing.refresh()
    assert before is renewing.listening
    leaf = certificate_authority.ca.issue_cert("127.0.0.1")
    leaf.cert_chain_pems[0].write_to_path(files.cert)  # the certificate, not yet its key
    with caplog.at_level(logging.WARNING, "memp.tls"):
        assert renewing.refresh() is before
        assert renewing.refresh() is before
    warnings = [r.getMessage() for r in caplog.records if r.name == "memp.tls"]
    assert len(warnings) == 1 and "does not match" in warnings[0], warnings
    leaf.private_key_pem.write_to_path(files.key or "")
    after = renewing.refresh()
    assert after is not before and renewing.refresh() is after


def test_a_vanished_file_keeps_the_loaded_certificate(
    certificate_authority: CertificateAuthority,
) -> None:
    renewing = RenewingContext(certificate_authority.files)
    os.remove(certificate_authority.files.key or "")
    assert renewing.refresh() is renewing.listening
    certificate_authority.issue()
    assert renewing.refresh() is not renewing.listening


# ---- memp-broker serve ----


def clean_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MEMP_") and k != "AMP_PURGE_RETENTION"}
    return {**base, **env}


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[subprocess.Popen[str], str]]]:
    """`memp-broker serve ARGS`; returns the process and the line saying where it listens."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> tuple[subprocess.Popen[str], str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--log-level", "warning", *args],
            env=clean_env(MEMP_ADMIN_KEY=ADMIN_KEY, **env), cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        started.append(process)
        assert process.stdout is not None
        line = "-"
        while line and "listening" not in line:
            line = process.stdout.readline()
        return process, line

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()


def test_serve_with_a_certificate_listens_on_https(
    serve: Callable[..., tuple[subprocess.Popen[str], str]],
    certificate_authority: CertificateAuthority,
) -> None:
    files = certificate_authority.files
    port = free_port()
    _, line = serve("--port", str(port), "--tls-cert", files.cert, "--tls-key", files.key or "")
    assert f"listening on https://127.0.0.1:{port}" in line
    wait_for_port(port, timeout=20)
    reply = httpx.get(f"https://127.0.0.1:{port}/readyz", timeout=10,
                      verify=certificate_authority.client_context())
    assert reply.json() == {"status": "ready", "store": "embedded"}


def test_workers_each_serve_https_and_pick_up_a_renewal(
    serve: Callable[..., tuple[subprocess.Popen[str], str]],
    certificate_authority: CertificateAuthority, redis_url: str,
) -> None:
    files = certificate_authority.files
    port = free_port()
    # Flags, not the environment: the worker processes must get them all the same.
    _, line = serve("--port", str(port), "--workers", "2", "--redis-url", redis_url,
                    "--tls-cert", files.cert, "--tls-key", files.key or "")
    assert f"listening on https://127.0.0.1:{port}" in line
    trust = certificate_authority.client_context()
    wait_for_port(port, timeout=30)
    with httpx.Client(verify=trust, timeout=10) as client:
        # A fresh connection each time, so both workers answer.
        for _ in range(6):
            reply = client.get(f"https://127.0.0.1:{port}/readyz", headers={"Connection": "close"})
            assert reply.json() == {"status": "ready", "store": "redis"}
    renewed = certificate_authority.issue()
    assert {served_serial(port, trust) for _ in range(12)} == {renewed}


def test_serve_with_a_combined_pem_file_needs_no_key_flag(
    serve: Callable[..., tuple[subprocess.Popen[str], str]], tmp_path: Path,
) -> None:
    ca = trustme.CA()
    combined = tmp_path / "combined.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(combined))
    port = free_port()
    _, line = serve("--port", str(port), MEMP_TLS_CERT=str(combined))
    assert "listening on https://" in line
    wait_for_port(port, timeout=20)
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    assert httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trust, timeout=10).is_success


def _other_key(tmp_path: Path) -> str:
    path = tmp_path / "other-key.pem"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(path))
    return str(path)


def _encrypted_key(tmp_path: Path, authority: CertificateAuthority) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(Path(authority.files.key or "").read_bytes(), None)
    path = tmp_path / "encrypted-key.pem"
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    return str(path)


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        pytest.param(lambda tmp, auth: ["--tls-cert", str(tmp / "missing.pem"),
                                        "--tls-key", auth.files.key],
                     "missing.pem: No such file or directory", id="missing-certificate"),
        pytest.param(lambda tmp, auth: ["--tls-cert", auth.files.cert,
                                        "--tls-key", str(tmp / "missing.pem")],
                     "missing.pem: No such file or directory", id="missing-key"),
        pytest.param(lambda tmp, auth: ["--tls-cert", auth.files.cert,
                                        "--tls-key", _other_key(tmp)],
                     "does not match the certificate", id="mismatched-pair"),
        pytest.param(lambda tmp, auth: ["--tls-cert", auth.files.key,
                                        "--tls-key", auth.files.key],
                     "holds no PEM certificate", id="key-given-as-certificate"),
        pytest.param(lambda tmp, auth: ["--tls-cert", auth.files.cert,
                                        "--tls-key", auth.files.cert],
                     "holds no PEM private key", id="certificate-given-as-key"),
        pytest.param(lambda tmp, auth: ["--tls-cert", auth.files.cert],
                     "holds no private key; give it with --tls-key", id="no-key-anywhere"),
        pytest.param(lambda tmp, auth: ["--tls-cert", auth.files.cert,
                                        "--tls-key", _encrypted_key(tmp, auth)],
                     "is encrypted", id="encrypted-key"),
        pytest.param(lambda tmp, auth: ["--tls-key", auth.files.key],
                     "MEMP_TLS_KEY is set without MEMP_TLS_CERT", id="key-without-certificate"),
    ],
)
def test_serve_refuses_tls_settings_it_cannot_serve(
    broken: Callable[[Path, CertificateAuthority], list[str]], reason: str,
    tmp_path: Path, certificate_authority: CertificateAuthority,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "serve", "--port", str(free_port()),
         *broken(tmp_path, certificate_authority)],
        env=clean_env(), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memp-broker: "), result.stderr
    assert reason in lines[0]
    assert "listening" not in result.stdout


def test_certificate_files_refuse_with_settings_errors(
    certificate_authority: CertificateAuthority, tmp_path: Path,
) -> None:
    files = certificate_authority.files
    with pytest.raises(SettingsError, match="does not match"):
        CertificateFiles(files.cert, _other_key(tmp_path)).load()
    context, leaf = files.load()
    assert context.verify_mode == ssl.CERT_NONE  # no client certificates asked for
    assert leaf.serial_number == certificate_authority.serial
