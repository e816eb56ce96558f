"""AMP writes whose Redis connection closes under them: each script call keeps its first reply
for a second sending (broker/storage/resend.py), so the broker sends it once more on a new
connection and answers as if nothing happened; each write is applied exactly once, whether
Redis ran it before the connection closed or not."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from broker.storage import layout
from tests.support.amp import Amp, cell_key, started_amp
from tests.support.brokers import RedisServer
from tests.support.relay import ANSWERED, RelayProxy

AGENT = {"X-AMP-Agent-ID": "agent-1"}


@pytest.fixture
def amp(relay: RelayProxy) -> Iterator[Amp]:
    """An AMP broker whose Redis connections go through the relay."""
    with started_amp("redis", relay.url) as client:
        yield client


def versions(store: RedisServer, amp: Amp, owner: str) -> dict[str, list[int]]:
    """The versions the change log holds for each cell of `owner`: one per write applied."""
    prefix = f"cells/user/{owner}/".encode()
    with redis.Redis.from_url(store.url) as client:
        records = client.xrange(layout.changelog(amp.namespace))
    found: dict[str, list[int]] = {}
    for _, fields in records:
        if fields[b"key"].startswith(prefix):
            found.setdefault(fields[b"key"].decode(), []).append(int(fields[b"ver"]))
    return found


def cut_under(
    relay: RelayProxy, answered: bool, send: Callable[[str], httpx.Response]
) -> httpx.Response:
    """`send(probe)` with the connection carrying the write that holds `probe` cut under it."""
    probe = f"probe{uuid.uuid4().hex}"  # only the write under test carries it to Redis
    relay.cut_on(probe.encode(), answered=answered)
    reply = send(probe)
    assert relay.cuts == 1  # the connection did close under the write
    return reply


def new_owner(amp: Amp) -> str:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    amp.create("a first cell, so the write path's connections are open", owner="warm")
    return owner


@pytest.mark.parametrize("answered", ANSWERED)
def test_a_create_is_sent_again_and_applied_once(
    relay: RelayProxy, amp: Amp, private_redis: RedisServer, answered: bool
) -> None:
    owner = new_owner(amp)
    reply = cut_under(
        relay,
        answered,
        lambda probe: amp.post_cell(
            {
                "type": "semantic",
                "content": {"text": f"the user said {probe}"},
                "identity": {"owner_id": owner, "owner_type": "user"},
            }
        ),
    )
    assert reply.status_code == 201, reply.text
    assert versions(private_redis, amp, owner) == {cell_key(reply.json()): [1]}
    assert amp.stored(reply.json())["content"] == reply.json()["content"]


@pytest.mark.parametrize("answered", ANSWERED)
def test_a_patch_is_sent_again_and_applied_once(
    relay: RelayProxy, amp: Amp, private_redis: RedisServer, answered: bool
) -> None:
    owner = new_owner(amp)
    cell = amp.create("the user likes tea", owner=owner)
    reply = cut_under(
        relay,
        answered,
        lambda probe: amp.patch(cell["id"], {"content": {"text": f"the user likes {probe}"}}),
    )
    assert reply.status_code == 200, reply.text
    assert versions(private_redis, amp, owner) == {cell_key(cell): [1, 2]}
    assert amp.stored(cell)["content"]["text"] == reply.json()["content"]["text"]


@pytest.mark.parametrize("answered", ANSWERED)
def test_a_merge_and_a_delete_are_sent_again_and_applied_once(
    relay: RelayProxy, amp: Amp, private_redis: RedisServer, answered: bool
) -> None:
    def merge(cells: list[dict[str, Any]], text: str) -> httpx.Response:
        body = {"ids": [c["id"] for c in cells], "text": text}
        return amp.http.post("/amp/memories/merge", json=body, headers=AGENT)

    # A first merge, so that Redis knows the script (NOSCRIPT is an answer too).
    warm = [amp.create(f"Bo likes coffee, note {n}", owner="warm") for n in range(2)]
    assert merge(warm, "Bo likes coffee").status_code == 201
    owner = new_owner(amp)
    sources = [amp.create(f"Ana likes tea, note {n}", owner=owner) for n in range(2)]
    merged = cut_under(relay, answered, lambda probe: merge(sources, probe))
    assert merged.status_code == 201, merged.text
    expected = {cell_key(merged.json()): [1], **{cell_key(c): [1, 2] for c in sources}}
    assert versions(private_redis, amp, owner) == expected
    # A merge's sources are archived, so one can be deleted; the write carries its text.
    source = sources[0]
    relay.cut_on(source["content"]["text"].encode(), answered=answered)
    deleted = amp.delete(source["id"])
    assert relay.cuts == 2
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["lifecycle"]["status"] == "deleted"
    expected[cell_key(source)] = [1, 2, 3]
    assert versions(private_redis, amp, owner) == expected
