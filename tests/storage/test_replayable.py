"""Writes under a message id whose Redis connection closes under them: the script replays its
first reply to a second sending, so the broker sends them once more on a new connection and
answers as if nothing happened; each is applied exactly once, whether Redis ran it before the
connection closed or not. A write without a message id cannot be sent again: it is a 503."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from broker.storage import layout
from tests.support.brokers import Broker, RedisServer, start_broker
from tests.support.relay import ANSWERED, RelayProxy
from tests.support.waiting import wait_until


@pytest.fixture
def relayed_broker(relay: RelayProxy) -> Iterator[Broker]:
    handle = start_broker("redis", relay.url)
    yield handle
    handle.stop()


def entry_url(ns: str, key: str) -> str:
    return f"/v1/namespaces/{ns}/memory/{key}"


def versions_written(store: RedisServer, ns: str, key: str) -> list[int]:
    """The versions of `key` the change log holds: one per write applied (a proposal's own
    records carry no version)."""
    with redis.Redis.from_url(store.url) as client:
        records = client.xrange(layout.changelog(ns))
    return [
        int(fields[b"ver"])
        for _, fields in records
        if fields.get(b"key") == key.encode() and b"ver" in fields
    ]


def warm_up(client: httpx.Client, ns: str) -> None:
    """A first write, so the connections the write path uses are open before the cut."""
    assert client.put(entry_url(ns, "warm"), json={"value": 0}).status_code in (200, 201)


@pytest.mark.parametrize("answered", ANSWERED)
@pytest.mark.parametrize("method", ["put", "delete"])
def test_a_write_with_a_message_id_is_sent_again_and_applied_once(
    relay: RelayProxy,
    relayed_broker: Broker,
    private_redis: RedisServer,
    answered: bool,
    method: str,
) -> None:
    ns = f"replay-{uuid.uuid4().hex[:8]}"
    with relayed_broker.client() as client:
        warm_up(client, ns)
        assert client.put(entry_url(ns, "k"), json={"value": "first"}).status_code == 201
        probe = f"probe-{uuid.uuid4().hex}"  # only this request carries it to Redis
        relay.cut_on(probe.encode(), answered=answered)
        headers = {"Idempotency-Key": probe}
        if method == "put":
            reply = client.put(entry_url(ns, "k"), json={"value": probe}, headers=headers)
        else:
            reply = client.request("DELETE", entry_url(ns, "k"), headers=headers)
        assert relay.cuts == 1  # the connection did close under the write
        assert reply.status_code == 200, reply.text
        assert reply.json()["version"] == 2
        assert versions_written(private_redis, ns, "k") == [1, 2]  # applied once
        # The client's own retry is answered from the same first outcome.
        if method == "put":
            again = client.put(entry_url(ns, "k"), json={"value": probe}, headers=headers)
        else:
            again = client.request("DELETE", entry_url(ns, "k"), headers=headers)
        assert (again.status_code, again.json()) == (200, reply.json())
        assert versions_written(private_redis, ns, "k") == [1, 2]


def test_a_write_without_a_message_id_is_not_sent_again(
    relay: RelayProxy,
    relayed_broker: Broker,
    private_redis: RedisServer,
) -> None:
    """Redis ran it, the reply was lost: the broker cannot know, so it says so with a 503
    rather than risk applying it twice."""
    ns = f"replay-{uuid.uuid4().hex[:8]}"
    with relayed_broker.client() as client:
        warm_up(client, ns)
        probe = f"probe-{uuid.uuid4().hex}"
        relay.cut_on(probe.encode(), answered=True)
        reply = client.put(entry_url(ns, "k"), json={"value": probe})
        assert relay.cuts == 1
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "unavailable"
        assert versions_written(private_redis, ns, "k") == [1]  # it was applied, once


def test_a_write_whose_connection_redis_kills_is_sent_again(private_redis: RedisServer) -> None:
    """`CLIENT KILL` of the connection a write waits on (held back by `CLIENT PAUSE WRITE`,
    so Redis has not run it): the broker sends it again on a new connection, where it runs,
    once."""
    broker = start_broker("redis", private_redis.url)
    ns = f"replay-{uuid.uuid4().hex[:8]}"
    replies: list[httpx.Response] = []
    try:
        with broker.client() as client, redis.Redis.from_url(private_redis.url) as admin:
            warm_up(client, ns)
            admin.client_pause(10_000, all=False)  # writes wait; this connection does not
            writer = threading.Thread(
                target=lambda: replies.append(
                    client.put(
                        entry_url(ns, "k"), json={"value": "v"}, headers={"Idempotency-Key": "m-1"}
                    )
                )
            )
            writer.start()

            def held() -> list[dict[str, str]]:
                return [
                    c for c in admin.client_list() if c["cmd"] == "evalsha" and "b" in c["flags"]
                ]

            wait_until(held, "the write to wait for the pause")
            admin.client_kill_filter(_id=held()[0]["id"])
            admin.client_unpause()
            writer.join(timeout=30)
    finally:
        broker.stop()
    assert len(replies) == 1 and replies[0].status_code == 201, replies
    assert replies[0].json()["version"] == 1
    assert versions_written(private_redis, ns, "k") == [1]


@pytest.mark.parametrize("answered", ANSWERED)
def test_a_batch_message_and_a_proposal_with_message_ids_are_sent_again(
    relay: RelayProxy,
    relayed_broker: Broker,
    private_redis: RedisServer,
    answered: bool,
) -> None:
    """A `memory.put` in a `/v1/messages` batch is the same write; a put asking for approval
    stores a proposal, whose script replays its first reply under the message id too."""
    ns = f"replay-{uuid.uuid4().hex[:8]}"
    with relayed_broker.client() as client:
        warm_up(client, ns)
        probe = f"probe-{uuid.uuid4().hex}"
        relay.cut_on(probe.encode(), answered=answered)
        batch = [
            {
                "memp": "1.0",
                "type": "memory.put",
                "id": f"m-{n}-{probe}",
                "namespace": ns,
                "key": key,
                "value": value,
            }
            for n, (key, value) in enumerate((("a", 1), ("b", probe)))
        ]
        reply = client.post("/v1/messages", json=batch)
        assert relay.cuts == 1
        assert reply.status_code == 200, reply.text
        assert [r["type"] for r in reply.json()] == ["ack", "ack"], reply.text
        assert versions_written(private_redis, ns, "b") == [1]

        # A first proposal, so that Redis knows the script (NOSCRIPT is an answer too).
        warm = client.put(entry_url(ns, "w"), json={"value": 0, "approval_required": True})
        assert warm.status_code == 202, warm.text
        probe = f"probe-{uuid.uuid4().hex}"
        relay.cut_on(probe.encode(), answered=answered)
        headers = {"Idempotency-Key": probe}
        body = {"value": probe, "approval_required": True}
        proposed = client.put(entry_url(ns, "c"), json=body, headers=headers)
        assert relay.cuts == 2
        assert proposed.status_code == 202, proposed.text
        with redis.Redis.from_url(private_redis.url) as store:
            assert store.zcard(layout.proposals(ns)) == 2  # proposed once, beside the first
        again = client.put(entry_url(ns, "c"), json=body, headers=headers)
        assert (again.status_code, again.json()) == (202, proposed.json())


@pytest.mark.parametrize("answered", ANSWERED)
def test_an_approval_is_sent_again_and_applied_once(
    relay: RelayProxy,
    relayed_broker: Broker,
    private_redis: RedisServer,
    answered: bool,
) -> None:
    """A decision takes no message id: its call keeps its first reply under a key of its own
    (broker/storage/resend.py), which answers a second sending."""
    ns = f"replay-{uuid.uuid4().hex[:8]}"
    with relayed_broker.client() as client:
        warm_up(client, ns)
        config = {"allow_self_approval": True}
        assert client.put(f"/v1/namespaces/{ns}/config", json=config).status_code == 200

        def approve(key: str, value: str) -> httpx.Response:
            body = {"value": value, "approval_required": True}
            proposed = client.put(entry_url(ns, key), json=body)
            assert proposed.status_code == 202, proposed.text
            if value.startswith("probe-"):
                relay.cut_on(value.encode(), answered=answered)
            return client.post(f"/v1/namespaces/{ns}/proposals/{proposed.json()['id']}/approve")

        # A first approval, so that Redis knows the script (NOSCRIPT is an answer too).
        assert approve("w", "warm").status_code == 200
        probe = f"probe-{uuid.uuid4().hex}"  # the proposed value: the approval writes it
        approved = approve("c", probe)
        assert relay.cuts == 1
        assert approved.status_code == 200, approved.text
        assert versions_written(private_redis, ns, "c") == [1]  # applied once
        assert client.get(entry_url(ns, "c")).json()["value"] == probe
