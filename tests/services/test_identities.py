"""Who a key may act as (broker/services/identities.py, POST /v1/keys), over real HTTP on both
stores: a namespace admin binds keys only to agents registered in namespaces it administers, and no
key, token or AMP header claims one of the broker's own identities."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.brokers import ADMIN_KEY, Broker

RESERVED = ["admin", "Admin", "amp-lifecycle", "key_0123456789abcdef", "jwt:someone", "cli"]


def new_key(client: httpx.Client, grants: list[dict[str, Any]], agent_id: str | None = None
            ) -> httpx.Response:
    body: dict[str, Any] = {"name": "test", "grants": grants}
    if agent_id is not None:
        body["agent_id"] = agent_id
    return client.post("/v1/keys", json=body)


def register(client: httpx.Client, namespace: str, name: str) -> str:
    response = client.post("/v1/agents", json={"name": name, "namespace": namespace})
    assert response.status_code == 201, response.text
    agent_id: str = response.json()["agent"]["id"]
    return agent_id


@pytest.fixture
def tenant_admin(broker: Broker, admin: httpx.Client, ns: str) -> Iterator[httpx.Client]:
    """A client whose key administers `ns` (and only it)."""
    response = new_key(admin, [{"namespace": ns, "permissions": ["admin"]}])
    assert response.status_code == 201, response.text
    with broker.client(response.json()["api_key"]) as client:
        yield client


def key_ids(admin: httpx.Client) -> set[str]:
    return {k["id"] for k in admin.get("/v1/keys").json()["keys"]}


def test_a_namespace_admin_binds_keys_to_its_own_agents_only(
        broker: Broker, admin: httpx.Client, tenant_admin: httpx.Client, ns: str) -> None:
    own = register(tenant_admin, ns, "own-agent")
    foreign = register(admin, f"{ns}-other", "foreign-agent")
    grants = [{"namespace": ns, "permissions": ["read", "write"]}]
    before = key_ids(admin)
    for claimed in (foreign, "never-registered", *RESERVED):
        refused = new_key(tenant_admin, grants, claimed)
        assert refused.status_code == 403, (claimed, refused.text)
        assert refused.json()["error"]["code"] == "forbidden"
    assert key_ids(admin) == before  # nothing was created

    bound = new_key(tenant_admin, grants, own)
    assert bound.status_code == 201, bound.text
    with broker.client(bound.json()["api_key"]) as agent:
        written = agent.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
        assert written.json()["agent_id"] == own


def test_the_full_admin_binds_gateway_names_but_no_reserved_identity(
        broker: Broker, admin: httpx.Client, ns: str) -> None:
    grants = [{"namespace": ns, "permissions": ["read", "write"]}]
    for claimed in RESERVED:
        refused = new_key(admin, grants, claimed)
        assert refused.status_code == 403, (claimed, refused.text)
    for malformed in ("has space", "x" * 129, "", "new\nline"):
        assert new_key(admin, grants, malformed).status_code == 400, malformed
    gateway = new_key(admin, grants, "gateway-7")
    assert gateway.status_code == 201, gateway.text
    with broker.client(gateway.json()["api_key"]) as client:
        written = client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
        assert written.json()["agent_id"] == "gateway-7"
    admin_write = admin.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 2}).json()
    assert admin_write["agent_id"] == "admin"


def test_no_amp_gateway_acts_as_a_reserved_identity(broker_factory: Any, ns: str) -> None:
    broker = broker_factory("embedded", amp_namespace=ns)
    with broker.client() as admin:
        gateway = new_key(admin, [{"namespace": ns, "permissions": ["amp", "impersonate"]}])
        token = gateway.json()["api_key"]
    body = {"type": "semantic", "content": {"text": "x"},
            "identity": {"owner_id": "u", "owner_type": "user"}}
    with broker.client(token) as client:
        for claimed in ("amp-lifecycle", "admin", "key_0123"):
            refused = client.post("/amp/memories", json=body,
                                  headers={"X-AMP-Agent-ID": claimed})
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["details"]["field"] == "X-AMP-Agent-ID"
        found = client.post("/amp/memories/search", json={},
                            headers={"X-AMP-Agent-ID": "gateway-user"}).json()
        assert found["results"] == []


def test_the_cli_refuses_to_bind_a_reserved_identity(redis_url: str) -> None:
    env = {**os.environ, "MEMP_REDIS_URL": redis_url, "MEMP_ADMIN_KEY": ADMIN_KEY}
    result = subprocess.run(
        [sys.executable, "-m", "broker.cli", "keys", "create", "--namespace", "x",
         "--agent-id", "admin"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert "reserved" in result.stderr
