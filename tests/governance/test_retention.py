"""broker/storage/proposals.py's retention on both stores: closed proposals past the retention
dropped and uncounted once however many sweepers run at once, and proposals of an earlier
release (no `size`, closed ones not indexed) adopted once, so that they count and expire."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from broker.storage import layout
from tests.support.brokers import open_storage

T0 = 1_700_000_000_000


def number(raw: Any) -> int:
    """A hash field's integer (0 when absent)."""
    return int(raw or 0)


async def put_record(redis: Any, ns: str, pid: str, status: str, closed_at: int | None,
                     *, sized: bool = True) -> int:
    """A proposal record as the scripts leave it (`sized`) or as an earlier release did."""
    doc = json.dumps({"id": pid, "status": status, "value": "v" * 50,
                      "decided_at": closed_at}).encode()
    fields: dict[str, Any] = {"status": status, "doc": doc, "by": "agent"}
    if not sized or status == "pending":
        fields["req"] = b'{"value": "' + b"v" * 50 + b'"}'
    size = len(doc) + len(fields.get("req", b""))
    if sized:
        fields["size"] = size
        await redis.hincrby(layout.usage(ns), "pbytes", size)
        if closed_at is not None:
            await redis.zadd(layout.closed_proposals(ns), {pid: closed_at})
    await redis.hset(layout.proposal(ns, pid), mapping=fields)
    await redis.zadd(layout.proposals(ns), {pid: T0})
    if status == "pending":
        await redis.zadd(layout.pending_proposals(ns), {pid: T0 + 10**9})
    return size


def test_concurrent_purges_drop_and_uncount_each_proposal_once(store_url: str | None,
                                                                 ns: str) -> None:
    async def main() -> None:
        async with open_storage(store_url) as storage:
            redis = storage.proposals.redis
            due = [f"prop_due{i:04d}" for i in range(300)]
            for pid in due:
                await put_record(redis, ns, pid, "rejected", T0)
            kept = [await put_record(redis, ns, "prop_late", "approved", T0 + 5000),
                    await put_record(redis, ns, "prop_open", "pending", None)]

            async def sweep() -> int:
                dropped = 0
                while (count := await storage.proposals.purge_closed(ns, T0 + 1000, 40)) == 40:
                    dropped += count
                return dropped + count

            assert sum(await asyncio.gather(*(sweep() for _ in range(6)))) == len(due)
            assert number(await redis.hget(layout.usage(ns), "pbytes")) == sum(kept)
            assert await redis.zrange(layout.closed_proposals(ns), 0, -1) == [b"prop_late"]
            assert sorted(await redis.zrange(layout.proposals(ns), 0, -1)) == [
                b"prop_late", b"prop_open"]
            assert not any([await redis.exists(layout.proposal(ns, pid)) for pid in due])

    asyncio.run(main())


def test_proposals_of_an_earlier_release_are_adopted_once(store_url: str | None,
                                                          ns: str) -> None:
    async def main() -> None:
        async with open_storage(store_url) as storage:
            redis = storage.proposals.redis
            await redis.hset(layout.usage(ns), mapping={"bytes": 0, "counted": 1})
            for i in range(40):
                await put_record(redis, ns, f"prop_old{i:03d}", "rejected", T0 + i,
                                 sized=False)
            await put_record(redis, ns, "prop_oldpending", "pending", None, sized=False)
            new = await put_record(redis, ns, "prop_new", "rejected", T0 + 99)
            seen = await asyncio.gather(*(storage.proposals.adopt(ns, T0 + 500, count=7)
                                          for _ in range(3)))
            assert seen == [42, 42, 42]
            sizes = []
            for i in range(40):
                record = layout.proposal(ns, f"prop_old{i:03d}")
                assert not await redis.hexists(record, "req")  # closed: its write is dropped
                assert number(await redis.hget(record, "size")) == await redis.hstrlen(record,
                                                                                   "doc")
                assert await redis.zscore(layout.closed_proposals(ns), f"prop_old{i:03d}") \
                    == T0 + i
                sizes.append(await redis.hstrlen(record, "doc"))
            pending = layout.proposal(ns, "prop_oldpending")
            sizes.append(number(await redis.hget(pending, "size")))
            assert sizes[-1] == await redis.hstrlen(pending, "doc") + await redis.hstrlen(
                pending, "req")
            counted = number(await redis.hget(layout.usage(ns), "pbytes"))
            assert counted == sum(sizes) + new
            await redis.delete(layout.usage(ns))
            used = await storage.fair_share.usage(ns, T0)
            assert used.proposal_bytes == counted  # a recount agrees
            assert await storage.proposals.purge_closed(ns, T0 + 1000, 100) == 41

    asyncio.run(main())
