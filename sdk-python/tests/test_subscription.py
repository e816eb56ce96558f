"""Subscriptions against a real broker: typed events, snapshot start, resume from a cursor,
`reset` handed to the caller, and a broker restarted mid-stream without a lost or doubled event.

Sync iterators are read on a thread (`collect`), so every wait has a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from memp import (
    MEMP,
    AsyncMEMP,
    ConnectionState,
    Event,
    Forbidden,
    Grant,
    InvalidRequest,
    OpenTimeout,
    Unauthorized,
)
from tests.support.brokers import ADMIN_KEY, Broker, free_port

WAIT = 15.0


def summary(events: list[Event]) -> list[tuple[str, str | None, int | None]]:
    return [(e.type, e.key, e.version) for e in events]


def test_live_events_are_typed_entries(client: MEMP, collect: Callable[..., Any]) -> None:
    events = collect(client.subscribe("customer/*"))
    client.memory.put("other/1", "not matched")
    put = client.memory.put("customer/1", {"plan": "pro"})
    client.memory.delete("customer/1")
    client.memory.put("customer/2", [1, 2], ttl_seconds=1)

    first, deleted, second, expired = events.take(4)
    assert first.type == "put" and first.entry == put and first.value == {"plan": "pro"}
    assert first.key == "customer/1" and first.version == 1 and first.namespace == put.namespace
    assert first.id is not None, "every change carries its resume cursor"
    assert (deleted.type, deleted.key, deleted.version, deleted.value) == (
        "delete", "customer/1", 2, None)
    assert deleted.entry is not None and deleted.entry.deleted
    assert (second.type, second.value) == ("put", [1, 2])
    assert (expired.type, expired.key, expired.version) == ("expire", "customer/2", 2)


def test_snapshot_then_live(client: MEMP, collect: Callable[..., Any]) -> None:
    for n in range(3):
        client.memory.put(f"k/{n}", n)
    client.memory.put("k/1", "updated")
    events = collect(client.subscribe("k/*", snapshot=True))
    snapshot = events.take(4)
    assert summary(snapshot) == [("snapshot", "k/0", 1), ("snapshot", "k/1", 2),
                                 ("snapshot", "k/2", 1), ("snapshot-end", None, None)]
    assert snapshot[1].value == "updated" and snapshot[0].id is None
    assert snapshot[3].id is not None
    client.memory.put("k/3", 3)
    assert summary(events.take(1)) == [("put", "k/3", 1)]


def test_several_patterns_in_one_stream(client: MEMP, ns: str,
                                        collect: Callable[..., Any]) -> None:
    events = collect(client.subscribe(["a/*", "b/x"]))
    for key in ["a/1", "c/1", "b/y", "b/x"]:
        client.memory.put(key, key)
    assert [e.key for e in events.take(2)] == ["a/1", "b/x"]


def test_resume_from_a_saved_cursor_misses_and_repeats_nothing(
    client: MEMP, collect: Callable[..., Any]
) -> None:
    with client.subscribe("k") as subscription:
        events = collect(subscription)
        for n in range(1, 4):
            client.memory.put("k", n)
        events.take(3)
        cursor = subscription.last_event_id
        assert cursor == events.received[-1].id
        events.close()
    for n in range(4, 7):
        client.memory.put("k", n)
    resumed = collect(client.subscribe("k", last_event_id=cursor))
    client.memory.put("k", 7)
    assert [e.version for e in resumed.take(4)] == [4, 5, 6, 7]


def test_reset_is_handed_to_the_caller(broker_factory: Callable[..., Broker], ns: str,
                                       collect: Callable[..., Any]) -> None:
    small = broker_factory("redis", changelog_maxlen=5)
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=small.url) as client:
        first = collect(client.subscribe("k"))
        client.memory.put("k", 1)
        [one] = first.take(1)
        for n in range(2, 12):
            client.memory.put("k", n)
        first.take(10)

        # The log kept only the last 5 changes: resuming after version 1 lost versions 2..6.
        lost = collect(client.subscribe("k", last_event_id=one.id))
        [reset] = lost.take(1)
        assert (reset.type, reset.namespace) == ("reset", ns) and reset.reason
        assert reset.id is not None and reset.entry is None
        client.memory.put("k", "after the reset")
        assert summary(lost.take(1)) == [("put", "k", 12)]


def test_a_filtered_subscription_gets_what_matches_and_resumes_past_the_rest(
    client: MEMP, collect: Callable[..., Any]
) -> None:
    with client.subscribe("t/*", filter='/status == "done"', conflate="latest",
                          max_rate=100) as subscription:
        events = collect(subscription)
        client.memory.put("t/1", {"status": "open"})
        client.memory.put("t/2", {"status": "done"})
        client.memory.put("t/3", {"status": "open"})
        first = events.take(1)
        assert summary(first) == [("put", "t/2", 1)]
        # The broker's `progress` event moves the cursor past t/3 without handing it out.
        deadline = time.monotonic() + WAIT
        while subscription.last_event_id in (None, first[0].id):
            assert time.monotonic() < deadline, "no progress event"
            time.sleep(0.02)
        cursor = subscription.last_event_id
    client.memory.put("t/4", {"status": "done"})
    resumed = collect(client.subscribe("t/*", filter='/status == "done"', last_event_id=cursor))
    assert summary(resumed.take(1)) == [("put", "t/4", 1)]
    with pytest.raises(InvalidRequest) as caught:
        next(client.subscribe("*", filter="/status = 1"))
    assert "position 8" in str(caught.value)


def test_refusals_end_the_subscription_with_their_error(
    client: MEMP, server: Broker, ns: str
) -> None:
    reader = client.keys.create([Grant(ns, ["read"])]).api_key
    with MEMP(api_key=reader, namespace=ns, base_url=server.url) as no_subscribe, \
            pytest.raises(Forbidden):
        next(no_subscribe.subscribe("*"))
    with pytest.raises(InvalidRequest) as caught:
        next(client.subscribe("*", last_event_id="not a cursor"))
    assert caught.value.code == "invalid_request"


def test_revoked_ends_the_subscription_with_the_refusal(
    client: MEMP, server: Broker, ns: str, collect: Callable[..., Any]
) -> None:
    """After `revoked` the SDK keeps the cursor and reconnects; the broker refuses the revoked
    key, and that refusal ends the subscription."""
    created = client.keys.create([Grant(ns, ["read", "write", "subscribe"])])
    with MEMP(api_key=created.api_key, namespace=ns, base_url=server.url) as holder:
        events = collect(holder.subscribe("*"))
        holder.memory.put("k", 1)
        assert summary(events.take(1)) == [("put", "k", 1)]
        client.keys.revoke(created.key.id)
        with pytest.raises(Unauthorized):
            events.take(1)
        assert events.source.last_event_id is not None
        assert events.source.last_event_id.startswith(f"{ns}:")


def test_a_subscription_survives_a_broker_restart(
    serve: Callable[..., Any], ns: str, collect: Callable[..., Any]
) -> None:
    """Events written before, during and after the restart each arrive once, in order."""
    first = serve()
    other = serve()  # takes the writes while the first is down
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=first.url) as client, \
            MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=other.url) as writer:
        states: list[ConnectionState] = []
        events = collect(client.subscribe("k/*", on_state=states.append))
        for n in range(1, 4):
            client.memory.put("k/a", n)
        assert [e.version for e in events.take(3)] == [1, 2, 3]

        first.stop()
        for n in range(4, 7):
            writer.memory.put("k/a", n)
        writer.memory.put("k/b", "while down")
        restarted = serve(port=first.port)
        assert restarted.url == first.url
        for n in range(7, 10):
            client.memory.put("k/a", n)

        received = events.take(7, timeout=30.0)
        assert [e.version for e in received if e.key == "k/a"] == list(range(4, 10))
        assert [(e.key, e.value) for e in received if e.key == "k/b"] == [("k/b", "while down")]
        assert all(e.type == "put" for e in received)
        client.memory.put("k/end", True)
        assert summary(events.take(1)) == [("put", "k/end", 1)]
    # After a stream that worked, the tries count from 1 again (`memp watch` prints them).
    attempts = [s.attempt for s in states if s.status == "reconnecting"]
    assert attempts and attempts == list(range(1, len(attempts) + 1)), attempts


def test_async_subscription_starts_with_a_snapshot_and_survives_a_restart(
    serve: Callable[..., Any], ns: str
) -> None:
    first = serve()

    async def main() -> list[tuple[str, str | None, int | None]]:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=first.url) as broker:
            await broker.memory.put("k", "v1")
            received: list[Event] = []
            async with broker.subscribe("k", snapshot=True) as subscription:
                async with asyncio.timeout(45):
                    async for event in subscription:
                        received.append(event)
                        if event.type == "snapshot-end":
                            await broker.memory.put("k", "v2")
                        elif event.version == 2:
                            await asyncio.to_thread(first.stop)
                            await asyncio.to_thread(serve, first.port)
                            await broker.memory.put("k", "v3")
                        elif event.version == 3:
                            break
            return summary(received)

    assert asyncio.run(main()) == [("snapshot", "k", 1), ("snapshot-end", None, None),
                                   ("put", "k", 2), ("put", "k", 3)]


def test_overflow_is_resumed_transparently(broker_factory: Callable[..., Broker], ns: str
                                           ) -> None:
    """A consumer too slow for the broker is cut off with `overflow`; the SDK resumes from its
    cursor and the caller sees every version once, and no overflow."""
    small = broker_factory("redis", subscriber_queue_size=5)
    total, pad = 150, "x" * 60_000  # 9 MB: the socket buffers fill, then the 5-slot queue
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=small.url) as slow, \
            small.client() as writer:
        subscription = slow.subscribe("k").open()  # open, but not read until all is written
        for n in range(1, total + 1):
            writer.put(f"/v1/namespaces/{ns}/memory/k", json={"value": {"n": n, "pad": pad}}
                       ).raise_for_status()
        received = []
        for event in subscription:
            received.append(event)
            if event.version == total:
                break
        assert [(e.type, e.version) for e in received] == [
            ("put", n) for n in range(1, total + 1)]
        assert subscription.reconnects >= 1, "the broker did cut the slow consumer off"
        subscription.close()


# ---- connection state and open() timeouts ----


def test_connection_states_are_reported(client: MEMP) -> None:
    states: list[ConnectionState] = []
    subscription = client.subscribe("*", on_state=states.append).open(timeout=WAIT)
    subscription.close()
    assert [s.status for s in states] == ["connecting", "connected", "closed"]
    assert states[-1].error is None


def test_open_times_out_against_an_unreachable_broker_with_the_error() -> None:
    states: list[ConnectionState] = []
    url = f"http://127.0.0.1:{free_port()}"
    with MEMP(api_key="memp_sk_x", namespace="n", base_url=url) as memp:
        subscription = memp.subscribe("*", on_state=states.append)
        with pytest.raises(OpenTimeout) as caught:
            subscription.open(timeout=1.0)
    assert caught.value.code == "connection_error"
    assert "did not open in time" in caught.value.message
    reconnecting = [s for s in states if s.status == "reconnecting"]
    assert states[0].status == "connecting"
    assert reconnecting and reconnecting[0].attempt == 1 and reconnecting[0].error is not None
    assert [s.attempt for s in reconnecting] == list(range(1, len(reconnecting) + 1))
    assert states[-1].status == "closed" and isinstance(states[-1].error, OpenTimeout)


def test_async_open_times_out_against_an_unreachable_broker() -> None:
    states: list[ConnectionState] = []

    async def scenario() -> None:
        url = f"http://127.0.0.1:{free_port()}"
        async with AsyncMEMP(api_key="memp_sk_x", namespace="n", base_url=url) as memp:
            subscription = memp.subscribe("*", on_state=states.append)
            with pytest.raises(OpenTimeout):
                await subscription.open(timeout=1.0)

    asyncio.run(scenario())
    assert states[0].status == "connecting" and states[-1].status == "closed"


def test_a_refusal_closes_with_its_error(server: Broker, ns: str) -> None:
    states: list[ConnectionState] = []
    with MEMP(api_key="memp_sk_wrong", namespace=ns, base_url=server.url) as memp, \
            pytest.raises(Unauthorized):
        memp.subscribe("*", on_state=states.append).open(timeout=WAIT)
    assert [s.status for s in states] == ["connecting", "closed"]
    assert isinstance(states[-1].error, Unauthorized)
    assert states[-1].error.request_id  # the broker's id for the refused request
