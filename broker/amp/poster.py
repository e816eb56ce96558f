"""Posts cells' changed search terms to the term sets in the background (amp_post.lua), in
batches, on every broker process. A write only records its cell's new terms and marks the cell
unposted, which keeps creates and patches short; search finds unposted cells by itself.
Idle, it waits for this process's next write, or a second (docs/design.md)."""

from __future__ import annotations

import asyncio

from broker.core.doorbell import Doorbell
from broker.storage.amp import CellIndexStore

IDLE_SECONDS = 1.0  # the longest wait between looks: cells other processes marked


class TermPoster:
    def __init__(self, index: CellIndexStore, batch: int = 100) -> None:
        self.index = index
        self.batch = batch

    async def run_forever(self, interval: float) -> None:
        """Post a batch; after less than a batch, wait until this process writes a cell again
        (or IDLE_SECONDS pass), then `interval` more, so a burst's cells go in one batch. A
        failure ends the run (the supervisor restarts it)."""
        listener = self.index.marked.listen()
        try:
            while True:
                taken = await self.index.post(self.batch)
                if taken < self.batch:
                    await Doorbell.wait(listener, IDLE_SECONDS)
                    await asyncio.sleep(interval)
        finally:
            self.index.marked.forget(listener)
