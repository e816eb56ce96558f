"""A corrupt stored record is a clear error naming it (broker/storage/records.py), over real
HTTP: an entry, an AMP index record and a namespace configuration that cannot be decoded answer
`500 corrupt_record` with the record named (never `internal`, never a dropped connection), and
every other record reads, lists, queries, replays, streams and expires as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import httpx
import pytest
import redis

from broker.storage import layout
from tests.support.amp import Amp, amp_broker, sync_redis
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, start_broker
from tests.support.streams import Stream


@pytest.fixture(params=BACKENDS)
def amp(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
        ns: str) -> Any:
    with amp_broker(broker_factory, request.param, ns) as client:
        yield client


def corrupt_error(response: httpx.Response, what: str) -> None:
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "corrupt_record"
    assert what in error["message"] and error["details"]["record"], error


def test_corrupt_records_are_named_not_a_bare_500(amp: Amp, redis_url: str, ns: str) -> None:
    cell = amp.create("kept safe")
    other = f"{ns}-data"
    assert amp.http.put(f"/v1/namespaces/{other}/memory/k", json={"value": 1}).status_code \
        == 201
    client = sync_redis(amp, redis_url)
    try:
        client.hset(layout.amp_cell(ns, cell["id"]), "ref", "not-a-number")
        client.hset(layout.entry(other, "k"), "ver", "x1")
        client.set(layout.config(f"{ns}-conf"), b"{not json")
    finally:
        client.close()
    corrupt_error(amp.get(cell["id"]), cell["id"])
    corrupt_error(amp.http.get(f"/v1/namespaces/{other}/memory/k"), f"{other}/k")
    corrupt_error(amp.http.get(f"/v1/namespaces/{ns}-conf/config"), f"{ns}-conf")
    assert amp.http.get("/healthz").status_code == 200
    assert amp.http.put(f"/v1/namespaces/{other}/memory/fine", json={"value": 2}
                        ).status_code == 201


@pytest.fixture(scope="module")
def redis_broker(redis_url: str) -> Iterator[Broker]:
    handle = start_broker("redis", redis_url, sweep_interval_seconds=0.05)
    yield handle
    handle.stop()


@pytest.fixture
def data(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def admin(redis_broker: Broker) -> Iterator[httpx.Client]:
    with redis_broker.client() as client:
        yield client


def entry_key(ns: str, key: str) -> str:
    return layout.entry(ns, key)


CORRUPTIONS: list[Any] = [
    pytest.param(lambda r, k: r.hset(k, "ver", "abc"), True, id="version-not-a-number"),
    pytest.param(lambda r, k: r.hset(k, "exp", "soon"), True, id="expiry-not-a-number"),
    pytest.param(lambda r, k: r.hset(k, "val", "{not json"), False, id="value-not-json"),
    pytest.param(lambda r, k: r.hset(k, "val", b"\xff\xfe"), False, id="value-not-utf8"),
    pytest.param(lambda r, k: r.hset(k, "val", b'"\xff"'), False, id="value-string-not-utf8"),
    pytest.param(lambda r, k: r.hset(k, "sv", "[oops"), False, id="schema-errors-not-json"),
    pytest.param(lambda r, k: r.hset(k, "cf", "{oops"), False, id="conflicts-not-json"),
    pytest.param(lambda r, k: r.hset(k, "id", b"\xff"), True, id="id-not-utf8"),
    pytest.param(lambda r, k: (r.delete(k), r.set(k, "garbage")), True, id="not-a-hash"),
]


def is_corrupt(reply: httpx.Response, ns: str, key: str) -> None:
    assert reply.status_code == 500, reply.text
    error = reply.json()["error"]
    assert error["code"] == "corrupt_record"
    assert f"{ns}" in error["details"]["record"] and key in error["details"]["record"]


@pytest.mark.parametrize(("corrupt", "blocks_writes"), CORRUPTIONS)
def test_a_corrupt_entry_answers_corrupt_record_and_hides_nothing_else(
        redis_broker: Broker, admin: httpx.Client, data: redis.Redis, ns: str,
        corrupt: Callable[[redis.Redis, str], Any], blocks_writes: bool) -> None:
    path = f"/v1/namespaces/{ns}/memory"
    for i in range(3):
        assert admin.put(f"{path}/k{i}", json={"value": {"i": i}}).status_code == 201
    corrupt(data, entry_key(ns, "k1"))

    is_corrupt(admin.get(f"{path}/k1"), ns, "k1")
    assert admin.get(f"{path}/k0").json()["value"] == {"i": 0}
    listed = admin.get(path, params={"pattern": "*"})
    assert listed.status_code == 200
    assert [e["key"] for e in listed.json()["entries"]] == ["k0", "k2"]
    batch = admin.post("/v1/messages", json=[
        {"memp": "1.0", "type": "memory.get", "id": "g", "namespace": ns, "key": "k1"},
        {"memp": "1.0", "type": "memory.query", "id": "q", "namespace": ns, "pattern": "*"},
        {"memp": "1.0", "type": "memory.get", "id": "g0", "namespace": ns, "key": "k0"}])
    assert batch.status_code == 200, batch.text
    got, queried, other = batch.json()
    assert got["type"] == "error" and got["error"]["code"] == "corrupt_record"
    assert [e["key"] for e in queried["entries"]] == ["k0", "k2"]
    assert other["entry"]["value"] == {"i": 0}
    assert admin.get(f"/v1/namespaces/{ns}/history/k0").status_code == 200

    stream = Stream(f"{redis_broker.url}/v1/subscribe",
                    [("namespace", ns), ("pattern", "*"), ("snapshot", "1")],
                    {"Authorization": f"Bearer {ADMIN_KEY}"})
    try:
        stream.wait_event(lambda e: e.event == "snapshot-end", "the snapshot's end")
        assert [e.data["key"] for e in stream.events if e.event == "snapshot"] == ["k0", "k2"]
        assert admin.put(f"{path}/k2", json={"value": 2}).status_code == 200
        stream.wait_key("k2", 2)
    finally:
        stream.close()

    written = admin.put(f"{path}/k1", json={"value": "repaired"})
    if blocks_writes:  # a write cannot build on what it cannot read: refused, nothing written
        is_corrupt(written, ns, "k1")
        is_corrupt(admin.delete(f"{path}/k1"), ns, "k1")
    else:  # the write replaces the unreadable value: the entry is readable again
        assert written.status_code == 200, written.text
        assert admin.get(f"{path}/k1").json()["value"] == "repaired"


def test_a_corrupt_change_log_record_stops_no_stream(
        redis_broker: Broker, admin: httpx.Client, data: redis.Redis, ns: str) -> None:
    path = f"/v1/namespaces/{ns}/memory"
    assert admin.put(f"{path}/a", json={"value": 1}).status_code == 201
    live = Stream(f"{redis_broker.url}/v1/subscribe", [("namespace", ns), ("pattern", "*")],
                  {"Authorization": f"Bearer {ADMIN_KEY}"}).wait_open()
    try:
        data.xadd(layout.changelog(ns), {"type": "put", "key": "bad", "ver": "x"})
        data.xadd(layout.changelog(ns), {"type": "proposal", "key": "bad", "doc": "{oops"})
        assert admin.put(f"{path}/a", json={"value": 2}).status_code == 200
        live.wait_key("a", 2)
        replay = Stream(f"{redis_broker.url}/v1/subscribe", [("namespace", ns), ("pattern", "*")],
                        {"Authorization": f"Bearer {ADMIN_KEY}",
                         "Last-Event-ID": f"{ns}:0-0"}).wait_open()
        try:
            replay.wait_key("a", 2)
            assert [(e.data.get("key"), e.data.get("version")) for e in replay.events
                    if e.event == "put"] == [("a", 1), ("a", 2)]
        finally:
            replay.close()
        assert admin.put(f"{path}/a", json={"value": 3}).status_code == 200
        live.wait_key("a", 3)
        assert [e.event for e in live.events] == ["put", "put"]
    finally:
        live.close()


def test_a_corrupt_agent_or_key_record_leaves_the_listings_whole(
        admin: httpx.Client, data: redis.Redis, ns: str) -> None:
    first = admin.post("/v1/agents", json={"name": "a", "namespace": ns}).json()
    second = admin.post("/v1/agents", json={"name": "b", "namespace": ns}).json()
    data.hset(layout.agent(ns, first["agent"]["id"]), "created_at", "yesterday")
    listed = admin.get(f"/v1/namespaces/{ns}/agents")
    assert listed.status_code == 200, listed.text
    assert [a["id"] for a in listed.json()["agents"]] == [second["agent"]["id"]]
    is_corrupt(admin.get(f"/v1/namespaces/{ns}/agents/{first['agent']['id']}"), "agent",
               first["agent"]["id"])

    digest = cast(bytes, data.hget(layout.api_key_ids(), first["credentials"]["key_id"]))
    data.set(layout.api_key(digest.decode()), b"{not json")
    keys = admin.get("/v1/keys")
    assert keys.status_code == 200, keys.text
    ids = [k["id"] for k in keys.json()["keys"]]
    assert second["credentials"]["key_id"] in ids
    assert first["credentials"]["key_id"] not in ids
    # removing an agent whose key record is corrupt still works, and removes it
    assert admin.delete(f"/v1/namespaces/{ns}/agents/{second['agent']['id']}").status_code == 204


def test_a_corrupt_entry_due_to_expire_holds_up_no_other_expiry(
        redis_broker: Broker, admin: httpx.Client, data: redis.Redis, ns: str) -> None:
    path = f"/v1/namespaces/{ns}/memory"
    stream = Stream(f"{redis_broker.url}/v1/subscribe", [("namespace", ns), ("pattern", "*")],
                    {"Authorization": f"Bearer {ADMIN_KEY}"}).wait_open()
    try:
        for key in ("a", "b", "c"):
            reply = admin.put(f"{path}/{key}", json={"value": 1, "ttl_seconds": 1})
            assert reply.status_code == 201
        data.hset(entry_key(ns, "a"), "ver", "abc")
        data.hset(entry_key(ns, "b"), "ver", "abc")
        stream.wait_event(lambda e: e.event == "expire" and e.data["key"] == "c",
                          "the expiry of c", timeout=10)
    finally:
        stream.close()


@pytest.mark.parametrize("damage", [
    pytest.param("index", id="index-record"), pytest.param("content", id="not-a-cell")])
def test_a_corrupt_cell_stops_no_search_and_no_lifecycle_pass(
        amp: Amp, redis_url: str, ns: str, damage: str) -> None:
    healthy = amp.create("the user prefers tea")
    broken = amp.create("the user prefers coffee")
    client = sync_redis(amp, redis_url)
    try:
        if damage == "index":
            client.hset(layout.amp_cell(ns, broken["id"]), "ref", "not-a-number")
        else:
            key = client.hget(layout.amp_cell(ns, broken["id"]), "key")
            client.hset(layout.entry(ns, cast(bytes, key).decode()), "val", b"[1, 2]")
    finally:
        client.close()
    assert amp.search_ids(query="user prefers") == [healthy["id"]]
    ran = amp.http.post("/amp/lifecycle/run", json={})
    assert ran.status_code == 200, ran.text
    assert amp.read(healthy["id"])["content"]["text"] == "the user prefers tea"
    corrupt_error(amp.get(broken["id"]), broken["id"] if damage == "index" else ns)
