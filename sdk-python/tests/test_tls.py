"""The SDK and `memp` against a broker serving HTTPS: certificates are verified, against a CA
bundle when one is given, and one that cannot be verified fails at once, streams included."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme

from memp import MEMP, AsyncMEMP, ConnectionFailed
from tests.support.brokers import ADMIN_KEY, CertificateAuthority, HTTPSBroker

WAIT = 15.0
_BIN = Path(sys.executable).with_name("memp")
MEMP_COMMAND = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "memp.cli"]


@pytest.fixture
def stranger_ca(tmp_path: Path) -> str:
    """A bundle holding some other CA, which never signed the broker's certificate."""
    path = tmp_path / "stranger.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return str(path)


def test_client_verifies_the_broker_against_its_ca_bundle(
    https_broker: HTTPSBroker, ns: str,
) -> None:
    ca = str(https_broker.authority.ca_file)
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url,
              ca_bundle=ca) as broker:
        broker.memory.put("customer/1", {"plan": "pro"})
        assert broker.memory.get("customer/1") == {"plan": "pro"}


def test_ca_bundle_comes_from_the_environment(
    https_broker: HTTPSBroker, ns: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMP_CA_BUNDLE", str(https_broker.authority.ca_file))
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url) as broker:
        assert broker.memory.put("k", 1).version == 1


@pytest.mark.parametrize("bundle", [pytest.param(False, id="default-trust"),
                                    pytest.param(True, id="another-ca")])
def test_a_certificate_it_cannot_verify_fails_at_once(
    https_broker: HTTPSBroker, ns: str, stranger_ca: str, bundle: bool,
) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url, max_retries=3,
              ca_bundle=stranger_ca if bundle else None) as broker:
        broker.config.backoff = broker.config.max_backoff = 30.0  # a retry would show
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match="could not verify the certificate") as info:
            broker.memory.get("k")
        assert time.monotonic() - started < 5
    assert (stranger_ca if bundle else "MEMP_CA_BUNDLE") in info.value.message
    assert "CERTIFICATE_VERIFY_FAILED" not in info.value.message  # OpenSSL's words, not ours
    assert "self-signed" in info.value.message or "issuer" in info.value.message


def test_async_client_verifies_against_its_ca_bundle(https_broker: HTTPSBroker, ns: str,
                                                     stranger_ca: str) -> None:
    async def run() -> None:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url,
                             ca_bundle=https_broker.authority.ca_file) as broker:
            assert (await broker.memory.put("k", 1)).version == 1
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url,
                             ca_bundle=stranger_ca) as broker:
            with pytest.raises(ConnectionFailed, match="could not verify"):
                await broker.memory.get("k")

    asyncio.run(run())


def test_an_unreadable_bundle_or_a_bundle_beside_a_client_is_refused(
    tmp_path: Path, https_broker: HTTPSBroker,
) -> None:
    import httpx

    with pytest.raises(ValueError, match=r"missing\.pem"):
        MEMP(base_url=https_broker.url, ca_bundle=tmp_path / "missing.pem")
    with httpx.Client() as http, pytest.raises(ValueError, match="http_client"):
        MEMP(base_url=https_broker.url, ca_bundle=https_broker.authority.ca_file,
             http_client=http)


def test_subscription_resumes_over_tls(
    https_broker: HTTPSBroker, ns: str, collect: Callable[..., Any],
) -> None:
    ca = str(https_broker.authority.ca_file)
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url,
              ca_bundle=ca) as broker:
        first = collect(broker.subscribe("customer/*"))
        broker.memory.put("customer/1", 1)
        [event] = first.take(1)
        first.close()
        broker.memory.put("customer/2", 2)
        broker.memory.put("customer/3", 3)
        resumed = collect(broker.subscribe("customer/*", last_event_id=event.id))
        assert [e.key for e in resumed.take(2)] == ["customer/2", "customer/3"]


def test_subscription_to_a_broker_it_cannot_verify_ends_with_the_error(
    https_broker: HTTPSBroker, ns: str,
) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url) as broker:
        subscription = broker.subscribe("*")
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match="could not verify"):
            subscription.open()  # not reconnecting forever
        assert time.monotonic() - started < WAIT

    async def run() -> None:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=https_broker.url) as a:
            with pytest.raises(ConnectionFailed, match="could not verify"):
                await asyncio.wait_for(a.subscribe("*").open(), WAIT)

    asyncio.run(run())


def test_memp_command_takes_a_ca_bundle(
    https_broker: HTTPSBroker, ns: str, certificate_authority: CertificateAuthority,
) -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "MEMP_CA_BUNDLE"},
           "MEMP_BASE_URL": https_broker.url, "MEMP_API_KEY": ADMIN_KEY, "MEMP_NAMESPACE": ns}

    def memp(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MEMP_COMMAND, *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=WAIT)

    ca = str(certificate_authority.ca_file)
    assert memp("--ca-bundle", ca, "put", "k", '"v"').returncode == 0
    assert memp("get", "k", MEMP_CA_BUNDLE=ca).stdout.strip() == '"v"'
    refused = memp("get", "k")
    assert refused.returncode == 3
    assert "could not verify the certificate" in refused.stderr
    missing = memp("--ca-bundle", "/nonexistent/ca.pem", "get", "k")
    assert missing.returncode == 2 and "/nonexistent/ca.pem" in missing.stderr
