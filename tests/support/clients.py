"""Clients of a broker over HTTP as the tests use them: keys with grants, writes and reads
that return the reply, error checks, namespace configuration, a client of the store, and a
runner of calls made at once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.support.brokers import (
    ADMIN_KEY,
    Broker,
    data_client,
)


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "details", "request_id"}
    assert error["request_id"] == response.headers["x-request-id"]
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], dict)
    if status == 401:
        assert response.headers["www-authenticate"].lower().startswith("bearer")
    return error


def create_key(admin: httpx.Client, *grants: tuple[str, list[str]]) -> tuple[str, str]:
    """Create an API key with the given (namespace glob, permissions) grants: (api_key, id)."""
    response = admin.post("/v1/keys", json={
        "name": "test", "grants": [{"namespace": n, "permissions": p} for n, p in grants]})
    assert response.status_code == 201, response.text
    body = response.json()
    return body["api_key"], body["key"]["id"]


WAIT = 15.0  # seconds an expected event may take to arrive


def configure(client: httpx.Client, ns: str, **config: Any) -> dict[str, Any]:
    response = client.put(f"/v1/namespaces/{ns}/config", json=config)
    assert response.status_code == 200, response.text
    stored: dict[str, Any] = response.json()
    return stored


def put(client: httpx.Client, ns: str, key: str, value: Any, **body: Any) -> httpx.Response:
    return client.put(f"/v1/namespaces/{ns}/memory/{key}", json={"value": value, **body})


def put_ok(client: httpx.Client, ns: str, key: str, value: Any, **body: Any) -> dict[str, Any]:
    response = put(client, ns, key, value, **body)
    assert response.status_code in (200, 201), response.text
    entry: dict[str, Any] = response.json()
    return entry


def get(client: httpx.Client, ns: str, key: str) -> dict[str, Any]:
    response = client.get(f"/v1/namespaces/{ns}/memory/{key}")
    assert response.status_code == 200, response.text
    entry: dict[str, Any] = response.json()
    return entry


def error_of(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code
    return error


def replayed_event(base_url: str, ns: str, key: str, version: int, token: str = ADMIN_KEY
                   ) -> dict[str, Any]:
    """The change event for `key` at `version`, replayed from the start of the namespace's log
    by GET /v1/subscribe with a `Last-Event-ID` cursor; fails after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": f"{ns}:0-0"}
    params = {"namespace": ns, "pattern": key}
    timeout = httpx.Timeout(10.0, read=WAIT)
    with httpx.Client(base_url=base_url, timeout=timeout) as client, \
            client.stream("GET", "/v1/subscribe", params=params, headers=headers) as response:
        assert response.status_code == 200, response.read()
        name, data = "message", []
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                break
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and data:
                event = json.loads("\n".join(data))
                if event.get("key") == key and event.get("version") == version:
                    event["event"] = name
                    return dict(event)
                name, data = "message", []
    raise AssertionError(f"no event for {key} v{version} within {WAIT}s")


def sync_client(broker: Broker) -> Any:
    """A synchronous client on the broker's data: its Redis, or its embedded server."""
    return data_client(broker.app)


def run_all(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run the jobs on threads at once (released together) and return their results in order."""
    start = threading.Barrier(len(jobs))

    def gated(job: Callable[[], Any]) -> Any:
        start.wait(timeout=30)
        return job()

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(gated, job) for job in jobs]
        return [f.result(timeout=120) for f in futures]
