"""The AMP cells' vectors: one hash per cell beside its index record (model, dimensions, text
digest, float32 unit vector), the set of cells whose vector is not yet in line with their
text, and the capped log of cells whose vector was stored or removed, which every process
follows (broker/amp/nearest.py). What a vector is and which model made it are the bridge's
(broker/amp/embedding.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.storage import layout, scripts
from broker.storage.client import Backend, Redis, read_stream, stream_continues, text
from broker.storage.scripts import Fields

VECTOR_KEYS = Fields("vector_keys", ("entry", "vector", "unembedded", "log"))
VECTOR_SAVE = Fields("vector_save", ("id", "version", "model", "dims", "digest", "vector",
                                     "keep"))
NEW_VECTOR_KEYS = Fields("new_vector_keys", ("entry", "vector", "unembedded", "index", "log"))
NEW_VECTOR = Fields("new_vector", ("id", "version", "model", "dims", "digest", "vector",
                                   "vectors", "records", "entries", "owner", "limit", "now",
                                   "keep", "send", "agent"))
LOG_KEEP = 200_000  # records of the vector log kept (approximately): a follower that falls
# further behind than this (or starts) reads every vector again


def logged(namespace: str, cell_id: str) -> tuple[str, ...]:
    """The command that records in the vector log that `cell_id`'s vector changed."""
    return ("XADD", layout.amp_vector_log(namespace), "MAXLEN", "~", str(LOG_KEEP), "*",
            "id", cell_id)


@dataclass(frozen=True, slots=True)
class StoredVector:
    """A cell's vector as embedded: by which model, of which text (its digest)."""

    model: str
    digest: str
    vector: bytes


@dataclass(frozen=True, slots=True)
class VectorWrite:
    """A vector to store for a cell whose entry (at `key`) was at `version` when read."""

    id: str
    key: str
    version: int
    model: str
    dims: int
    digest: str
    vector: bytes


@dataclass(frozen=True, slots=True)
class Neighbours:
    """What storing a new cell's vector answered: whether it was stored, and the other cells
    of its owner with a vector of its model and size: their ids, text digests, vectors
    (float32 bytes, one after another, in the order of `ids`; empty when not asked for) and
    whether each may be listed among the creating agent's near duplicates by its index record
    (active or stale, not expired, readable by the agent); None where the record might not
    describe the text the vector was made from (the cell must be read)."""

    stored: bool
    ids: list[str]
    digests: list[str]
    vectors: bytes
    listable: list[bool | None]


_LISTABLE = {ord("1"): True, ord("0"): False, ord("?"): None}


class CellVectorStore:
    """The vectors of the AMP namespace's cells."""

    def __init__(self, backend: Backend, namespace: str, waiting: Redis | None = None) -> None:
        self.backend = backend
        self.redis = backend.redis
        self._reader = waiting or backend.redis  # the client of blocking reads of the log
        self.namespace = namespace
        self._save = scripts.register(self.redis, ["amp_vector.lua"], [VECTOR_KEYS, VECTOR_SAVE])
        self._save_new = scripts.register(self.redis, ["amp_common.lua", "amp_vector_new.lua"],
                                          [NEW_VECTOR_KEYS, NEW_VECTOR])
        self._load = scripts.register(self.redis, ["amp_vector_load.lua"], [])
        self._unembedded = layout.amp_unembedded(namespace)
        self._log = layout.amp_vector_log(namespace)

    @property
    def pipelined(self) -> bool:
        """Whether a cell's write and a call issued after it in the same turn of the event loop
        leave together, in that order: on the auto-pipelined connection to one server
        (`redis://`), when writes wait for no replicas (a write that waits goes in a pipeline
        of its own)."""
        return self.backend.pipe is not None and not self.backend.replicas

    async def take(self, limit: int) -> list[str]:
        """Remove and return up to `limit` cells waiting for their vector."""
        found = await self.redis.spop(self._unembedded, limit)
        return [text(i) for i in found or []]

    async def requeue(self, cell_ids: Sequence[str]) -> None:
        """Put cells (back) among those waiting for their vector."""
        if cell_ids:
            await self.redis.sadd(self._unembedded, *cell_ids)

    async def waiting(self) -> int:
        return int(await self.redis.scard(self._unembedded))

    async def save(self, writes: Sequence[VectorWrite]) -> int:
        """Store vectors, each only if its cell is unchanged since read; how many were."""
        ns = self.namespace
        calls = [(self._save,
                  VECTOR_KEYS.pack(entry=layout.entry(ns, w.key),
                                   vector=layout.amp_vector(ns, w.id),
                                   unembedded=self._unembedded, log=self._log),
                  VECTOR_SAVE.pack(id=w.id, version=w.version, model=w.model, dims=w.dims,
                                   digest=w.digest, vector=w.vector, keep=LOG_KEEP))
                 for w in writes]
        return sum(int(r) for r in await self.backend.run(calls)) if calls else 0

    async def save_new(self, write: VectorWrite, owner_prefix: str, limit: int, now: int,
                       agent: str, send: bool = True) -> Neighbours:
        """Store a new cell's vector (only while its entry is still at `write.version`; the
        embedder loop then skips it) and list the other cells among the first `limit` keys
        under `owner_prefix` with a vector of its model and size, whether `agent` may see
        each listed at `now`, and (`send`) their vectors, in one call."""
        ns = self.namespace
        reply = await self.backend.call(
            self._save_new,
            NEW_VECTOR_KEYS.pack(entry=layout.entry(ns, write.key),
                                 vector=layout.amp_vector(ns, write.id),
                                 unembedded=self._unembedded, index=layout.index(ns),
                                 log=self._log),
            NEW_VECTOR.pack(id=write.id, version=write.version, model=write.model,
                            dims=write.dims, digest=write.digest, vector=write.vector,
                            vectors=layout.amp_vector(ns, ""), records=layout.amp_cell(ns, ""),
                            entries=layout.entry_prefix(ns), owner=owner_prefix, limit=limit,
                            now=now, keep=LOG_KEEP, send="1" if send else "0", agent=agent))
        stored, ids, digests, vectors, listable = reply
        found = Neighbours(stored=int(stored) == 1, ids=ids.decode().split(),
                           digests=digests.decode().split(), vectors=vectors,
                           listable=[_LISTABLE[flag] for flag in listable])
        if not len(found.ids) == len(found.digests) == len(found.listable):
            raise ValueError("amp_vector_new.lua answered lists of different lengths")
        return found

    async def drop(self, cell_ids: Sequence[str]) -> None:
        """Remove the vectors of cells that are gone or deleted, and log that they changed."""
        if cell_ids:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(*(layout.amp_vector(self.namespace, i) for i in cell_ids))
                for cell_id in cell_ids:
                    pipe.execute_command(*logged(self.namespace, cell_id))
                await pipe.execute()

    async def load(self, cell_ids: Sequence[str]) -> dict[str, StoredVector]:
        """The stored vectors of the cells that have one (one script call: far less work
        for this process than a command per cell)."""
        if not cell_ids:
            return {}
        rows = await self.backend.call(
            self._load, [layout.amp_vector(self.namespace, i) for i in cell_ids], [])
        return {cell_id: StoredVector(text(model), text(digest), vec)
                for cell_id, (model, digest, vec) in zip(cell_ids, rows, strict=True)
                if model is not None and digest is not None and vec is not None}

    async def ids(self, offset: int, limit: int) -> list[str]:
        """Cells in creation order from `offset`, up to `limit`."""
        return [text(i) for i in await self.redis.zrange(layout.amp_created(self.namespace),
                                                         offset, offset + limit - 1)]

    async def models(self, offset: int, limit: int) -> list[tuple[str, str | None]]:
        """Cells in creation order from `offset` (up to `limit`) with the model of their
        vector (None: none stored)."""
        ids = await self.ids(offset, limit)
        async with self.redis.pipeline(transaction=False) as pipe:
            for cell_id in ids:
                pipe.hget(layout.amp_vector(self.namespace, cell_id), "model")
            rows = await pipe.execute()
        return [(i, text(m) if m is not None else None) for i, m in zip(ids, rows, strict=True)]

    async def log_position(self) -> str:
        """The newest record of the vector log, to follow it from there. An empty log gets a
        record naming no cell first, so that the position is one the log holds until trimmed
        (`changed` tells a trim by the oldest record kept being newer)."""
        last = await self.redis.xrevrange(self._log, "+", "-", count=1)
        if last:
            return text(last[0][0])
        return text(await self.redis.xadd(self._log, {"start": "1"}, maxlen=LOG_KEEP,
                                          approximate=True))

    async def changed(self, position: str, count: int, block_ms: int
                      ) -> tuple[list[str], str] | None:
        """The cells whose vector changed after `position` (waiting up to `block_ms` for the
        first), with the position reached; None when some may have been trimmed from the
        log (checked after the read, so that a trim during it is seen too)."""
        records = await read_stream(self._reader, self._log, position, count, block_ms)
        if not await stream_continues(self._reader, self._log, position):
            return None
        ids = [text(fields[b"id"]) for _, fields in records if b"id" in fields]
        return ids, text(records[-1][0]) if records else position
