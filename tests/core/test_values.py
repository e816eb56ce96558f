"""Stored values are canonical (broker/core/values.py), over real HTTP on both stores: whatever
whitespace or repeated keys a writer sends, the broker stores the compact JSON of the value it
checked, so every read shows it and every change event is one `data:` line that parses to it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from broker.storage import layout
from tests.support.brokers import ADMIN_KEY, Broker
from tests.support.clients import configure, error_of

JSON = {"Content-Type": "application/json"}
WAIT = 15.0
SPACING = [
    pytest.param(b"\n", id="lf"),
    pytest.param(b"\r", id="cr"),
    pytest.param(b"\r\n", id="crlf"),
    pytest.param(b"\n\n \t\r\n", id="mixed"),
]


def raw_put(client: httpx.Client, ns: str, key: str, body: bytes, **headers: str
            ) -> httpx.Response:
    return client.put(f"/v1/namespaces/{ns}/memory/{key}", content=body,
                      headers={**JSON, **headers})


def spaced_value(gap: bytes) -> bytes:
    """{"a": 1, "b": ["x", {"c": null}]} with `gap` between every token."""
    tokens = [b"{", b'"a"', b":", b"1", b",", b'"b"', b":", b"[", b'"x"', b",", b"{", b'"c"',
              b":", b"null", b"}", b"]", b"}"]
    return gap.join(tokens)


def spaced(gap: bytes) -> bytes:
    """A put body whose value has `gap` between every token."""
    return b"{" + gap + b'"value"' + gap + b":" + gap + spaced_value(gap) + gap + b"}"


VALUE = {"a": 1, "b": ["x", {"c": None}]}
COMPACT = b'{"a":1,"b":["x",{"c":null}]}'


def sse_blocks(base_url: str, ns: str, *, events: int, last_event_id: str | None = None,
               snapshot: bool = False, token: str = ADMIN_KEY) -> list[list[str]]:
    """The first `events` event blocks (lists of field lines) of a subscription to the whole
    namespace, read as raw text so a value split over lines would show."""
    headers = {"Authorization": f"Bearer {token}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    params = {"namespace": ns, "pattern": "*", **({"snapshot": "1"} if snapshot else {})}
    blocks: list[list[str]] = []
    text = ""
    deadline = time.monotonic() + WAIT
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(10.0, read=WAIT)) as client, \
            client.stream("GET", "/v1/subscribe", params=params, headers=headers) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_text():
            text += chunk
            while "\n\n" in text:
                block, text = text.split("\n\n", 1)
                lines = [line for line in block.split("\n") if not line.startswith(":")]
                if any(line.startswith("event:") for line in lines):
                    blocks.append(lines)
            if len(blocks) >= events or time.monotonic() > deadline:
                break
    assert len(blocks) >= events, f"only {len(blocks)} events arrived: {blocks}"
    return blocks[:events]


def one_line_data(block: list[str]) -> Any:
    """The event's data, checking it is exactly one `data:` line."""
    data = [line for line in block if line.startswith("data:")]
    assert len(data) == 1, block
    return json.loads(data[0][5:])


@pytest.mark.parametrize("gap", SPACING)
def test_line_breaks_between_tokens_are_not_stored(
        broker: Broker, admin: httpx.Client, ns: str, gap: bytes) -> None:
    written = raw_put(admin, ns, "spaced", spaced(gap))
    assert written.status_code == 201, written.text
    assert b'"value":' + COMPACT in written.content
    for response in (admin.get(f"/v1/namespaces/{ns}/memory/spaced"),
                     admin.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}),
                     admin.get(f"/v1/namespaces/{ns}/history/spaced")):
        assert response.status_code == 200, response.text
        assert b'"value":' + COMPACT in response.content, response.content
    live = one_line_data(sse_blocks(broker.url, ns, events=1, last_event_id=f"{ns}:0-0")[0])
    assert live["value"] == VALUE and live["version"] == 1
    snap = sse_blocks(broker.url, ns, events=2, snapshot=True)
    assert one_line_data(snap[0])["value"] == VALUE
    assert one_line_data(snap[1])["cursor"]


def test_every_write_path_stores_the_canonical_value(
        broker: Broker, admin: httpx.Client, ns: str) -> None:
    configure(admin, ns, rules=[{"pattern": "merged/*", "strategy": "merge"}])
    message = (b'{"memp": "1.0", "type": "memory.put", "namespace": "' + ns.encode()
               + b'", "key": "by-message", "value":\r\n' + spaced_value(b"\r\n") + b"}")
    ack = admin.post("/v1/messages", content=message, headers=JSON)
    assert ack.status_code == 200, ack.text
    batch = admin.post("/v1/messages", content=b"[" + message.replace(
        b"by-message", b"by-batch") + b"]", headers=JSON)
    assert batch.status_code == 200 and batch.json()[0]["type"] == "ack", batch.text
    assert raw_put(admin, ns, "merged/doc", b'{"value": {"x":\n {"y": 1}}}').status_code == 201
    assert raw_put(admin, ns, "merged/doc", b'{"value": {"x":\r\n {"z":\r 2}}}'
                   ).status_code == 200
    blocks = sse_blocks(broker.url, ns, events=4, last_event_id=f"{ns}:0-0")
    values = {one_line_data(b)["key"]: one_line_data(b)["value"] for b in blocks}
    assert values == {"by-message": VALUE, "by-batch": VALUE,
                      "merged/doc": {"x": {"y": 1, "z": 2}}}
    merged = admin.get(f"/v1/namespaces/{ns}/memory/merged/doc")
    assert b'"value":{"x":{"y":1,"z":2}}' in merged.content


def test_a_repeated_key_keeps_its_last_value_and_that_is_what_the_schema_checks(
        admin: httpx.Client, ns: str) -> None:
    schema = {"type": "object", "required": ["role"], "properties": {"role": {"const": "user"}}}
    registered = admin.put(f"/v1/namespaces/{ns}/schemas/roles",
                           json={"pattern": "*", "schema": schema, "enforce": True})
    assert registered.status_code == 201, registered.text
    sneaky = raw_put(admin, ns, "who", b'{"value": {"role": "user", "role": "admin"}}')
    error_of(sneaky, 422, "schema_violation")
    assert admin.get(f"/v1/namespaces/{ns}/memory/who").status_code == 404
    honest = raw_put(admin, ns, "who", b'{"value": {"role": "admin", "role": "user"}}')
    assert honest.status_code == 201, honest.text
    stored = admin.get(f"/v1/namespaces/{ns}/memory/who")
    assert b'"value":{"role":"user"}' in stored.content
    assert stored.json()["schema_violation"] is False


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"[1e999]"])
def test_numbers_beyond_a_double_are_refused_not_rounded(
        admin: httpx.Client, ns: str, number: bytes) -> None:
    assert raw_put(admin, ns, "n", b'{"value": 1}').status_code == 201
    error_of(raw_put(admin, ns, "n", b'{"value": ' + number + b"}"), 400, "invalid_json")
    assert admin.get(f"/v1/namespaces/{ns}/memory/n").json()["value"] == 1


def test_a_value_stored_by_an_older_release_with_line_breaks_is_served_on_one_line(
        broker_factory: Callable[..., Broker], ns: str, redis_url: str) -> None:
    """Releases before canonical values stored the writer's bytes in Redis; reads, history
    and snapshots of such an entry still send the value on one line."""
    broker = broker_factory("redis")
    with broker.client() as admin:
        written = raw_put(admin, ns, "old", b'{"value": {"a": 1}}').json()
        client = redis.Redis.from_url(redis_url)
        try:
            client.hset(layout.entry(ns, "old"), "val", b'{"a":\n\r\n 1}')
            history = client.lindex(layout.history(ns, "old"), 0)
            assert history is not None
            old = json.loads(history)
            old["val"] = '{"a":\n\r\n 1}'
            client.lset(layout.history(ns, "old"), 0, json.dumps(old))
        finally:
            client.close()
        for path in (f"/v1/namespaces/{ns}/memory/old", f"/v1/namespaces/{ns}/history/old"):
            response = admin.get(path)
            assert b'"value":{"a":1}' in response.content, response.content
    snap = sse_blocks(broker.url, ns, events=1, snapshot=True)
    assert one_line_data(snap[0])["value"] == {"a": 1}
    assert written["version"] == 1


def test_an_amp_cell_written_with_line_breaks_reaches_memp_subscribers_on_one_line(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    broker = broker_factory("embedded", amp_namespace=ns)
    body = (b'{\r\n"type":\n"semantic",\r\n"content": {"text": "two\\nlines",\n'
            b'"metadata": {"a":\r\n [1,\n 2]}},\n"identity": {"owner_id": "u-1",\r\n'
            b'"owner_type": "user"}}')
    with broker.client() as admin:
        created = admin.post("/amp/memories", content=body,
                             headers={**JSON, "X-AMP-Agent-ID": "agent-1"})
        assert created.status_code == 201, created.text
    block = sse_blocks(broker.url, ns, events=1, last_event_id=f"{ns}:0-0")[0]
    cell = one_line_data(block)["value"]
    assert cell["content"] == {"text": "two\nlines", "metadata": {"a": [1, 2]}}
