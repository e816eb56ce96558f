"""The one JSON depth limit (MEMP_MAX_JSON_DEPTH, broker/core/nesting.py) on every surface: every
kind of body held to it over real HTTP on both stores, and MCP tool arguments; and values stored
deeper before the limit existed, served or skipped by every reader, never a 500 for anyone."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from broker.core.nesting import DECODED_DEPTH
from tests.support.brokers import BACKENDS, Broker
from tests.support.depth import LIMIT, TOO_DEEP, arrays, objects, reference_depth
from tests.support.mcp import call, connect, refused, register, run


def amp_cell(metadata: bytes, owner: str = "agent-a") -> bytes:
    return (b'{"type":"semantic","content":{"text":"hello nesting","metadata":{"m":' + metadata
            + b'}},"identity":{"owner_id":"' + owner.encode() + b'","owner_type":"user"}}')


# method, path, the body with the deep part as `%`, and how deep the body is around it
BODIES = [
    pytest.param("PUT", "/v1/namespaces/{ns}/memory/k", b'{"value":%}', 1, id="put"),
    pytest.param("POST", "/v1/messages", b'{"memp":"1.0","type":"memory.put","namespace":"{ns}",'
                 b'"key":"k","value":%}', 1, id="message"),
    pytest.param("POST", "/v1/messages", b'[{"memp":"1.0","type":"memory.put",'
                 b'"namespace":"{ns}","key":"k","value":%}]', 2, id="batch"),
    pytest.param("POST", "/amp/memories", amp_cell(b"%"), 3, id="amp-create"),
    pytest.param("PUT", "/v1/namespaces/{ns}/schemas/s", b'{"pattern":"k","schema":'
                 b'{"properties":{"a":{"default":%}}}}', 4, id="schema"),
    pytest.param("PUT", "/v1/namespaces/{ns}/config", b'{"strategy":%}', 1, id="config"),
    pytest.param("POST", "/v1/agents", b'{"name":"n","namespace":"{ns}","metadata":%}', 1,
                 id="agent"),
]


def send(client: httpx.Client, method: str, path: str, body: bytes) -> httpx.Response:
    return client.request(method, path, content=body, headers={
        "Content-Type": "application/json", "X-AMP-Agent-ID": "agent-a"})


@pytest.mark.parametrize(("method", "path", "template", "around"), BODIES)
def test_every_body_is_held_to_the_depth_limit(broker: Broker, ns: str, method: str, path: str,
                                               template: bytes, around: int) -> None:
    path = path.replace("{ns}", ns)
    template = template.replace(b"{ns}", ns.encode())
    with broker.client() as admin:
        before = admin.get(f"/v1/namespaces/{ns}/memory").json()
        deep = send(admin, method, path, template.replace(b"%", arrays(LIMIT + 1 - around)))
        assert deep.status_code == 400, deep.text
        assert deep.json()["error"]["code"] == "invalid_request"
        assert deep.json()["error"]["details"] == TOO_DEEP
        assert "MEMP_MAX_JSON_DEPTH" in deep.json()["error"]["message"]
        assert admin.get(f"/v1/namespaces/{ns}/memory").json() == before  # nothing stored
        at_limit = send(admin, method, path, template.replace(b"%", arrays(LIMIT - around)))
        assert at_limit.status_code != 400 or at_limit.json()["error"]["details"] != TOO_DEEP, \
            at_limit.text
        assert at_limit.status_code < 500, at_limit.text


def test_a_value_at_the_limit_is_stored_and_read_back_whole(broker: Broker, ns: str) -> None:
    value = arrays(LIMIT - 1)
    with broker.client() as admin:
        put = send(admin, "PUT", f"/v1/namespaces/{ns}/memory/k", b'{"value":' + value + b"}")
        assert put.status_code == 201, put.text
        got = admin.get(f"/v1/namespaces/{ns}/memory/k")
        assert got.status_code == 200
        assert json.loads(got.content)["value"] == json.loads(value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_depth_limit_is_a_setting(broker_factory: Callable[..., Broker], ns: str,
                                      backend: str) -> None:
    broker = broker_factory(backend, max_json_depth=8)
    with broker.client() as admin:
        path = f"/v1/namespaces/{ns}/memory/k"
        refused_ = send(admin, "PUT", path, b'{"value":' + arrays(8) + b"}")
        assert refused_.status_code == 400
        assert refused_.json()["error"]["details"] == {"limit": "max_json_depth", "max": 8}
        assert send(admin, "PUT", path, b'{"value":' + arrays(7) + b"}").status_code == 201


def test_mcp_tool_arguments_are_held_to_the_depth_limit(broker: Broker, ns: str) -> None:
    _, token = register(broker, ns)

    def nested(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = [value]
        return value

    async def main() -> None:
        async with connect(broker, token) as client:
            # The arguments object is the document: the value sits one level in.
            error = await refused(client, "memory_put", key="k", value=nested(LIMIT))
            assert (error["code"], error["details"]) == ("invalid_request", TOO_DEEP)
            stored = await call(client, "memory_put", key="k", value=nested(LIMIT - 1))
            assert stored["value"] == nested(LIMIT - 1)
            error = await refused(client, "amp_remember", text="x",
                                  metadata={"m": nested(LIMIT - 1)})
            assert error["details"] == TOO_DEEP

    run(main())


# ---- values stored before the limit ----


@contextlib.contextmanager
def before_the_limit(broker: Broker) -> Iterator[None]:
    """The broker as releases before MEMP_MAX_JSON_DEPTH were: any depth its decoders take."""
    kept = broker.app.state.services
    broker.app.state.services = dataclasses.replace(
        kept, settings=dataclasses.replace(kept.settings, max_json_depth=10**6))
    try:
        yield
    finally:
        broker.app.state.services = kept


# Past the limit but decoded; past what the broker decodes; near what decoders took at all.
LEGACY = {"shallow": 150, "deep": DECODED_DEPTH + 100, "deepest": 700}


@dataclasses.dataclass
class Legacy:
    """Values and cells a broker stored before the limit, and a reader's client."""

    ns: str
    values: dict[str, bytes]
    cells: dict[str, str]
    reader: httpx.Client


@pytest.fixture
def legacy(broker: Broker, ns: str) -> Iterator[Legacy]:
    with broker.client() as admin, before_the_limit(broker):
        values = {}
        for name, levels in LEGACY.items():
            values[name] = objects(levels)
            put = send(admin, "PUT", f"/v1/namespaces/{ns}/memory/{name}",
                       b'{"value":' + values[name] + b"}")
            assert put.status_code == 201, put.text
        cells = {}
        for name in ("shallow", "deep"):
            made = send(admin, "POST", "/amp/memories", amp_cell(objects(LEGACY[name]), ns))
            assert made.status_code == 201, made.text
            cells[name] = made.json()["id"]
        key = admin.post("/v1/keys", json={"name": "reader", "grants": [
            {"namespace": ns, "permissions": ["read", "subscribe"]},
            {"namespace": broker.app.state.services.settings.amp_namespace,
             "permissions": ["amp", "impersonate"]}]})  # an AMP gateway
        assert key.status_code == 201, key.text
    with broker.client(key.json()["api_key"]) as reader:
        yield Legacy(ns, values, cells, reader)


def test_values_stored_deeper_are_served_whole(legacy: Legacy) -> None:
    base = f"/v1/namespaces/{legacy.ns}"
    for name, value in legacy.values.items():
        got = legacy.reader.get(f"{base}/memory/{name}")
        assert got.status_code == 200, got.text
        assert b'"value":' + value + b"," in got.content
        history = legacy.reader.get(f"{base}/history/{name}")
        assert history.status_code == 200 and value in history.content
    page = legacy.reader.get(f"{base}/memory", params={"pattern": "*"})
    assert page.status_code == 200
    assert [e["key"] for e in page.json()["entries"]] == sorted(legacy.values)
    replies = legacy.reader.post("/v1/messages", json=[
        {"memp": "1.0", "type": "memory.get", "namespace": legacy.ns, "key": "deepest"},
        {"memp": "1.0", "type": "memory.query", "namespace": legacy.ns, "pattern": "*"}])
    assert replies.status_code == 200
    assert [r["type"] for r in replies.json()] == ["result", "result"]


def read_events(lines: Iterator[str], wanted: int) -> list[dict[str, Any]]:
    """The `data:` of the next `wanted` events that carry an entry."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + 15
    for line in lines:
        if line.startswith("data:"):
            data = json.loads(line[5:])
            if isinstance(data, dict) and "key" in data:
                found.append(data)
        if len(found) == wanted:
            return found
        assert time.monotonic() < deadline, f"only {len(found)} events came"
    raise AssertionError(f"the stream ended after {len(found)} events")


def test_snapshots_and_live_events_carry_values_stored_deeper(broker: Broker,
                                                              legacy: Legacy) -> None:
    params = {"namespace": legacy.ns, "pattern": "*", "snapshot": "true"}
    with legacy.reader.stream("GET", "/v1/subscribe", params=params) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        snapshot = read_events(lines, len(legacy.values))
        assert sorted(e["key"] for e in snapshot) == sorted(legacy.values)
        with broker.client() as admin, before_the_limit(broker):
            put = send(admin, "PUT", f"/v1/namespaces/{legacy.ns}/memory/later",
                       b'{"value":' + legacy.values["deepest"] + b"}")
            assert put.status_code == 201
        live = read_events(lines, 1)
        assert live[0]["key"] == "later"


def test_mcp_serves_values_stored_deeper(broker: Broker, legacy: Legacy) -> None:
    async def main() -> None:
        async with connect(broker, legacy.reader.headers["Authorization"][7:]) as client:
            shallow = await call(client, "memory_get", namespace=legacy.ns, key="shallow")
            assert reference_depth(shallow["value"]) == LEGACY["shallow"]
            for name in ("deep", "deepest"):  # as text alone: too deep for structured content
                result = await client.call_tool("memory_get", {"namespace": legacy.ns,
                                                               "key": name})
                assert not result.is_error and result.structured_content is None
                assert legacy.values[name] in result.content[0].text.encode()  # type: ignore
            page = await client.call_tool("memory_query", {"namespace": legacy.ns})
            assert not page.is_error

    run(main())


def test_amp_cells_stored_deeper_are_served_or_skipped(legacy: Legacy) -> None:
    agent = {"X-AMP-Agent-ID": "agent-a"}
    found = legacy.reader.post("/amp/memories/search", headers=agent,
                               json={"query": "hello nesting", "owner_id": legacy.ns})
    assert found.status_code == 200, found.text
    assert [h["cell"]["id"] for h in found.json()["results"]] == [legacy.cells["shallow"]]
    assert legacy.reader.get(f"/amp/memories/{legacy.cells['shallow']}",
                             headers=agent).status_code == 200
    deep = legacy.reader.get(f"/amp/memories/{legacy.cells['deep']}", headers=agent)
    assert deep.json()["error"]["code"] == "corrupt_record"  # that one cell, named
    assert str(DECODED_DEPTH) in deep.json()["error"]["message"]


def test_writes_over_values_stored_deeper_never_fail_with_a_500(broker: Broker,
                                                                legacy: Legacy) -> None:
    base = f"/v1/namespaces/{legacy.ns}"
    with broker.client() as admin:
        assert admin.put(f"{base}/config", json={"allow_self_approval": True, "rules": [
            {"pattern": "shallow", "strategy": "merge"}, {"pattern": "deep", "strategy": "merge"},
            {"pattern": "deepest", "approval": "required"}]}).status_code == 200
        merged = admin.put(f"{base}/memory/shallow", json={"value": {"b": 2}})
        assert merged.status_code == 200, merged.text
        assert merged.json()["value"]["b"] == 2 and "a" in merged.json()["value"]
        refused_ = admin.put(f"{base}/memory/deep", json={"value": {"b": 2}})
        assert refused_.status_code == 409, refused_.text
        assert "delete the key" in refused_.json()["error"]["message"]
        assert admin.get(f"{base}/memory/deep").content.count(b"{") > LEGACY["deep"]
        assert admin.delete(f"{base}/memory/deep").status_code == 200
        assert admin.put(f"{base}/memory/deep", json={"value": {"b": 2}}).status_code == 201
        # A proposal over a value too deep to diff replaces it whole.
        proposed = admin.put(f"{base}/memory/deepest", json={"value": {"c": 3}})
        assert proposed.status_code == 202, proposed.text
        assert proposed.json()["diff"] == [{"op": "replace", "path": "", "value": {"c": 3}}]
        approved = admin.post(f"{base}/proposals/{proposed.json()['id']}/approve")
        assert approved.status_code == 200, approved.text
        assert admin.get(f"{base}/memory/deepest").json()["value"] == {"c": 3}
        audit = admin.get(f"{base}/audit")
        assert audit.status_code == 200, audit.text
        assert admin.get(f"{base}/audit/verify").json()["ok"] is True
