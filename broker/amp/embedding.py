"""Keeps the cells' vectors in line with their text, in the background, on every broker
process: a write only marks its cell (amp_index.lua), and this loop takes marked cells in
batches, embeds their text and stores each vector only if the cell did not change meanwhile.
At start, and every `RECHECK_SECONDS`, it marks the cells without a vector of the configured
model, so a model switch or a lost batch is caught up. A write never waits for it. With no
embedder (`MEMP_EMBEDDER=none`) it only drops the vectors of changed cells, which no longer
describe their text, so that they are embedded again once an embedder is configured."""

from __future__ import annotations

import asyncio
import hashlib
import logging

from broker.amp.embedders import Embedder, EmbedderUnavailable
from broker.amp.poster import IDLE_SECONDS
from broker.amp.service import loaded_cell
from broker.core.clock import Clock
from broker.core.doorbell import Doorbell
from broker.runtime.metrics import Metrics
from broker.storage.amp import CellIndexStore
from broker.storage.amp_vectors import CellVectorStore, VectorWrite

log = logging.getLogger("memp.amp.embedding")
RECHECK_SECONDS = 600.0
_RECHECK_BATCH = 500
_FIRST_PAUSE, _LONGEST_PAUSE = 0.5, 5.0  # after a failure, doubled while it fails


def text_digest(text: str) -> str:
    """What a vector records of the text it was made from."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class CellEmbedding:
    """Embeds marked cells in batches; several processes share the marks (each batch is
    taken by one of them)."""

    def __init__(self, index: CellIndexStore, vectors: CellVectorStore, embedder: Embedder | None,
                 clock: Clock, metrics: Metrics | None = None, batch: int = 64) -> None:
        self.index = index
        self.vectors = vectors
        self.embedder = embedder
        self.clock = clock
        self.metrics = metrics
        self.batch = batch

    async def run_forever(self, interval: float) -> None:
        """Embed batches; after less than a batch, wait until this process writes a cell
        again (or IDLE_SECONDS pass), then `interval` more; longer while the embedder fails.
        A store failure ends the run (the supervisor restarts it)."""
        listener = self.index.marked.listen()
        try:
            await self._run(interval, listener)
        finally:
            self.index.marked.forget(listener)

    async def _run(self, interval: float, listener: asyncio.Event) -> None:
        pause: float | None = None
        rechecked = -RECHECK_SECONDS
        loop = asyncio.get_running_loop()
        while True:
            if self.embedder is not None and loop.time() - rechecked >= RECHECK_SECONDS:
                await self.recheck()
                rechecked = loop.time()
            try:
                taken = await self.embed_batch()
            except EmbedderUnavailable as exc:
                if pause is None:
                    log.warning("AMP embedder unavailable, cells wait for their vectors: %s",
                                exc)
                if self.metrics is not None:
                    self.metrics.amp_embed_failures.inc()
                pause = min(pause * 2, _LONGEST_PAUSE) if pause else _FIRST_PAUSE
                await asyncio.sleep(pause)
                continue
            if pause is not None:
                log.warning("AMP embedder available again")
                pause = None
            if taken < self.batch:
                await Doorbell.wait(listener, IDLE_SECONDS)
                await asyncio.sleep(interval)

    async def embed_batch(self) -> int:
        """Embed up to one batch of marked cells; how many were taken. When the embedder
        fails, the cells are marked again and EmbedderUnavailable raised."""
        ids = await self.vectors.take(self.batch)
        if not ids or self.embedder is None:
            await self.vectors.drop(ids)
            return len(ids)
        loaded = await self.index.load(ids)
        now = self.clock()
        gone: list[str] = []
        todo: list[tuple[str, str, int, str]] = []  # id, key, version, text
        for cell_id in ids:
            found = loaded.get(cell_id)
            cell = None if found is None or found[0].status == "deleted" else \
                loaded_cell(self.index.namespace, found[0], found[1], now)
            if found is None or cell is None:
                gone.append(cell_id)
            else:
                todo.append((cell_id, found[0].key, cell[0].version, cell[1].content.text))
        await self.vectors.drop(gone)
        if todo:
            embedder = self.embedder
            try:
                rows = await embedder.embed([text for *_, text in todo])
            except BaseException:
                await self.vectors.requeue([cell_id for cell_id, *_ in todo])
                raise
            model, dims = embedder.model, int(rows.shape[1])
            saved = await self.vectors.save([
                VectorWrite(cell_id, key, version, model, dims, text_digest(text),
                            row.tobytes())
                for (cell_id, key, version, text), row in zip(todo, rows, strict=True)])
            if self.metrics is not None:
                self.metrics.amp_embedded.inc(saved)
        return len(ids)

    async def recheck(self) -> int:
        """Mark every cell without a vector of the configured model; how many were."""
        if self.embedder is None:
            return 0
        marked, offset, model = 0, 0, self.embedder.model
        while True:
            found = await self.vectors.models(offset, _RECHECK_BATCH)
            missing = [cell_id for cell_id, made_by in found if made_by != model]
            await self.vectors.requeue(missing)
            marked += len(missing)
            offset += len(found)
            if len(found) < _RECHECK_BATCH:
                break
        if self.metrics is not None:
            self.metrics.amp_embed_backlog.set(marked)
        if marked:
            log.info("AMP embedding: %d of %d cells to embed with %s", marked, offset, model)
        return marked
