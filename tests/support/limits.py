"""Fair-share helpers: a namespace's limits set over HTTP, its usage, keys of agents, streams
opened to count, and the check of a 429."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.brokers import Broker, BrokerProcess

SLOW = 0.001  # tokens per second: a bucket of burst N admits exactly N requests in a test


def mem(ns: str, key: str) -> str:
    return f"/v1/namespaces/{ns}/memory/{key}"


def set_limits(admin: httpx.Client, ns: str, **limits: Any) -> dict[str, Any]:
    response = admin.put(f"/v1/namespaces/{ns}/config", json={"limits": limits})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def agent_key(admin: httpx.Client, ns: str, name: str = "agent") -> str:
    """A key bound to a newly registered agent (read, write, subscribe on `ns`)."""
    response = admin.post("/v1/agents", json={"name": name, "namespace": ns})
    assert response.status_code == 201, response.text
    return str(response.json()["credentials"]["api_key"])


def usage(admin: httpx.Client, ns: str) -> dict[str, int]:
    response = admin.get(f"/v1/namespaces/{ns}/usage")
    assert response.status_code == 200, response.text
    used: dict[str, int] = response.json()["usage"]
    return used


def assert_rate_limited(response: httpx.Response, scope: str, limit: str) -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "rate_limited"
    assert error["details"]["scope"] == scope
    assert error["details"]["limit"] == limit
    assert int(response.headers["retry-after"]) == error["details"]["retry_after"] >= 1


def open_stream(broker: Broker | BrokerProcess, token: str, ns: str) -> Any:
    client = httpx.Client(base_url=broker.url, timeout=15,
                          headers={"Authorization": f"Bearer {token}"})
    stream = client.stream("GET", "/v1/subscribe", params={"namespace": ns, "pattern": "*"})
    response = stream.__enter__()
    return client, stream, response
