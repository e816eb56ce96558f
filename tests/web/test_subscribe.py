"""Live subscriptions over real HTTP (GET /v1/subscribe), on both stores: patterns, isolation,
event payloads, resume, reset, snapshots, slow consumers, several processes, Redis restarts.

Streams are read by a small SSE line reader on a background thread; every wait has a deadline."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest
import redis

from broker.storage import layout
from broker.storage.changelog import position_key
from tests.support.brokers import (
    ADMIN_KEY,
    BACKENDS,
    Broker,
    BrokerProcess,
    RedisServer,
    free_port,
    start_broker,
    wait_for_port,
)
from tests.support.streams import WAIT, Event, EventParser, Stream
from tests.support.waiting import wait_until

# ---- a tiny SSE client (WHATWG event-stream parsing) on a background thread ----


# ---- helpers ----


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def put(client: httpx.Client, ns: str, key: str, value: object, **body: object) -> dict[str, Any]:
    response = client.put(f"/v1/namespaces/{ns}/memory/{key}", json={"value": value, **body})
    assert response.status_code in (200, 201), response.text
    reply: dict[str, Any] = response.json()
    return reply


def delete(client: httpx.Client, ns: str, key: str) -> dict[str, Any]:
    response = client.delete(f"/v1/namespaces/{ns}/memory/{key}")
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def versions_by_key(events: Iterable[Event]) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = defaultdict(list)
    for event in events:
        seen[event.data["key"]].append(event.data["version"])
    return dict(seen)


def without_type(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != "type"}


def readers(broker: Broker) -> dict[str, Any]:
    """The in-process hub's readers (namespace -> reader); read-only, to see who is following."""
    return dict(broker.app.state.services.hub.readers)


def subscriber_count(broker: Broker, ns: str) -> int:
    reader = readers(broker).get(ns)
    return 0 if reader is None else len(reader.subscribers)


class Writer(threading.Thread):
    """Writes `keys` round-robin until stopped (or `limit` writes); keeps every reply."""

    def __init__(self, url: str, ns: str, keys: list[str], *, limit: int = 100_000,
                 deletes: bool = False) -> None:
        super().__init__(daemon=True)
        self.url, self.ns, self.keys, self.limit, self.deletes = url, ns, keys, limit, deletes
        self.replies: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=15,
                              headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
                n = 0
                while not self.stopping.is_set() and n < self.limit:
                    key = self.keys[n % len(self.keys)]
                    if self.deletes and n % 7 == 3:
                        response = client.delete(f"/v1/namespaces/{self.ns}/memory/{key}")
                        if response.status_code == 404:  # already deleted: nothing written
                            n += 1
                            continue
                    else:
                        response = client.put(f"/v1/namespaces/{self.ns}/memory/{key}",
                                              json={"value": {"n": n}})
                    response.raise_for_status()
                    self.replies.append(response.json())
                    n += 1
        except BaseException as exc:
            self.error = exc

    def finish(self) -> list[dict[str, Any]]:
        self.stopping.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the writer did not stop"
        assert self.error is None, f"writer failed: {self.error!r}"
        return self.replies

    def wait_writes(self, count: int) -> None:
        wait_until(lambda: len(self.replies) >= count or self.error is not None,
                   f"{count} writes")
        assert self.error is None, f"writer failed: {self.error!r}"


def final_versions(replies: Iterable[dict[str, Any]]) -> dict[str, int]:
    last: dict[str, int] = {}
    for reply in replies:
        last[reply["key"]] = max(last.get(reply["key"], 0), reply["version"])
    return last


# ---- the stream itself ----


def test_stream_opens_with_the_retry_hint_and_sends_heartbeat_comments(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], backend: str, ns: str
) -> None:
    broker = broker_factory(backend, heartbeat_seconds=0.2, sse_retry_ms=750)
    stream = subscribe(broker.url, ns, "*").wait_open()
    assert stream.retry == 750
    assert stream.headers is not None
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["cache-control"] == "no-store"
    stream.wait_for(lambda: len(stream.comments) >= 3, "three heartbeat comments")
    assert stream.events == []  # heartbeats are comments, never events


def test_writes_made_after_the_first_frame_are_delivered(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    # The first frame is the client's only sign that the stream follows the logs: a write it
    # makes after seeing it must arrive, in every namespace of the stream.
    for attempt in range(5):
        namespaces = [f"{ns}-{attempt}-{i:02d}" for i in range(16)]
        stream = subscribe(broker.url, subs=[f"{n}:*" for n in namespaces]).wait_open()
        for namespace in reversed(namespaces):
            put(admin, namespace, "k", namespace)
        stream.wait_changes(len(namespaces))
        assert sorted(e.data["namespace"] for e in stream.changes()) == namespaces
        stream.close()


KEYS = ["a", "a/b", "a/b/c", "a/bc", "a/x/c", "a/x/y/c", "a/x/cd", "ab/x", "b/a/b"]


@pytest.mark.parametrize(("pattern", "expected"), [
    pytest.param("a/*", ["a/b", "a/b/c", "a/bc", "a/x/c", "a/x/y/c", "a/x/cd"], id="prefix"),
    pytest.param("a/b", ["a/b"], id="exact"),
    pytest.param("a/*/c", ["a/b/c", "a/x/c"], id="middle-star"),
    pytest.param("a/b*", ["a/b", "a/b/c", "a/bc"], id="segment-prefix"),
    pytest.param("*", KEYS, id="whole-namespace"),
])
def test_pattern_selects_the_keys(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str,
    pattern: str, expected: list[str],
) -> None:
    # A second pattern in the same stream catches the sentinel written last: once it is in,
    # every earlier matching change must be too (one namespace's events arrive in log order).
    stream = subscribe(broker.url, ns, pattern, "zz/end").wait_open()
    for key in KEYS:
        put(admin, ns, key, key)
    put(admin, ns, "zz/end", True)
    stream.wait_key("zz/end", 1)
    got = [e.data["key"] for e in stream.changes()]
    assert got == [*(k for k in KEYS if k in expected), "zz/end"]


def test_one_stream_follows_pairs_in_several_namespaces(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    other = f"{ns}-b"
    stream = subscribe(broker.url, subs=[f"{ns}:x/*", f"{other}:y", f"{ns}:z"]).wait_open()
    put(admin, ns, "x/1", 1)
    put(admin, ns, "y", "not followed in this namespace")
    put(admin, other, "x/1", "not followed in this namespace")
    put(admin, other, "y", 2)
    put(admin, ns, "z", 3)
    stream.wait_key("z", 1)
    stream.wait_event(lambda e: e.data.get("namespace") == other, "the event of the second ns")
    got = sorted((e.data["namespace"], e.data["key"]) for e in stream.changes())
    assert got == sorted([(ns, "x/1"), (other, "y"), (ns, "z")])
    # The id names a position in every namespace of the stream, so it resumes all of them.
    last = stream.changes()[-1].id
    assert last is not None
    assert [part.split(":")[0] for part in last.split(",")] == sorted([ns, other])
    stream.close()

    put(admin, other, "y", 4)
    put(admin, ns, "x/2", 5)
    resumed = subscribe(broker.url, subs=[f"{ns}:x/*", f"{other}:y", f"{ns}:z"],
                        last_event_id=last)
    resumed.wait_key("x/2", 1)
    resumed.wait_key("y", 2)
    assert sorted((e.data["namespace"], e.data["key"], e.data["version"])
                  for e in resumed.changes()) == [(ns, "x/2", 1), (other, "y", 2)]


# ---- isolation, authentication and validation ----


def create_key(admin: httpx.Client, grants: list[dict[str, Any]]) -> str:
    response = admin.post("/v1/keys", json={"grants": grants, "name": "subscriber"})
    assert response.status_code == 201, response.text
    token: str = response.json()["api_key"]
    return token


def test_stream_carries_no_event_from_a_namespace_the_token_may_not_read(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    neighbour = f"{ns}x"  # shares the prefix: a glob or prefix mistake would leak it
    token = create_key(admin, [{"namespace": ns, "permissions": ["read", "subscribe"]}])
    # An admin stream on the neighbour keeps a reader running for it in the same process.
    watcher = subscribe(broker.url, neighbour, "*").wait_open()
    mine = subscribe(broker.url, ns, "*", token=token).wait_open()
    put(admin, neighbour, "secret", "not yours")
    put(admin, ns, "shared", "yours")
    watcher.wait_key("secret", 1)
    mine.wait_key("shared", 1)
    assert [(e.data["namespace"], e.data["key"]) for e in mine.changes()] == [(ns, "shared")]


@pytest.mark.parametrize(("grants", "query"), [
    pytest.param([{"namespace": "{ns}", "permissions": ["subscribe"]}],
                 [("namespace", "{ns}x"), ("pattern", "*")], id="other-namespace"),
    pytest.param([{"namespace": "{ns}", "permissions": ["subscribe"]}],
                 [("sub", "{ns}:*"), ("sub", "{ns}x:*")], id="one-pair-of-two-forbidden"),
    pytest.param([{"namespace": "{ns}", "permissions": ["read", "write"]}],
                 [("namespace", "{ns}"), ("pattern", "*")], id="read-without-subscribe"),
    pytest.param([{"namespace": "{ns}-*", "permissions": ["subscribe"]}],
                 [("namespace", "{ns}"), ("pattern", "*")], id="glob-does-not-cover"),
])
def test_subscribing_without_permission_is_forbidden(
    broker: Broker, admin: httpx.Client, ns: str, grants: list[dict[str, Any]],
    query: list[tuple[str, str]],
) -> None:
    token = create_key(admin, [{**g, "namespace": g["namespace"].format(ns=ns)} for g in grants])
    params = [(k, v.format(ns=ns)) for k, v in query]
    status, body = refused(broker.url, params, {"Authorization": f"Bearer {token}"})
    assert status == 403
    assert body["error"]["code"] == "forbidden"


def test_a_glob_grant_allows_the_namespaces_it_names(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    token = create_key(admin, [{"namespace": f"{ns}-*", "permissions": ["subscribe"]}])
    stream = subscribe(broker.url, f"{ns}-one", "*", token=token).wait_open()
    put(admin, f"{ns}-one", "k", 1)
    stream.wait_key("k", 1)


def test_a_shared_namespace_can_be_followed_beside_ones_own(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    team = f"{ns}-team"
    token = create_key(admin, [{"namespace": team, "permissions": ["read", "subscribe"]}])
    shared = admin.put(f"/v1/namespaces/{ns}/config", json={"shares": [
        {"namespace": team, "permissions": ["read", "subscribe"]}]})
    assert shared.status_code == 200, shared.text
    stream = subscribe(broker.url, subs=[f"{ns}:pub/*", f"{team}:*"], token=token).wait_open()
    put(admin, ns, "pub/1", "shared")
    put(admin, team, "own", "mine")
    stream.wait_key("own", 1)
    stream.wait_key("pub/1", 1)
    assert sorted((e.data["namespace"], e.data["key"]) for e in stream.changes()) == [
        (ns, "pub/1"), (team, "own")]


def refused(url: str, params: list[tuple[str, str]], headers: dict[str, str]
            ) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a subscription the broker should refuse (bounded if it does not)."""
    with httpx.Client(timeout=5) as client, client.stream(
            "GET", f"{url}/v1/subscribe", params=tuple(params), headers=headers) as response:
        if response.status_code == 200:
            return 200, {}
        body: dict[str, Any] = json.loads(response.read())
        return response.status_code, body


@pytest.mark.parametrize(("query", "headers", "status", "code"), [
    pytest.param([("namespace", "{ns}")], {"auth": ""}, 401, "unauthorized", id="no-token"),
    pytest.param([("namespace", "{ns}")], {"auth": "memp_sk_live_nope"}, 401, "unauthorized",
                 id="unknown-key"),
    pytest.param([("namespace", "Bad_NS")], {}, 400, "invalid_namespace", id="bad-namespace"),
    pytest.param([("sub", "Bad_NS:*")], {}, 400, "invalid_namespace", id="bad-sub-namespace"),
    pytest.param([("namespace", "{ns}"), ("pattern", "a/*b")], {}, 400, "invalid_pattern",
                 id="star-inside-segment"),
    pytest.param([("namespace", "{ns}"), ("pattern", "a//b")], {}, 400, "invalid_pattern",
                 id="empty-segment"),
    pytest.param([("sub", "{ns}")], {}, 400, "invalid_request", id="sub-without-colon"),
    pytest.param([], {}, 400, "invalid_request", id="nothing-to-follow"),
    pytest.param([("namespace", "{ns}")], {"Last-Event-ID": "garbage"}, 400, "invalid_request",
                 id="bad-cursor-header"),
    pytest.param([("namespace", "{ns}"), ("last_event_id", "{ns}:12")], {}, 400,
                 "invalid_request", id="bad-cursor-param"),
    pytest.param([("namespace", "{ns}"), ("last_event_id", "{ns}:1-0~" + "*" * 128)], {},
                 400, "invalid_request", id="cursor-check-of-stars"),
    pytest.param([("namespace", "{ns}"), ("last_event_id", "{ns}:1-0~0a1b2c3d\x01")], {},
                 400, "invalid_request", id="cursor-check-control-char"),
    pytest.param([("namespace", "{ns}")], {"Last-Event-ID": "{ns}:1-0~" + "f" * 4096}, 400,
                 "invalid_request", id="cursor-check-huge"),
    pytest.param([("namespace", "{ns}")], {"Last-Event-ID": "{ns}:1-0~0A1B2C3D"}, 400,
                 "invalid_request", id="cursor-check-upper-case"),
    pytest.param([("namespace", "{ns}")], {"Last-Event-ID": "{ns}:1-0~"}, 400,
                 "invalid_request", id="cursor-tilde-without-check"),
    pytest.param([("namespace", "{ns}")], {"Last-Event-ID": "{ns}:1-0~0a1b2c3"}, 400,
                 "invalid_request", id="cursor-check-short"),
])
def test_bad_subscriptions_are_refused(
    broker: Broker, ns: str, query: list[tuple[str, str]], headers: dict[str, str], status: int,
    code: str,
) -> None:
    sent = {"Authorization": f"Bearer {ADMIN_KEY}"}
    if "auth" in headers:
        sent = {"Authorization": f"Bearer {headers['auth']}"} if headers["auth"] else {}
    sent.update({k: v.format(ns=ns) for k, v in headers.items() if k != "auth"})
    got, body = refused(broker.url, [(k, v.format(ns=ns)) for k, v in query], sent)
    assert got == status
    assert body["error"]["code"] == code


# ---- event payloads ----


def test_put_delete_and_expire_events_carry_the_entry(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    stream = subscribe(broker.url, ns, "doc/*").wait_open()
    first = put(admin, ns, "doc/1", {"title": "draft", "tags": ["a"]})
    second = put(admin, ns, "doc/1", {"title": "final"})
    gone = delete(admin, ns, "doc/1")
    again = put(admin, ns, "doc/1", "short-lived", ttl_seconds=1)
    expired = stream.wait_key("doc/1", 5)

    events = stream.changes()
    assert [(e.event, e.data["type"], e.data["version"]) for e in events] == [
        ("put", "put", 1), ("put", "put", 2), ("delete", "delete", 3), ("put", "put", 4),
        ("expire", "expire", 5)]
    # A write's event is exactly the entry its writer got back, plus the type.
    for event, reply in zip(events, [first, second, gone, again], strict=False):
        assert without_type(event.data) == reply
    assert gone["deleted"] is True and gone["value"] is None
    assert again["ttl_seconds"] == 1 and again["expires_at"] == again["updated_at"] + 1000
    # Expiry is not a write: the tombstone keeps the entry's id and author, has no timestamp.
    data = expired.data
    assert data["deleted"] is True and data["value"] is None
    assert data["id"] == again["id"] and data["agent_id"] == again["agent_id"] == "admin"
    assert data["namespace"] == ns and data["key"] == "doc/1"
    assert data["timestamp"] is None and data["expires_at"] is None
    assert data["created_at"] == again["created_at"]
    assert data["updated_at"] >= again["expires_at"]
    # Every event id is a cursor of this stream's one namespace, rising.
    ids = [e.id for e in events]
    assert all(i is not None and i.startswith(f"{ns}:") for i in ids)
    positions = [position_key(str(i).split(":")[1].split("~")[0]) for i in ids]
    assert positions == sorted(set(positions))


# ---- resume ----


def test_resume_after_forced_disconnects_replays_every_version_once_in_order(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    keys = [f"k/{i}" for i in range(5)]
    received: list[Event] = []
    stream = subscribe(broker.url, ns, "k/*").wait_open()
    writer = Writer(broker.url, ns, keys, deletes=True)
    writer.start()
    # Drop the connection mid-stream three times while the writer keeps going, resuming with
    # the header, the query parameter, then the header again.
    for how in ("header", "param", "header"):
        writer.wait_writes(len(writer.replies) + 40)
        stream.wait_changes(10)
        stream.close()
        received += stream.changes()
        writer.wait_writes(len(writer.replies) + 40)  # writes that land in the gap
        cursor = received[-1].id
        assert cursor is not None
        stream = subscribe(broker.url, ns, "k/*", **(
            {"last_event_id": cursor} if how == "header" else {"cursor_param": cursor}))
    replies = writer.finish()
    put(admin, ns, "k/end", "done")
    stream.wait_key("k/end", 1)
    received += stream.changes()

    assert not any(e.event == "reset" for e in stream.events)
    seen = versions_by_key(e for e in received if e.data["key"] != "k/end")
    written = final_versions(replies)
    assert set(seen) == set(written)
    for key, versions in seen.items():
        assert versions == list(range(1, written[key] + 1)), key
    kinds = {(r["key"], r["version"]): "delete" if r["deleted"] else "put" for r in replies}
    assert {(e.data["key"], e.data["version"]): e.event for e in received
            if e.data["key"] != "k/end"} == kinds


def test_reset_when_the_cursor_is_older_than_the_retained_log(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], backend: str, ns: str
) -> None:
    broker = broker_factory(backend, changelog_maxlen=10)
    everything = subscribe(broker.url, ns, "*").wait_open()
    with broker.client() as client:
        for n in range(1, 41):
            put(client, ns, "k", n)
        everything.wait_key("k", 40)
        ids = [e.id for e in everything.changes()]
        assert len(ids) == 40

        # The log keeps the newest 10 changes (versions 31..40): the cursor of version 30 has
        # lost nothing, so it resumes with no reset...
        kept = subscribe(broker.url, ns, "*", last_event_id=ids[29])
        kept.wait_key("k", 40)
        assert [e.data["version"] for e in kept.events] == list(range(31, 41))
        # ...while the cursor of version 29 has lost version 30: reset, then live from now.
        lost = subscribe(broker.url, ns, "*", last_event_id=ids[28])
        reset = lost.wait_event(lambda e: e.event == "reset", "the reset event")
        assert reset.data["namespace"] == ns
        assert reset.id == reset.data["cursor"] == ids[39]
        put(client, ns, "k", "after the reset")
        lost.wait_key("k", 41)
        assert [e.event for e in lost.events] == ["reset", "put"]

        # The reset's cursor is a normal cursor: resuming from it misses nothing.
        put(client, ns, "k", "later")
        again = subscribe(broker.url, ns, "*", last_event_id=reset.id)
        again.wait_key("k", 42)
        assert [e.data["version"] for e in again.events] == [41, 42]


# ---- snapshot ----


def test_snapshot_then_live_under_concurrent_writes(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    keys = [f"s/{i:03d}" for i in range(250)]  # more than one query page
    for key in keys:
        put(admin, ns, key, "initial")
    put(admin, ns, "other/1", "not matched")
    writer = Writer(broker.url, ns, keys[::9] + keys[:3], deletes=True)
    writer.start()
    writer.wait_writes(20)
    # Overlapping patterns: a key both match is still sent once, in the snapshot and live.
    stream = subscribe(broker.url, ns, "s/*", "s/00*", snapshot=True)
    stream.wait_event(lambda e: e.event == "snapshot-end", "the snapshot marker")
    writer.wait_writes(len(writer.replies) + 60)
    replies = writer.finish()
    put(admin, ns, "s/zzz", "end")
    stream.wait_key("s/zzz", 1)

    events = list(stream.events)
    marker = next(i for i, e in enumerate(events) if e.event == "snapshot-end")
    snapshot, live = events[:marker], events[marker + 1:]
    assert {e.event for e in snapshot} == {"snapshot"}
    assert all(e.id is None for e in snapshot)
    assert events[marker].id == events[marker].data["cursor"]
    assert {e.event for e in live} <= {"put", "delete"}

    state: dict[str, Any] = {}
    last_version: dict[str, int] = {}
    for event in snapshot:
        assert event.data["key"] not in state, "a key twice in the snapshot"
        assert not event.data["deleted"]
        state[event.data["key"]] = event.data["value"]
        last_version[event.data["key"]] = event.data["version"]
    for event in live:
        key, version = event.data["key"], event.data["version"]
        if key in last_version:
            assert version == last_version[key] + 1, f"{key}: v{last_version[key]} -> v{version}"
        last_version[key] = version
        if event.event == "put":
            state[key] = event.data["value"]
        else:
            state.pop(key, None)

    written = final_versions(replies)
    for key in [*keys, "s/zzz"]:
        stored = admin.get(f"/v1/namespaces/{ns}/memory/{key}")
        if stored.status_code == 404:
            assert key not in state, key
        else:
            assert state.get(key) == stored.json()["value"], key
        if key in last_version:  # else deleted before the snapshot and never written since
            assert last_version[key] == written.get(key, 1), key
    assert "other/1" not in state


def test_snapshot_is_skipped_when_resuming(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    put(admin, ns, "a", 1)
    first = subscribe(broker.url, ns, "*", snapshot=True)
    marker = first.wait_event(lambda e: e.event == "snapshot-end", "the snapshot marker")
    assert [(e.event, e.data.get("key")) for e in first.events] == [
        ("snapshot", "a"), ("snapshot-end", None)]
    first.close()
    put(admin, ns, "b", 2)
    resumed = subscribe(broker.url, ns, "*", snapshot=True, last_event_id=marker.id)
    resumed.wait_key("b", 1)
    assert [(e.event, e.data["key"]) for e in resumed.events] == [("put", "b")]


# ---- slow consumers ----


def raw_subscribe(url: str, query: dict[str, str], rcvbuf: int = 4096) -> socket.socket:
    """A client that sends the GET and then never reads (a tiny receive window)."""
    parts = urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
    sock.sendall((f"GET /v1/subscribe?{urlencode(query)} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                  f"Authorization: Bearer {ADMIN_KEY}\r\nAccept: text/event-stream\r\n\r\n"
                  ).encode())
    return sock


def read_to_end(sock: socket.socket, timeout: float = WAIT) -> bytes:
    """Everything until the server closes or resets the connection."""
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
    raise AssertionError("the connection was not closed")


def sse_events(raw: bytes) -> list[Event]:
    """Complete events of a raw (chunked, possibly cut off) HTTP/1.1 SSE response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    text = bytearray()
    while body:
        size_line, sep, rest = body.partition(b"\r\n")
        if not sep or not size_line:
            break
        size = int(size_line, 16)
        if size == 0 or len(rest) < size:
            text += rest[:size]
            break
        text += rest[:size]
        body = rest[size + 2:]
    parser = EventParser()
    normal = bytes(text).replace(b"\r\n", b"\n")
    complete = normal[:normal.rfind(b"\n\n") + 2] if b"\n\n" in normal else b""
    for line in complete.decode().split("\n"):
        parser.line(line)
    return parser.events


def server_side(broker: Broker, sock: socket.socket) -> Any:
    """The server's connection for a client socket, while the server holds it (else None)."""
    port = sock.getsockname()[1]
    for connection in list(broker.server.server_state.connections):
        client = getattr(connection, "client", None)
        if client is not None and client[1] == port:
            return connection
    return None


def test_a_subscriber_that_never_reads_is_cut_and_holds_back_no_one(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], backend: str, ns: str
) -> None:
    send_timeout = 1.0
    broker = broker_factory(backend, subscriber_queue_size=5,
                            sse_send_timeout_seconds=send_timeout)
    reader = subscribe(broker.url, ns, "*").wait_open()
    stuck = raw_subscribe(broker.url, {"namespace": ns, "pattern": "*"})  # a 4 KiB window
    try:
        wait_until(lambda: subscriber_count(broker, ns) == 2, "the stuck subscriber to join")
        held = server_side(broker, stuck)
        assert held is not None
        pad = "x" * 60_000  # 6 MB in all: more than the socket buffers take in
        total = 100
        with broker.client() as client:
            for n in range(1, total + 1):
                put(client, ns, "k", {"n": n, "pad": pad})
        written = time.monotonic()
        reader.wait_key("k", total)
        assert [e.data["version"] for e in reader.changes()] == list(range(1, total + 1))
        # The stuck one is cut within the send timeout (plus slack), without reading a byte:
        # the server drops the connection and what it had buffered for it, and the stream
        # leaves the hub and the watchdog.
        wait_until(lambda: server_side(broker, stuck) is None, "the server to drop it",
                   timeout=written + send_timeout + 5 - time.monotonic())
        assert held.transport.is_closing()
        assert held.transport.get_write_buffer_size() == 0
        wait_until(lambda: subscriber_count(broker, ns) == 1, "the stuck stream to leave")
        assert len(broker.app.state.services.send_watchdog.streams) == 1  # the reader's
        got = sse_events(read_to_end(stuck))
    finally:
        stuck.close()
    # What it reads later is a gap-free prefix of whole events (a cut-off last one is
    # discarded, as any SSE parser does), whose last id resumes the rest exactly once.
    versions = [e.data["version"] for e in got]
    assert versions == list(range(1, len(versions) + 1))
    assert len(versions) < total
    resumed = subscribe(broker.url, ns, "*", last_event_id=got[-1].id if got else None)
    resumed.wait_key("k", total)
    assert [e.data["version"] for e in resumed.changes()] == list(
        range(len(versions) + 1, total + 1))


@pytest.mark.parametrize("bound", [
    pytest.param({"subscriber_queue_size": 5}, id="events"),
    # 150 events fit the count; five 60 kB values fill the bytes (MEMP_SUBSCRIBER_QUEUE_BYTES).
    pytest.param({"subscriber_queue_size": 1000, "subscriber_queue_bytes": 5 * 61_000},
                 id="bytes"),
])
def test_a_slow_reader_gets_overflow_with_a_cursor_that_resumes_everything(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], backend: str, ns: str,
    bound: dict[str, int]
) -> None:
    broker = broker_factory(backend, **bound)
    fast = subscribe(broker.url, ns, "*").wait_open()
    slow = subscribe(broker.url, ns, "*", pause_at_open=True).wait_open()
    pad = "x" * 60_000  # 9 MB in all: the socket buffers fill, then the 5-slot queue
    total = 150
    with broker.client() as client:
        for n in range(1, total + 1):
            put(client, ns, "k", {"n": n, "pad": pad})
    fast.wait_key("k", total)
    slow.resume()
    overflow = slow.wait_event(lambda e: e.event == "overflow", "the overflow event")
    slow.ended.wait(WAIT)
    assert slow.ended.is_set(), "the stream did not end after overflow"
    assert slow.events[-1] is overflow
    delivered = [e for e in slow.events if e.event == "put"]
    versions = [e.data["version"] for e in delivered]
    assert versions == list(range(1, len(versions) + 1))
    assert len(versions) < total
    assert overflow.id == overflow.data["cursor"]
    if delivered:
        assert overflow.id == delivered[-1].id

    resumed = subscribe(broker.url, ns, "*", last_event_id=overflow.id)
    resumed.wait_key("k", total)
    assert [e.data["version"] for e in resumed.changes()] == list(
        range(len(versions) + 1, total + 1))
    assert [e.data["version"] for e in fast.changes()] == list(range(1, total + 1))


def test_reader_stops_when_its_last_subscriber_leaves(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    one = subscribe(broker.url, ns, "a").wait_open()
    two = subscribe(broker.url, ns, "b").wait_open()
    assert subscriber_count(broker, ns) == 2  # one reader for the namespace, two subscribers
    one.close()
    wait_until(lambda: subscriber_count(broker, ns) == 1, "the first to leave")
    put(admin, ns, "b", 1)
    two.wait_key("b", 1)
    two.close()
    wait_until(lambda: ns not in readers(broker), "the reader to stop")


# ---- several processes, Redis restarts ----


def test_a_write_through_one_process_reaches_a_subscriber_on_another(
    broker_processes: Callable[..., list[BrokerProcess]], subscribe: Callable[..., Stream], ns: str
) -> None:
    first, second = broker_processes(2)
    on_second = subscribe(second.url, ns, "*").wait_open()
    on_first = subscribe(first.url, ns, "*").wait_open()
    with httpx.Client(timeout=15, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        for n in range(1, 11):
            via = first if n % 2 else second
            response = client.put(f"{via.url}/v1/namespaces/{ns}/memory/k", json={"value": n})
            assert response.status_code in (200, 201)
    for stream in (on_first, on_second):
        stream.wait_key("k", 10)
        assert [e.data["value"] for e in stream.changes()] == list(range(1, 11))
    assert [e.id for e in on_first.changes()] == [e.id for e in on_second.changes()]


def test_stopping_a_process_ends_its_streams_and_they_resume_on_another(
    broker_processes: Callable[..., list[BrokerProcess]], subscribe: Callable[..., Stream], ns: str
) -> None:
    leaving, staying = broker_processes(2)
    stream = subscribe(leaving.url, ns, "*").wait_open()
    with httpx.Client(timeout=15, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        def write(n: int) -> None:
            response = client.put(f"{staying.url}/v1/namespaces/{ns}/memory/k", json={"value": n})
            assert response.status_code in (200, 201)

        for n in (1, 2, 3):
            write(n)
        stream.wait_key("k", 3)
        leaving.process.terminate()
        assert leaving.process.wait(timeout=WAIT) is not None
        stream.wait_for(stream.ended.is_set, "the stream to end")
        for n in (4, 5):
            write(n)
    last = stream.changes()[-1].id
    resumed = subscribe(staying.url, ns, "*", last_event_id=last)
    resumed.wait_key("k", 5)
    assert [e.data["value"] for e in resumed.changes()] == [4, 5]


@dataclass
class OwnRedis(RedisServer):
    """A redis-server of this test alone, optionally with AOF persistence."""

    appendonly: bool = field(default=False)

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly \
            else ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--dir", str(self.workdir), *persistence],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)


@pytest.fixture(params=[pytest.param(False, id="no-persistence"),
                        pytest.param(True, id="aof")])
def own_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(free_port(), tmp_path, appendonly=bool(request.param))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def put_until_accepted(client: httpx.Client, ns: str, key: str, value: object
                       ) -> dict[str, Any]:
    """Retry a write while the broker answers 503 (Redis is coming back)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            response = client.put(f"/v1/namespaces/{ns}/memory/{key}", json={"value": value})
            if response.status_code in (200, 201):
                reply: dict[str, Any] = response.json()
                return reply
            assert response.status_code == 503, response.text
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the broker did not accept writes again"
        time.sleep(0.05)


@pytest.fixture
def own_broker(own_redis: OwnRedis) -> Iterator[Broker]:
    handle = start_broker("redis", own_redis.url)
    yield handle
    handle.stop()


def three_versions_followed(broker: Broker, client: httpx.Client,
                            subscribe: Callable[..., Stream], ns: str) -> list[str]:
    """Versions 1 to 3 of `k` written while a stream follows `ns`: the cursors it got."""
    everything = subscribe(broker.url, ns, "*").wait_open()
    for n in range(1, 4):
        put(client, ns, "k", n)
    everything.wait_key("k", 3)
    return [str(e.id) for e in everything.changes()]


def position_of(cursor: str) -> str:
    """The change-log position of a one-namespace cursor `ns:ms-seq[~check]`."""
    return cursor.split(":", 1)[1].split("~")[0]


def test_a_cursor_from_a_replaced_history_gets_a_reset_and_the_changes_it_missed(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], redis_url: str,
    ns: str
) -> None:
    """A cursor naming a change the log no longer holds while it holds older ones (a failover
    to a replica that lacked the newest changes) is not skipped past: `reset` with cause
    `replaced`, then the changes the new history holds after the newest change both share."""
    broker = broker_factory("redis")
    with broker.client() as client, redis.Redis.from_url(redis_url) as store:
        ids = three_versions_followed(broker, client, subscribe, ns)
        # The new primary never had version 3, and took another write since.
        store.xdel(layout.changelog(ns), position_of(ids[2]))
        put(client, ns, "other", "kept")
        resumed = subscribe(broker.url, ns, "*", last_event_id=ids[2])
        resumed.wait_key("other", 1)
        reset, kept = resumed.events[:2]
        assert reset.event == "reset" and reset.data["cause"] == "replaced", reset
        assert reset.data["cursor"] == reset.id == ids[1] and "failover" in reset.data["reason"]
        assert (kept.data["key"], kept.data["value"]) == ("other", "kept")


def replace_history_after(store: redis.Redis, ns: str, position: str, key: str) -> None:
    """Another history under the same ids, as a failover to a replica that took other writes
    at the same instants leaves: the change log is written again with its ids, the record at
    `position` and after becoming writes of `key`, versions 1, 2, ..."""
    log_key = layout.changelog(ns)
    records: Any = store.xrange(log_key)
    store.delete(log_key)
    version = 0
    for record_id, fields in records:
        if position_key(record_id.decode()) >= position_key(position):
            version += 1
            fields = {**fields, b"key": key.encode(), b"ver": str(version).encode(),
                      b"val": json.dumps(f"new {version}").encode()}
        store.xadd(log_key, fields, id=record_id)


def test_a_cursor_whose_id_another_history_holds_gets_a_reset_at_once(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], redis_url: str,
    ns: str
) -> None:
    """A resume from a deposed history's cursor whose id the new history holds too, for
    another record: the cursor's check tells them apart, so the stream starts with `reset`
    (cause `replaced`) and goes on with the new history, from the newest change both share.
    The same cursor without its check (as brokers issued before checks) still resumes."""
    writer, reader = broker_factory("redis"), broker_factory("redis")
    with writer.client() as client, redis.Redis.from_url(redis_url) as store:
        ids = three_versions_followed(writer, client, subscribe, ns)
        assert all("~" in i for i in ids), ids  # every id carries its record's check
        replace_history_after(store, ns, position_of(ids[2]), "other")
        resumed = subscribe(reader.url, ns, "*", last_event_id=ids[2])
        resumed.wait_key("other", 1)
        reset, kept = resumed.events[:2]
        assert reset.event == "reset" and reset.data["cause"] == "replaced", reset
        assert reset.data["cursor"] == reset.id == ids[1]
        assert (kept.data["key"], kept.data["value"]) == ("other", "new 1")
        assert kept.id != ids[2] and str(kept.id).split("~")[0] == ids[2].split("~")[0]
        # A cursor before the divergence resumes with no reset: the new history's changes.
        before = subscribe(reader.url, ns, "*", last_event_id=ids[1])
        before.wait_key("other", 1)
        assert [(e.event, e.id) for e in before.events] == [("put", kept.id)]
        # The plain id cannot be told apart: it resumes after the position, as it always did.
        plain = subscribe(reader.url, ns, "*", last_event_id=ids[2].split("~")[0])
        put(client, ns, "later", 1)
        plain.wait_key("later", 1)
        assert [e.data["key"] for e in plain.events] == ["later"]


def test_cursor_checks_of_other_namespaces_are_resets_or_ignored_and_show_nothing_of_them(
    broker: Broker, subscribe: Callable[..., Stream], ns: str
) -> None:
    """Hostile checks: a cursor whose position is this namespace's but whose check is of
    another namespace's record (spliced in) tells a different record there: `reset`
    (replaced), then this namespace's changes. A cursor naming, besides, a namespace the
    caller may not subscribe to is answered alike whether its check is that namespace's true
    one or a made-up one: it is not followed, and nothing of it is sent."""
    other = f"{ns}-other"
    with broker.client() as admin:
        put(admin, ns, "before", 1)  # a record before the cursor's: its history goes on
        put(admin, ns, "k", 1)
        put(admin, other, "secret", 1)
        token = create_key(admin, [{"namespace": ns, "permissions": ["read", "subscribe"]}])
    mine = subscribe(broker.url, ns, "*", last_event_id=f"{ns}:0-0")
    theirs = subscribe(broker.url, other, "*", last_event_id=f"{other}:0-0")
    own_id = str(mine.wait_key("k", 1).id)
    other_id = str(theirs.wait_key("secret", 1).id)
    position, check = own_id.split(":", 1)[1].split("~")
    other_check = other_id.split("~")[1]
    assert other_check != check

    spliced = subscribe(broker.url, ns, "*", last_event_id=f"{ns}:{position}~{other_check}",
                        token=token)
    reset = spliced.wait_event(lambda e: e.event == "reset", "the reset")
    assert reset.data["cause"] == "replaced", reset
    spliced.wait_key("k", 1)
    cursors = [f"{own_id},{other_id}", f"{own_id},{other_id.split('~')[0]}~00000000"]
    resumed = [subscribe(broker.url, ns, "*", last_event_id=c, token=token).wait_open()
               for c in cursors]
    with broker.client() as admin:
        put(admin, ns, "k", 2)
    for stream in (spliced, *resumed):
        stream.wait_key("k", 2)
    seen = [[(e.event, e.id, e.data) for e in stream.events] for stream in resumed]
    assert seen[0] == seen[1] and [e for e, _, _ in seen[0]] == ["put"], seen
    for stream in (spliced, *resumed):
        assert all(other not in str(e.id) and "secret" not in json.dumps(e.data)
                   for e in stream.events), stream.events


def test_a_stream_keeps_what_the_middleware_adds_to_its_start(
    broker_factory: Callable[..., Broker], ns: str
) -> None:
    """A stream's events go to the server's send past the middleware; its start still passes
    through every one: the CORS headers for an allowed origin and the request id (whose
    middleware writes the access line then) are on it, and the events follow."""
    origin = "https://app.example"
    broker = broker_factory("embedded", cors_origins=origin)
    stream = Stream(f"{broker.url}/v1/subscribe", [("namespace", ns), ("pattern", "*")],
                    {"Authorization": f"Bearer {ADMIN_KEY}", "Origin": origin,
                     "X-Request-ID": "stream-start-1"}).wait_open()
    try:
        assert stream.headers is not None
        assert stream.headers["access-control-allow-origin"] == origin
        assert "x-request-id" in stream.headers["access-control-expose-headers"].lower()
        assert stream.headers["x-request-id"] == "stream-start-1"
        assert stream.headers["content-type"].startswith("text/event-stream")
        with broker.client() as client:
            for n in (1, 2):
                put(client, ns, "k", n)
        stream.wait_key("k", 2)
    finally:
        stream.close()


def test_a_head_request_leaves_no_stream_behind_and_later_streams_get_changes(
    broker: Broker, subscribe: Callable[..., Stream], ns: str
) -> None:
    """HEAD /v1/subscribe answers the headers alone, and the stream it set up is let go at
    once on the event loop: the namespace's reader stops and is forgotten (a stream opened
    next gets its changes), and the stream no longer counts against the namespace."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for _ in range(3):
        reply = httpx.head(f"{broker.url}/v1/subscribe", params={"namespace": ns},
                           headers=headers, timeout=WAIT)
        assert reply.status_code == 200 and reply.content == b""
    with broker.client() as admin:
        wait_until(lambda: admin.get(f"/v1/namespaces/{ns}/usage").json()["usage"]["streams"]
                   == 0, "the HEAD requests' streams uncounted")
        assert ns not in readers(broker)
        stream = subscribe(broker.url, ns, "*").wait_open()
        put(admin, ns, "k", 1)
        stream.wait_key("k", 1)


def test_stream_survives_a_redis_restart(
    own_redis: OwnRedis, own_broker: Broker, subscribe: Callable[..., Stream], ns: str
) -> None:
    stream = subscribe(own_broker.url, ns, "*").wait_open()
    with own_broker.client() as client:
        for n in range(1, 4):
            put(client, ns, "k", n)
        stream.wait_key("k", 3)
        own_redis.stop()
        own_redis.start()
        after = [put_until_accepted(client, ns, "k", n) for n in range(4, 7)]
        stream.wait_event(lambda e: e.event == "put" and e.data["value"] == 6, "the last write")
    if own_redis.appendonly:
        # Nothing acknowledged was lost: the stream simply goes on, no reset, no gap.
        assert [a["version"] for a in after] == [4, 5, 6]
        assert [e.event for e in stream.events] == ["put"] * 6
        assert [e.data["value"] for e in stream.events] == [1, 2, 3, 4, 5, 6]
    else:
        # Redis came back empty: the stream says so, then carries the new writes.
        assert [a["version"] for a in after] == [1, 2, 3]
        assert [e.event for e in stream.events] == ["put"] * 3 + ["reset"] + ["put"] * 3
        assert stream.events[3].data["namespace"] == ns
        assert [e.data["value"] for e in stream.events if e.event == "put"] == [
            1, 2, 3, 4, 5, 6]
        # A cursor from before the restart names a log that is gone: reset, never a skip.
        stale = subscribe(own_broker.url, ns, "*", last_event_id=stream.events[2].id)
        stale.wait_event(lambda e: e.event == "reset", "the reset of a stale cursor")
        # The live reset's own cursor resumes the new log from its start.
        fresh = subscribe(own_broker.url, ns, "*", last_event_id=stream.events[3].id)
        fresh.wait_key("k", 3)
        assert [e.data["value"] for e in fresh.events] == [4, 5, 6]
