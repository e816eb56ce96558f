"""broker/storage/changelog.py on a real Redis: the check a reader makes after every read gives
the same answer through the auto-pipelining connection as through the client."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
import redis.asyncio as aioredis

from broker.storage import layout
from broker.storage.changelog import (
    LOST,
    REPLACED,
    TRIMMED,
    ChangeLogStore,
    Gap,
    record_check,
)
from broker.storage.pipe import AutoPipeline
from tests.support.brokers import RedisServer


@pytest.mark.parametrize("piped", [True, False], ids=["pipe", "client"])
def test_gap_knows_the_record_read_and_every_way_it_can_be_gone(
    private_redis: RedisServer, piped: bool
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(private_redis.url)
        pipe = AutoPipeline(private_redis.url, timeout=2) if piped else None
        store = ChangeLogStore(client, pipe)
        log = layout.changelog("ns")
        records = [{b"type": b"put", b"key": f"k{n}".encode()} for n in range(4)]
        ids = [cast(bytes, await client.xadd(log, cast(Any, r))).decode() for r in records]
        k0, k1, k2, k3 = (record_check(r) for r in records)
        try:
            assert await store.gap("ns", ids[1], k1) is None
            assert await store.gap("ns", ids[1]) is None
            # Another record under the id read (a replaced history): from the one before.
            other = record_check({b"type": b"put", b"key": b"other"})
            assert await store.gap("ns", ids[1], other) == Gap(REPLACED, ids[0], k0)
            await client.xdel(log, ids[2])
            assert await store.gap("ns", ids[2], k2) == Gap(REPLACED, ids[1], k1)
            # Retention dropped the two oldest (and noted the newest it dropped): a cursor
            # before that lost changes; one at it saw the last dropped and lost nothing.
            await client.xdel(log, ids[0], ids[1])
            await client.hset(layout.meta("ns"), "trimmed", ids[1])
            assert await store.gap("ns", ids[0], k0) == Gap(TRIMMED, "0-0")
            assert await store.gap("ns", ids[1], k1) is None
            assert await store.gap("ns", ids[3], k3) is None
            await client.delete(log, layout.meta("ns"))
            await client.xadd(log, {"type": "put", "key": "k0"})
            assert await store.gap("ns", ids[3], k3) == Gap(LOST, "0-0")
        finally:
            if pipe is not None:
                await pipe.close()
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
