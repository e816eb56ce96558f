"""Counting cell reads with group commit: reads that arrive while a count is being written
wait and are written together by the next call, so a busy broker makes one round trip for many
reads and a quiet one a round trip per read. Every read still waits until its count is stored."""

from __future__ import annotations

import asyncio

from broker.storage.amp import CellIndexStore

MAX_BATCH = 500  # reads per call


class AccessCounter:
    """Records reads of cells in one namespace's indexes."""

    def __init__(self, index: CellIndexStore) -> None:
        self.index = index
        self._pending: list[tuple[str, int, asyncio.Future[int]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def count(self, cell_id: str, now: int) -> int:
        """Record a read at `now`; returns the cell's new access count, or -1 when the cell
        was deleted or purged meanwhile."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.append((cell_id, now, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name="memp-amp-access")
        return await future

    async def _write(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                try:
                    counts = await self.index.touch([(i, now) for i, now, _ in batch])
                except Exception as exc:
                    for *_, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:
                    for *_, future in batch:
                        future.cancel()
                    raise
                for (*_, future), count in zip(batch, counts, strict=True):
                    if not future.done():
                        future.set_result(count)
        finally:
            self._writer = None
            for *_, future in self._pending:
                if not future.done():
                    future.cancel()
            self._pending.clear()
