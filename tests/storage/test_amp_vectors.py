"""A new cell's vector stored at its create (amp_vector_new.lua): stored, and taken off the
embedder loop's list, only while the cell is still the version embedded; the reply carries the
vectors of the owner's other cells of the same model and size, and no one else's, each with
whether the creating agent may see it listed (active or stale, not expired, readable by the
agent) by its index record, only where vector, record and entry are of one version."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from broker.storage import Storage, layout
from broker.storage.amp_vectors import CellVectorStore, VectorWrite

OWNER = "cells/user/ana/"
NOW = 1_800_000_000_000
AGENT = "y1"


def vector(*values: float) -> bytes:
    return np.array(values, dtype=np.float32).tobytes()


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_a_new_cells_vector_is_stored_with_its_owners_others(backend: str, redis_url: str,
                                                             ns: str) -> None:
    async def main() -> None:
        storage = Storage.open(redis_url if backend == "redis" else None, timeout=2.0,
                               history_limit=4, changelog_maxlen=1000,
                               idempotency_window_ms=1000)
        redis = storage.backend.redis
        store = CellVectorStore(storage.backend, ns)
        cells = {"A": OWNER, "B": OWNER, "C": OWNER, "D": OWNER, "E": "cells/user/bob/"}
        try:
            for cell_id, prefix in cells.items():
                await redis.hset(layout.entry(ns, prefix + cell_id), "ver", "1")
                await redis.zadd(layout.index(ns), {prefix + cell_id: 0})
            stored = {"B": ("m", vector(0, 1, 0, 0)), "C": ("other", vector(1, 0, 0, 0)),
                      "D": ("m", vector(1, 0)), "E": ("m", vector(1, 0, 0, 0))}
            for cell_id, (model, vec) in stored.items():
                await redis.hset(layout.amp_vector(ns, cell_id),
                                 mapping={"model": model, "digest": f"d{cell_id}", "vec": vec})
            await redis.sadd(layout.amp_unembedded(ns), "A", "B")
            # B's record and vector are of its entry's version: its record is current.
            await redis.hset(layout.amp_vector(ns, "B"), "ver", "1")
            await redis.hset(layout.amp_cell(ns, "B"), mapping={
                "ver": "1", "status": "stale", "expires": "", "readers": "x y*"})

            mine = vector(1, 0, 0, 0)
            found = await store.save_new(VectorWrite("A", OWNER + "A", 1, "m", 4, "dA", mine),
                                         OWNER, 500, NOW, AGENT)
            # Only B: C is another model's, D another size, E another owner's.
            assert (found.stored, found.ids, found.digests) == (True, ["B"], ["dB"])
            assert found.vectors == vector(0, 1, 0, 0)
            assert found.listable == [True]
            assert await redis.hgetall(layout.amp_vector(ns, "A")) == {
                b"model": b"m", b"dims": b"4", b"digest": b"dA", b"vec": mine, b"ver": b"1"}
            assert await redis.smembers(layout.amp_unembedded(ns)) == {b"B"}
            # Without the vectors (the caller has them in its index): the same cells.
            light = await store.save_new(VectorWrite("A", OWNER + "A", 1, "m", 4, "dA", mine),
                                         OWNER, 500, NOW, AGENT, send=False)
            assert (light.ids, light.digests, light.vectors, light.listable) == (
                ["B"], ["dB"], b"", [True])

            async def listable(agent: str = AGENT) -> list[bool | None]:
                return (await store.save_new(
                    VectorWrite("A", OWNER + "A", 1, "m", 4, "dA", mine), OWNER, 500, NOW,
                    agent)).listable

            # Not for an agent none of its readers' globs matches, nor once it is archived or
            # past its expiry; again when it expires later.
            assert await listable("z") == [False]
            await redis.hset(layout.amp_cell(ns, "B"), "status", "archived")
            assert await listable() == [False]
            await redis.hset(layout.amp_cell(ns, "B"), mapping={"status": "active",
                                                                  "expires": str(NOW)})
            assert await listable() == [False]
            # Only the first `limit` keys of the owner are looked at (A itself is the first).
            assert (await store.save_new(VectorWrite("A", OWNER + "A", 1, "m", 4, "dA", mine),
                                         OWNER, 1, NOW, AGENT)).ids == []
            await redis.hset(layout.amp_cell(ns, "B"), "expires", str(NOW + 1))
            assert await listable() == [True]
            # An entry past its vector's version, or expired, leaves it unknown.
            await redis.hset(layout.entry(ns, OWNER + "B"), "exp", str(NOW))
            assert await listable() == [None]
            await redis.hset(layout.entry(ns, OWNER + "B"), mapping={"exp": "", "ver": "2"})
            assert await listable() == [None]

            # A cell written since it was embedded keeps its place on the loop's list.
            await redis.hset(layout.entry(ns, OWNER + "C"), "ver", "2")
            await redis.sadd(layout.amp_unembedded(ns), "C")
            late = await store.save_new(VectorWrite("C", OWNER + "C", 1, "m", 4, "dC", mine),
                                        OWNER, 500, NOW, AGENT)
            assert not late.stored and sorted(late.ids) == ["A", "B"]
            assert await redis.hget(layout.amp_vector(ns, "C"), "model") == b"other"
            assert await redis.sismember(layout.amp_unembedded(ns), "C")
        finally:
            await redis.delete(layout.index(ns), layout.amp_unembedded(ns),
                               layout.amp_cell(ns, "B"),
                               *(layout.entry(ns, p + i) for i, p in cells.items()),
                               *(layout.amp_vector(ns, i) for i in cells))
            await storage.close()

    asyncio.run(main())
