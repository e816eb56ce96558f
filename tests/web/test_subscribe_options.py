"""Subscriptions fitted to the consumer over real HTTP, on both stores: filters (with resume,
snapshots, deletes and expiries), conflation of a lagging stream, rate caps, and the 400s for
bad options."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker
from tests.support.clients import create_key, put_ok
from tests.support.streams import WAIT, Stream
from tests.support.waiting import wait_until

DONE = '/status == "done"'


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def delete(client: httpx.Client, ns: str, key: str) -> None:
    response = client.delete(f"/v1/namespaces/{ns}/memory/{key}")
    assert response.status_code == 200, response.text


def seen(stream: Stream) -> list[tuple[str, str, int]]:
    return [(e.event, e.data["key"], e.data["version"]) for e in stream.changes()]


def subscriber_count(broker: Broker, ns: str) -> int:
    reader = dict(broker.app.state.services.hub.readers).get(ns)
    return 0 if reader is None else len(reader.subscribers)


def counter(broker: Broker, name: str) -> float:
    text = httpx.get(f"{broker.url}/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, flags=re.MULTILINE)
    assert match is not None, name
    return float(match[1])


# ---- filters ----


def test_a_filter_sends_matching_changes_and_its_cursor_loses_and_repeats_nothing(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    every = subscribe(broker.url, ns, "tasks/*").wait_open()
    done = subscribe(broker.url, ns, "tasks/*", query=[("filter", DONE)]).wait_open()
    # The same filter without an equality the hub can index: asked about every change.
    unindexed = subscribe(broker.url, ns, "tasks/*",
                          query=[("filter", '/status contains "done"')]).wait_open()
    filtered_before = counter(broker, "memp_events_filtered_total")
    for key, status in [("tasks/1", "open"), ("tasks/1", "done"), ("tasks/2", "open"),
                        ("tasks/3", "done"), ("tasks/2", "open")]:
        put_ok(admin, ns, key, {"status": status})
    every.wait_changes(5)
    last = every.changes()[-1].id
    # Only matching changes are sent, with the ids the unfiltered stream gives them; the
    # filtered-out tail reaches the client as a `progress` event carrying the newest cursor.
    progress = done.wait_event(lambda e: e.event == "progress" and e.id == last,
                               "progress to the last change")
    assert progress.data == {"cursor": last}
    assert seen(done) == [("put", "tasks/1", 2), ("put", "tasks/3", 1)]
    unindexed.wait_event(lambda e: e.event == "progress" and e.id == last, "its progress")
    assert seen(unindexed) == seen(done)
    ids = {(e.data["key"], e.data["version"]): e.id for e in every.changes()}
    assert [e.id for e in done.changes()] == [ids["tasks/1", 2], ids["tasks/3", 1]]
    wait_until(lambda: counter(broker, "memp_events_filtered_total") >= filtered_before + 3,
               "the filtered changes to be counted")

    # Resuming from a sent event's id replays what matched after it, once, then the cursor.
    resumed = subscribe(broker.url, ns, "tasks/*", last_event_id=ids["tasks/1", 2],
                        query=[("filter", DONE)])
    resumed.wait_event(lambda e: e.event == "progress", "the cursor after the replay")
    assert seen(resumed) == [("put", "tasks/3", 1)]
    assert resumed.events[-1].id == last
    # Resuming from the progress cursor repeats nothing and gets what matches next.
    latest = subscribe(broker.url, ns, "tasks/*", last_event_id=progress.id,
                       query=[("filter", DONE)]).wait_open()
    put_ok(admin, ns, "tasks/4", {"status": "open"})
    put_ok(admin, ns, "tasks/4", {"status": "done"})
    latest.wait_key("tasks/4", 2)
    assert seen(latest) == [("put", "tasks/4", 2)]


def test_deletes_and_expiries_match_by_the_value_they_removed(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    done = subscribe(broker.url, ns, "*", query=[("filter", DONE)]).wait_open()
    deletes = subscribe(broker.url, ns, "*",
                        query=[("filter", 'type in ["delete", "expire"]')]).wait_open()
    put_ok(admin, ns, "a", {"status": "done"})
    put_ok(admin, ns, "b", {"status": "open"})
    delete(admin, ns, "a")
    delete(admin, ns, "b")
    put_ok(admin, ns, "c", {"status": "done"}, ttl_seconds=1)
    put_ok(admin, ns, "d", {"status": "open"}, ttl_seconds=1)
    done.wait_event(lambda e: e.event == "expire" and e.data["key"] == "c", "c's expiry")
    deletes.wait_event(lambda e: e.event == "expire" and e.data["key"] == "d", "d's expiry")
    deletes.wait_event(lambda e: e.event == "expire" and e.data["key"] == "c", "c's expiry")
    assert seen(done) == [("put", "a", 1), ("delete", "a", 2), ("put", "c", 1),
                          ("expire", "c", 2)]
    assert all(e.data["value"] is None for e in done.changes() if e.event != "put")
    assert sorted(seen(deletes)) == [("delete", "a", 2), ("delete", "b", 2),
                                     ("expire", "c", 2), ("expire", "d", 2)]


def test_the_snapshot_is_filtered_too(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    put_ok(admin, ns, "t/1", {"status": "done", "priority": 5})
    put_ok(admin, ns, "t/2", {"status": "done", "priority": 1})
    put_ok(admin, ns, "t/3", {"status": "open", "priority": 9})
    stream = subscribe(broker.url, ns, "t/*", snapshot=True,
                       query=[("filter", f"{DONE} and /priority >= 3")])
    stream.wait_event(lambda e: e.event == "snapshot-end", "the snapshot's end")
    assert [e.data["key"] for e in stream.events if e.event == "snapshot"] == ["t/1"]
    put_ok(admin, ns, "t/2", {"status": "done", "priority": 3})
    stream.wait_key("t/2", 2)
    assert seen(stream) == [("put", "t/2", 2)]


def test_a_filter_on_several_namespaces_moves_each_cursor(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    other = f"{ns}-b"
    stream = subscribe(broker.url, subs=[f"{ns}:*", f"{other}:*"],
                       query=[("filter", 'key == "hit"')]).wait_open()
    put_ok(admin, ns, "miss", 1)
    put_ok(admin, other, "hit", 2)
    put_ok(admin, other, "miss", 3)
    hit = stream.wait_key("hit", 1)
    # A progress event after the hit carries both namespaces' positions past what was sent.
    progress = stream.wait_event(
        lambda e: e.event == "progress" and stream.events.index(e) > stream.events.index(hit),
        "a progress event after the hit")
    assert progress.id != hit.id and seen(stream) == [("put", "hit", 1)]
    resumed = subscribe(broker.url, subs=[f"{ns}:*", f"{other}:*"],
                        last_event_id=progress.id, query=[("filter", 'key == "hit"')])
    resumed.wait_open()
    put_ok(admin, ns, "hit", 4)
    resumed.wait_key("hit", 1)
    assert [(e.data["namespace"], e.data["value"]) for e in resumed.changes()] == [(ns, 4)]


# ---- bad options ----


@pytest.mark.parametrize(("parameter", "value", "word"), [
    pytest.param("filter", "/status = 1", "position 8", id="filter-syntax"),
    pytest.param("filter", 'version == "3"', "position 11", id="filter-type"),
    pytest.param("filter", "regex(/a)", "unknown name", id="filter-unknown-function"),
    pytest.param("filter", "/a == 1 or " * 120 + "/a == 1", "1024 bytes", id="filter-2kib"),
    pytest.param("filter", "(" * 20 + "/a == 1" + ")" * 20, "deeper", id="filter-20-deep"),
    pytest.param("filter", "(" * 1000, "deeper", id="filter-1000-parens"),
    pytest.param("filter", "*" * 128, "unexpected character", id="filter-128-stars"),
    pytest.param("filter", '/a == "\x01\x1b[2J"', "control character", id="filter-control"),
    pytest.param("filter", "/a > 1" + "0" * 400, "out of range", id="filter-huge-number"),
    pytest.param("conflate", "earliest", "unknown mode", id="conflate-unknown"),
    pytest.param("max_rate", "0", "above 0", id="rate-zero"),
    pytest.param("max_rate", "-2", "above 0", id="rate-negative"),
    pytest.param("max_rate", "nan", "above 0", id="rate-nan"),
    pytest.param("max_rate", "inf", "above 0", id="rate-inf"),
    pytest.param("max_rate", "1e9", "above 0", id="rate-absurd"),
    pytest.param("max_rate", "9" * 400, "above 0", id="rate-huge"),
    pytest.param("max_rate", "two", "above 0", id="rate-not-a-number"),
])
def test_bad_options_are_a_400_naming_the_parameter_and_open_nothing(
    broker: Broker, ns: str, parameter: str, value: str, word: str
) -> None:
    response = httpx.get(f"{broker.url}/v1/subscribe", timeout=10,
                         params={"namespace": ns, parameter: value},
                         headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"]["parameter"] == parameter
    assert word in error["message"] and error["message"].startswith(parameter)
    assert subscriber_count(broker, ns) == 0


@pytest.mark.parametrize("who", ["no-token", "other-tenant", "read-only", "revoked"])
def test_options_do_not_let_an_unauthorised_caller_in(
    broker: Broker, admin: httpx.Client, ns: str, who: str
) -> None:
    tokens: dict[str, str | None] = {"no-token": None,
              "other-tenant": create_key(admin, (f"{ns}-other", ["read", "subscribe"]))[0],
              "read-only": create_key(admin, (ns, ["read"]))[0]}
    if who == "revoked":
        revoked, key_id = create_key(admin, (ns, ["read", "subscribe"]))
        assert admin.delete(f"/v1/keys/{key_id}").status_code in (200, 204)
        tokens[who] = revoked
    token = tokens[who]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{broker.url}/v1/subscribe", timeout=10, headers=headers,
                         params={"namespace": ns, "filter": DONE, "conflate": "latest",
                                 "max_rate": "5"})
    assert response.status_code == (401 if who in ("no-token", "revoked") else 403)
    assert subscriber_count(broker, ns) == 0


# ---- conflation and rate caps ----


def paused(subscribe: Callable[..., Stream], broker: Broker, ns: str,
           query: list[tuple[str, str]]) -> Stream:
    return subscribe(broker.url, ns, "*", pause_at_open=True, query=query).wait_open()


def final_events(stream: Stream) -> dict[str, int]:
    latest: dict[str, int] = {}
    for event in stream.changes():
        assert event.data["version"] > latest.get(event.data["key"], 0), "out of order"
        latest[event.data["key"]] = event.data["version"]
    return latest


def test_a_lagging_conflated_stream_gets_the_latest_of_every_key_instead_of_overflow(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], backend: str, ns: str
) -> None:
    broker = broker_factory(backend, subscriber_queue_size=8)
    conflated_before = counter(broker, "memp_events_conflated_total")
    keeps_up = subscribe(broker.url, ns, "*", query=[("conflate", "latest")]).wait_open()
    conflated = paused(subscribe, broker, ns, [("conflate", "latest")])
    plain = paused(subscribe, broker, ns, [])
    pad = "x" * 60_000  # 12 MB in all: the socket buffers fill, then the queues
    keys = [f"k/{i}" for i in range(5)]
    with broker.client() as client:
        for n in range(1, 41):
            for key in keys:
                put_ok(client, ns, key, {"n": n, "pad": pad})
    keeps_up.wait_key(keys[-1], 40)
    conflated.resume()
    plain.resume()
    plain.wait_event(lambda e: e.event == "overflow", "the unconflated stream's overflow")
    for key in keys:
        conflated.wait_key(key, 40)
    assert final_events(conflated) == dict.fromkeys(keys, 40)
    assert len(conflated.changes()) < 200
    assert not [e for e in conflated.events if e.event == "overflow"]
    # A consumer that keeps up sees every change.
    assert [e.data["version"] for e in keeps_up.changes() if e.data["key"] == "k/0"] == list(
        range(1, 41))
    assert counter(broker, "memp_events_conflated_total") > conflated_before


def test_past_its_cap_of_keys_a_conflated_stream_overflows_with_a_cursor(
    broker_factory: Callable[..., Broker], subscribe: Callable[..., Stream], backend: str, ns: str
) -> None:
    broker = broker_factory(backend, subscriber_queue_size=4)
    stream = paused(subscribe, broker, ns, [("conflate", "latest")])
    pad = "x" * 60_000
    with broker.client() as client:
        for n in range(200):
            put_ok(client, ns, f"k/{n}", {"pad": pad})
    stream.resume()
    overflow = stream.wait_event(lambda e: e.event == "overflow", "the overflow event")
    resumed = subscribe(broker.url, ns, "*", last_event_id=overflow.id)
    resumed.wait_key("k/199", 1)
    got = {e.data["key"] for e in stream.changes()} | {e.data["key"] for e in resumed.changes()}
    assert got == {f"k/{n}" for n in range(200)}


def test_a_rate_cap_sends_the_latest_change_per_key(
    broker: Broker, admin: httpx.Client, subscribe: Callable[..., Stream], ns: str
) -> None:
    stream = subscribe(broker.url, ns, "*", query=[("max_rate", "1")]).wait_open()
    for n in range(1, 51):
        put_ok(admin, ns, "gauge", n)
    put_ok(admin, ns, "other", 1)
    stream.wait_key("gauge", 50, timeout=WAIT)
    stream.wait_key("other", 1, timeout=WAIT)
    assert final_events(stream) == {"gauge": 50, "other": 1}
    assert len(stream.changes()) < 51



# ---- several processes ----


def test_two_processes_filter_deletes_and_expiries_alike(
    broker_processes: Callable[..., list[Any]], subscribe: Callable[..., Stream], ns: str
) -> None:
    """Writes, deletes and the expiry sweeps of two processes on one Redis: a filtered stream
    on each hears every matching change once, deletes and expiries by the value removed."""
    first, second = broker_processes(2)
    streams = [subscribe(p.url, ns, "*", query=[("filter", DONE)]).wait_open()
               for p in (first, second)]
    with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as one, \
            httpx.Client(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as two:
        def put(client: httpx.Client, url: str, key: str, value: Any, **body: Any) -> None:
            reply = client.put(f"{url}/v1/namespaces/{ns}/memory/{key}",
                               json={"value": value, **body})
            assert reply.status_code in (200, 201), reply.text

        put(one, first.url, "a", {"status": "done"})
        put(two, second.url, "b", {"status": "open"})
        put(one, first.url, "c", {"status": "done"}, ttl_seconds=1)
        for client, url, key in ((two, second.url, "a"), (one, first.url, "b")):
            assert client.delete(f"{url}/v1/namespaces/{ns}/memory/{key}").status_code == 200
    for stream in streams:
        stream.wait_event(lambda e: e.event == "expire", "c's expiry")
        assert seen(stream) == [("put", "a", 1), ("put", "c", 1), ("delete", "a", 2),
                                ("expire", "c", 2)]
