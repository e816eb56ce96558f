"""The fan-out hub and its parts, on a real (embedded) Redis: cursors, subscriber queues, one
reader per namespace, and telling retained, trimmed and lost change-log positions apart."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import fakeredis
import pytest

from broker.amp.visibility import CellVisibility
from broker.core.errors import MempError
from broker.core.filters import compile_guarded
from broker.core.grammar import compile_pattern
from broker.runtime.supervisor import Supervisor
from broker.services.visibility import Viewer
from broker.storage import layout
from broker.storage.changelog import (
    LOST,
    REPLACED,
    TRIMMED,
    ChangeLogStore,
    Gap,
    Mark,
    position_key,
    record_check,
)
from broker.streaming.changes import Change, ChangeLog
from broker.streaming.hub import Audience, Hub, Subscriber
from broker.streaming.queues import ConflatingQueue
from broker.web import frames
from broker.web.frames import format_cursor, parse_cursor

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

# ---- cursors ----


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param(None, None, id="absent"),
    pytest.param("  ", None, id="blank"),
    pytest.param("acme:1700000000000-0", {"acme": Mark("1700000000000-0")}, id="plain"),
    pytest.param("acme:1700000000000-0~0a1b2c3d", {"acme": Mark("1700000000000-0", "0a1b2c3d")},
                 id="checked"),
    pytest.param("a.b:1-2~ffffffff,c-d:3-4", {"a.b": Mark("1-2", "ffffffff"), "c-d": Mark("3-4")},
                 id="two"),
    pytest.param("acme:0-0", {"acme": Mark("0-0")}, id="start-of-log"),
])
def test_parse_cursor_reads_what_the_broker_issues(text: str | None,
                                                   expected: dict[str, Mark] | None) -> None:
    assert parse_cursor(text) == expected


@pytest.mark.parametrize("text", [
    pytest.param("acme", id="no-position"),
    pytest.param("acme:17", id="no-sequence"),
    pytest.param("Acme:1-0", id="upper-case-namespace"),
    pytest.param("acme:1-0,", id="trailing-comma"),
    pytest.param("acme:a-b", id="not-numbers"),
    pytest.param("acme:1-0;drop", id="junk"),
    pytest.param("acme:" + "9" * 21 + "-0", id="too-long"),
    pytest.param("acme:1-0~", id="empty-check"),
    pytest.param("acme:1-0~0a1b2c3", id="short-check"),
    pytest.param("acme:1-0~0a1b2c3d4", id="long-check"),
    pytest.param("acme:1-0~0A1B2C3D", id="upper-case-check"),
    pytest.param("acme:1-0~0a1b2c3g", id="not-hex-check"),
    pytest.param("acme:1-0~~0a1b2c3d", id="two-tildes"),
    pytest.param("acme:1-0~" + "*" * 128, id="stars"),
    pytest.param("acme:1-0~0a1b2c3d\x00", id="control-char"),
    pytest.param("acme:1-0~0a1b\n2c3d", id="newline"),
])
def test_parse_cursor_refuses_anything_else(text: str) -> None:
    with pytest.raises(MempError) as raised:
        parse_cursor(text)
    assert raised.value.code == "invalid_request" and raised.value.status == 400


def test_format_cursor_sorts_namespaces_and_round_trips() -> None:
    positions = {"zeta": Mark("5-0", "00ff00ff"), "alpha": Mark("7-1"), "mid": Mark("0-0")}
    text = format_cursor(positions)
    assert text == b"alpha:7-1,mid:0-0,zeta:5-0~00ff00ff"
    assert parse_cursor(text.decode()) == positions


def test_positions_compare_as_numbers() -> None:
    assert position_key("10-0") > position_key("9-9")
    assert position_key("1-10") > position_key("1-9")
    assert position_key("0-0") < position_key("0-1")


# ---- a subscriber's queue ----


def change(namespace: str, key: str, version: int = 1, position: str = "1-0") -> Change:
    return Change(namespace, position, "put", key, version, b"{}")


def test_subscription_takes_only_its_namespaces_and_patterns() -> None:
    async def scenario() -> None:
        sub = Subscriber({"a": [compile_pattern("x/*"), compile_pattern("y")],
                            "b": [compile_pattern("*")]}, 10, Viewer(""))
        for c in [change("a", "x/1"), change("a", "y"), change("a", "y/1"), change("a", "z"),
                  change("b", "anything"), change("c", "x/1")]:
            sub.offer(c)
        got = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
        assert [(c.namespace, c.key) for c in got if c] == [("a", "x/1"), ("a", "y"),
                                                            ("b", "anything")]

    asyncio.run(scenario())


def test_a_full_queue_marks_overflow_instead_of_blocking() -> None:
    async def scenario() -> None:
        sub = Subscriber({"a": [compile_pattern("*")]}, 3, Viewer(""))
        for n in range(10):
            sub.offer(change("a", "k", n + 1))
        assert sub.overflowed and sub.queue.qsize() == 3
        sub.nudge()  # a full queue cannot take the nudge; that must not raise
        sub.rearm()
        assert not sub.overflowed and sub.queue.empty()
        sub.offer(change("a", "k", 11))
        queued = sub.queue.get_nowait()
        assert queued is not None and queued.version == 11

    asyncio.run(scenario())


def test_a_queue_is_bounded_by_the_bytes_it_holds_too() -> None:
    """Large values overflow a subscriber's queue long before its count does: what one that
    never reads can hold is MEMP_SUBSCRIBER_QUEUE_BYTES, not MEMP_SUBSCRIBER_QUEUE_SIZE times
    the largest value. A change larger than the bound alone is still taken."""
    def big(version: int) -> Change:
        data = b'"' + b"x" * 10_000 + b'"'
        return Change("a", f"{version}-0", "put", "k", version, data,
                      frame=frames.change("a", Mark(f"{version}-0"), "put", data))

    async def scenario() -> None:
        frame = len(big(1).frame)
        sub = Subscriber({"a": [compile_pattern("*")]}, 1000, Viewer(""),
                         queue_bytes=frame * 3)
        for n in range(1, 11):
            sub.offer(big(n))
        assert sub.overflowed and sub.queue.qsize() == 3
        assert sub.queue.bytes == frame * 3
        first = sub.queue.get_nowait()
        assert first is not None and first.version == 1 and sub.queue.bytes == frame * 2
        sub.rearm()
        assert sub.queue.bytes == 0
        alone = Subscriber({"a": [compile_pattern("*")]}, 1000, Viewer(""), queue_bytes=10)
        alone.offer(big(1))
        assert not alone.overflowed and alone.queue.qsize() == 1
        alone.offer(big(2))
        assert alone.overflowed

    asyncio.run(scenario())


# ---- the change log's continuity check ----


def run_with_log(scenario: Callable[[Any, ChangeLog], Awaitable[None]]) -> None:
    async def main() -> None:
        client = fakeredis.FakeAsyncRedis()
        try:
            await scenario(client, ChangeLog(ChangeLogStore(client), CellVisibility("amp"),
                                                     frames.change))
        finally:
            await client.aclose()

    asyncio.run(main())


async def log_change(client: Any, namespace: str, key: str, version: int) -> str:
    raw = await client.xadd(layout.changelog(namespace), {
        "type": "put", "key": key, "id": "e1", "agent": "tester", "val": str(version),
        "ver": str(version), "ca": "1", "ua": "1", "ts": "1"})
    return str(raw.decode())


def test_gap_tells_retained_trimmed_lost_and_replaced_positions_apart() -> None:
    async def scenario(client: Any, changelog: ChangeLog) -> None:
        ids = [await log_change(client, "ns", "k", v) for v in range(1, 6)]
        records = await client.xrange(layout.changelog("ns"))
        checks = [record_check(fields) for _, fields in records]
        assert len(set(checks)) == 5  # every version's record has its own check
        assert await changelog.gap("ns", "0-0") is None  # nothing trimmed yet
        checked = [await changelog.gap("ns", i, c) for i, c in zip(ids, checks, strict=True)]
        assert checked == [None] * 5
        assert [await changelog.gap("ns", i) for i in ids] == [None] * 5  # a plain cursor
        # Retention drops the two oldest and notes the newest it dropped.
        await client.xdel(layout.changelog("ns"), ids[0], ids[1])
        await client.hset(layout.meta("ns"), "trimmed", ids[1])
        assert await changelog.gap("ns", "0-0") == Gap(TRIMMED, "0-0")
        assert await changelog.gap("ns", ids[0]) == Gap(TRIMMED, "0-0")
        assert await changelog.gap("ns", ids[1]) is None  # saw the last dropped: lost nothing
        assert await changelog.gap("ns", ids[2]) is None
        # A failover to a replica that lacked the newest changes: the history after ids[2]
        # is another one. A cursor at a change it lacks, at another change held under the same
        # id (its check differs), or beyond its end goes on from the newest change before it.
        await client.xdel(layout.changelog("ns"), ids[3])
        assert await changelog.gap("ns", ids[3]) == Gap(REPLACED, ids[2], checks[2])
        assert await changelog.gap("ns", ids[4], checks[3]) == Gap(REPLACED, ids[2], checks[2])
        assert await changelog.gap("ns", "99999999999999-0") == Gap(REPLACED, ids[4], checks[4])
        # Redis lost its data: the new log holds nothing at or before the position.
        await client.delete(layout.changelog("ns"), layout.meta("ns"))
        await log_change(client, "ns", "k", 1)
        assert await changelog.gap("ns", ids[4]) == Gap(LOST, "0-0")

    run_with_log(scenario)


# ---- readers ----


async def wait_for(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(1000):  # ten seconds at most
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def next_change(sub: Subscriber) -> Change | None:
    return await asyncio.wait_for(sub.queue.get(), timeout=10)


async def next_delivery(sub: Subscriber) -> Change:
    """The next change queued, past any nudges."""
    item = await next_change(sub)
    while item is None:  # nudges
        item = await next_change(sub)
    return item


async def following_two_versions(client: Any, changelog: ChangeLog
                                 ) -> tuple[Hub, Subscriber, str, str]:
    """A hub whose reader of `a` read versions 1 and 2 of `k`: the hub, its one subscriber,
    and the two changes' positions."""
    hub = Hub(changelog, block_ms=50, ready_timeout=5, supervisor=Supervisor())
    sub = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""))
    await hub.join(sub)
    shared = await log_change(client, "a", "k", 1)
    deposed = await log_change(client, "a", "k", 2)
    await wait_for(lambda: hub.readers["a"].position == deposed, "the reader to catch up")
    return hub, sub, shared, deposed


def test_one_reader_per_namespace_stopped_after_its_last_subscriber() -> None:
    async def scenario(client: Any, changelog: ChangeLog) -> None:
        hub = Hub(changelog, block_ms=50, ready_timeout=5, supervisor=Supervisor())
        one = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""))
        two = Subscriber({"a": [compile_pattern("k")], "b": [compile_pattern("*")]}, 10,
                           Viewer(""))
        await hub.join(one)
        await hub.join(two)
        assert sorted(hub.readers) == ["a", "b"]
        assert hub.subscriber_count == 2
        reader_a = hub.readers["a"]

        await log_change(client, "a", "k", 1)
        await log_change(client, "b", "other", 1)
        first, second = await next_change(one), await next_change(two)
        assert first is not None and (first.namespace, first.key) == ("a", "k")
        assert second is not None and second.namespace in ("a", "b")

        hub.leave(two)
        assert sorted(hub.readers) == ["a"] and hub.readers["a"] is reader_a
        hub.leave(one)
        assert hub.readers == {}
        await wait_for(reader_a.task.done, "the reader to stop")
        await hub.close()

    run_with_log(scenario)


def test_reader_resets_subscribers_when_the_log_is_recreated() -> None:
    async def scenario(client: Any, changelog: ChangeLog) -> None:
        hub = Hub(changelog, block_ms=50, ready_timeout=5, supervisor=Supervisor())
        sub = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""))
        await hub.join(sub)
        await log_change(client, "a", "k", 1)
        got = await next_change(sub)
        assert got is not None and got.version == 1
        # Redis lost its data and a write arrived before the reader looked again. A recreated
        # log can only repeat the reader's position within the same millisecond, which no
        # restart is quick enough for; the pause keeps this test from doing it.
        await client.delete(layout.changelog("a"))
        await asyncio.sleep(0.002)
        await log_change(client, "a", "k", 1)
        await wait_for(lambda: "a" in sub.resets, "the reset flag")
        item = await next_delivery(sub)
        assert (item.key, item.version) == ("k", 1)
        await wait_for(lambda: hub.readers["a"].position == item.position, "the reader to follow")
        await hub.close()

    run_with_log(scenario)


def test_reader_resets_subscribers_when_a_failover_replaced_the_history() -> None:
    """The reader read a change the new primary never had (a deposed primary's), and the new
    history holds another change under a nearby id: it resets its subscribers at once, drops
    what it queued from the old history, and delivers the new history's changes from the
    newest one both share."""
    async def scenario(client: Any, changelog: ChangeLog) -> None:
        hub, sub, shared, deposed = await following_two_versions(client, changelog)
        got = [await next_change(sub) for _ in range(2)]
        assert [c.version if c else None for c in got] == [1, 2]
        # The failover: the new primary lacks version 2 and took another write meanwhile.
        await client.xdel(layout.changelog("a"), deposed)
        kept = await log_change(client, "a", "other", 1)
        await wait_for(lambda: "a" in sub.resets, "the reset flag")
        assert (sub.resets["a"].cause, sub.resets["a"].resume) == (REPLACED, shared)
        item = await next_delivery(sub)
        assert (item.key, item.version, item.position) == ("other", 1, kept)
        await hub.close()

    run_with_log(scenario)


async def rewrite_last(client: Any, namespace: str, key: str, version: int) -> None:
    """Another history under the same ids: the log's last record becomes a write of `key` at
    `version` (what a failover to a replica that took another write at the same instant
    leaves)."""
    log_key = layout.changelog(namespace)
    records = await client.xrange(log_key)
    await client.delete(log_key)
    last = records[-1][0]
    for position, fields in records[:-1]:
        await client.xadd(log_key, fields, id=position)
    await client.xadd(log_key, {**records[-1][1], b"key": key.encode(),
                                b"ver": str(version).encode(), b"ua": b"2"}, id=last)


def test_reader_resets_when_another_record_of_the_same_key_holds_its_position() -> None:
    """The reader's position names a record another history holds too, for the same key (a
    deposed primary's version 2, the new primary's own version 2 under the same id): the
    record's check tells them apart, and the stream resets instead of going on silently."""
    async def scenario(client: Any, changelog: ChangeLog) -> None:
        hub, sub, shared, deposed = await following_two_versions(client, changelog)
        await rewrite_last(client, "a", "k", 2)
        await wait_for(lambda: "a" in sub.resets, "the reset flag")
        assert (sub.resets["a"].cause, sub.resets["a"].resume) == (REPLACED, shared)
        replaced = await next_delivery(sub)  # what was queued from the old history is dropped
        assert (replaced.position, replaced.key, replaced.version) == (deposed, "k", 2)
        await wait_for(lambda: hub.readers["a"].check == replaced.check, "the reader to follow")
        await hub.close()

    run_with_log(scenario)


def test_reader_does_not_reset_for_retention_behind_it() -> None:
    async def scenario(client: Any, changelog: ChangeLog) -> None:
        hub = Hub(changelog, block_ms=50, ready_timeout=5, supervisor=Supervisor())
        sub = Subscriber({"a": [compile_pattern("*")]}, 100, Viewer(""))
        await hub.join(sub)
        ids = [await log_change(client, "a", "k", v) for v in range(1, 4)]
        await wait_for(lambda: hub.readers["a"].position == ids[-1], "the reader to catch up")
        await client.xdel(layout.changelog("a"), ids[0], ids[1])
        await client.hset(layout.meta("a"), "trimmed", ids[1])
        await log_change(client, "a", "k", 4)
        await asyncio.sleep(0.3)  # several reads later
        assert sub.resets == {}
        versions = [c.version for c in [sub.queue.get_nowait() for _ in range(4)] if c]
        assert versions == [1, 2, 3, 4]
        await hub.close()

    run_with_log(scenario)


def test_hub_close_tells_subscribers_to_finish() -> None:
    async def scenario(client: Any, changelog: ChangeLog) -> None:
        hub = Hub(changelog, block_ms=50, ready_timeout=5, supervisor=Supervisor())
        sub = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""))
        await hub.join(sub)
        task = hub.readers["a"].task
        await hub.close()
        assert sub.closing and await next_change(sub) is None
        assert task.done() and hub.readers == {}

    run_with_log(scenario)


# ---- conflation ----


def _change(key: str, seq: int, kind: str = "put", size: int = 10) -> Change:
    return Change("ns", f"1-{seq}", kind, key, seq, b"{}", frame=b"x" * size)


def test_a_conflating_queue_keeps_the_newest_change_per_key_in_log_order() -> None:
    queue = ConflatingQueue(3)
    for change in [_change("a", 1), _change("b", 2), _change("a", 3), _change("c", 4),
                   _change("b", 5, "delete"), _change("p", 6, "proposal"),
                   _change("p", 7, "approved")]:
        try:
            queue.put_nowait(change)
        except asyncio.QueueFull:
            break
    # a, c, b fill the three slots; the proposal is a fourth (never replaced): full.
    assert [(c.key, c.position) for c in _drain(queue)] == [("a", "1-3"), ("c", "1-4"),
                                                            ("b", "1-5")]
    assert queue.conflated == 2 and queue.empty() and queue.bytes == 0


def test_a_conflating_queue_is_bounded_by_bytes_and_passes_nudges() -> None:
    queue = ConflatingQueue(100, maxbytes=25)
    queue.put_nowait(_change("a", 1, size=10))
    queue.put_nowait(_change("a", 2, size=20))  # replaces: 20 bytes held
    with pytest.raises(asyncio.QueueFull):
        queue.put_nowait(_change("b", 3, size=10))
    queue.put_nowait(None)
    assert queue.get_nowait() is None  # a nudge comes first: the stream looks at its flags
    assert [c.position for c in _drain(queue)] == ["1-2"]


def _drain(queue: Any) -> list[Change]:
    found = []
    while not queue.empty():
        item = queue.get_nowait()
        if item is not None:
            found.append(item)
    return found


# ---- filters in the hub ----


def test_an_audience_asks_only_the_subscribers_a_guard_chooses() -> None:
    async def scenario() -> None:
        audience = Audience()
        made = {}
        for name, text in [("done", '/s == "done"'), ("open-or-done", '/s in ["open", "done"]'),
                           ("not-open", '/s != "open"'), ("all", None)]:
            accepts, guard = compile_guarded(text) if text else (None, None)
            made[name] = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""),
                                    accepts=accepts, guard=guard)
            audience.add(made[name])
        assert len(audience.indexes["/s"].by_key) == 2 and len(audience.plain) == 2
        for n, status in enumerate(["done", "open", "later"], start=1):
            value = f'{{"s": "{status}"}}'.encode()
            audience.offer(Change("a", f"1-{n}", "put", f"k{n}", 1, value, raw_value=value))
        got = {name: [c.key for c in _drain(s.queue)] for name, s in made.items()}
        assert got == {"done": ["k1"], "open-or-done": ["k1", "k2"], "not-open": ["k1", "k3"],
                       "all": ["k1", "k2", "k3"]}
        # Offered to neither index entry: "done" twice (k2, k3), "open-or-done" once (k3).
        assert audience.tally.filtered == 3
        for subscriber in made.values():
            audience.discard(subscriber)
        assert not audience.indexes and not audience.plain and len(audience) == 0

    asyncio.run(scenario())


def test_a_stream_that_sends_takes_its_progress_along_else_the_next_tick_nudges_it(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the log moved past changes a filter left out, a filtered subscriber that sent
    nothing since the last tick is nudged to send its cursor; one that sent changes (its
    stream set `sent`) is only marked, to send it with its next send, and is nudged at the
    next tick if that has not come."""
    monkeypatch.setattr("broker.streaming.hub.PROGRESS_SECONDS", 0.5)

    async def scenario(client: Any, changelog: ChangeLog) -> None:
        hub = Hub(changelog, block_ms=50, ready_timeout=5, supervisor=Supervisor())
        made = {}
        for name in ("quiet", "busy"):
            accepts, guard = compile_guarded('key == "other"')
            made[name] = Subscriber({"a": [compile_pattern("*")]}, 10, Viewer(""),
                                    accepts=accepts, guard=guard)
            await hub.join(made[name])
        quiet, busy = made["quiet"], made["busy"]
        busy.sent = True
        await log_change(client, "a", "k", 1)
        assert await next_change(quiet) is None  # the nudge
        assert quiet.progress_due and quiet.progress_nudged
        assert busy.progress_due and not busy.progress_nudged and busy.queue.empty()
        assert not busy.sent
        assert await next_change(busy) is None  # the next tick, with no send meanwhile
        assert busy.progress_nudged
        await hub.close()

    run_with_log(scenario)
