"""Keeps this process's in-memory index of the cells' vectors (broker/amp/vector_index.py) in
step with Redis: at start it reads every vector of the configured model, in batches, in the
background; then it follows the vector log (each stored or removed vector is recorded there),
reading the current vector of each cell named, so that a vector stored by any process is here
within about a second; every 10 minutes it reads every vector again, into a new index swapped
in when done. Until the first reading is done, `nearest` answers None and search ranks without
it (broker/amp/search.py); when the log was trimmed past what it read, it reads everything
again. An index hit is only a candidate: search checks the cell and its stored vector before
ranking it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from broker.amp.embedders import Vectors
from broker.amp.vector_index import VectorIndex
from broker.runtime.metrics import Metrics
from broker.storage.amp_vectors import CellVectorStore, StoredVector

log = logging.getLogger("memp.amp.nearest")
_READ_BATCH = 1000  # vectors read per round trip when (re)building
_FOLLOW_BATCH = 1000  # log records read at once
_WAIT_MS = 1000  # how long one read of the log waits for a record
# After a read that found records, the next waits this long (s), so that records written
# meanwhile are read and their vectors loaded together: a process following creates one by
# one would otherwise spend three round trips per create (bench/README.md, "Near-duplicate
# threshold").
FOLLOW_GAP = 0.1
REREAD_SECONDS = 600.0


class NearestCells:
    """The vectors of `model` of the AMP namespace's cells, in memory, kept in step."""

    def __init__(self, vectors: CellVectorStore, model: str,
                 metrics: Metrics | None = None) -> None:
        self.vectors = vectors
        self.model = model
        self.metrics = metrics
        self.index: VectorIndex | None = None  # None until read in full
        self._position: str | None = None  # the vector log's, once read in full

    @property
    def ready(self) -> bool:
        return self.index is not None

    def nearest(self, query: Vectors, limit: int) -> list[tuple[str, float]] | None:
        """Up to `limit` cells by falling cosine to `query`; None while not ready."""
        if self.index is None:
            return None
        return self.index.nearest(query, limit)

    def rows(self, model: str, cell_ids: Sequence[str], digests: Sequence[str]
             ) -> tuple[Vectors, list[int]] | None:
        """`VectorIndex.rows` of the cells named, when the index is ready and of `model`;
        else None."""
        if self.index is None or model != self.model or not self.index.dims:
            return None
        return self.index.rows(cell_ids, digests)

    def add_new(self, cell_id: str, vector: bytes, digest: str) -> None:
        """Put the vector this process just stored for a new cell, when the index is ready and
        does not hold the cell yet (what the log brings is never overwritten), so that this
        process scores its own recent cells without waiting for the log."""
        index = self.index
        if index is None or cell_id in index:
            return
        if not index.dims:
            index = self.index = VectorIndex(len(vector) // 4)
        if index.put(cell_id, vector, digest):
            self._count()

    async def run_forever(self) -> None:
        """Read every vector (unless following the log from a position still kept), then
        follow the log, and read every vector again each REREAD_SECONDS (what a lost record
        or a read racing a purge could leave out is then back). A store failure ends the run;
        the supervisor starts it again, and it goes on from where it was when the log still
        holds that."""
        loop = asyncio.get_running_loop()
        read_at = loop.time()
        while True:
            if self._position is None or loop.time() - read_at >= REREAD_SECONDS:
                await self.rebuild()
                read_at = loop.time()
            assert self._position is not None
            changed = await self.vectors.changed(self._position, _FOLLOW_BATCH, _WAIT_MS)
            if changed is None:
                log.warning("AMP vector index: the vector log was trimmed past this process's "
                            "position; reading every vector again")
                self._position = None
                continue
            ids, self._position = changed
            if ids and self.index is not None:
                self._apply(self.index, await self.vectors.load(sorted(set(ids))), ids)
                self._count()
            if ids:
                await asyncio.sleep(FOLLOW_GAP)

    async def rebuild(self) -> int:
        """Read every cell's vector into a new index, then use it; how many it holds. The log
        position is taken first, so that what changes meanwhile is read after."""
        position = await self.vectors.log_position()
        index: VectorIndex | None = None
        offset = 0
        while True:
            ids = await self.vectors.ids(offset, _READ_BATCH)
            if ids:
                stored = await self.vectors.load(ids)
                if index is None:
                    index = self._new_index(stored)
                if index is not None:
                    self._apply(index, stored, ids)
            offset += len(ids)
            if len(ids) < _READ_BATCH:
                break
        self.index = index if index is not None else VectorIndex(0)
        self._position = position
        log.info("AMP vector index: %d vectors of %s read from %d cells", len(self.index),
                 self.model, offset)
        self._count()
        return len(self.index)

    def _count(self) -> None:
        if self.metrics is not None and self.index is not None:
            self.metrics.amp_vector_index.set(len(self.index))

    def _new_index(self, stored: dict[str, StoredVector]) -> VectorIndex | None:
        """An index of the dimensions of the first vector of the model (None: none yet)."""
        for found in stored.values():
            if found.model == self.model:
                return VectorIndex(len(found.vector) // 4)
        return None

    def _apply(self, index: VectorIndex, stored: dict[str, StoredVector],
               ids: list[str]) -> None:
        """Bring the cells named into line with their stored vectors: those of the model are
        put, the others (none, another model's) removed."""
        if not index.dims and stored:
            fresh = self._new_index(stored)
            if fresh is not None:
                self.index = index = fresh
        for cell_id in ids:
            found = stored.get(cell_id)
            if found is None or found.model != self.model or \
                    not index.put(cell_id, found.vector, found.digest):
                index.remove(cell_id)
