"""Posts cells' changed search terms to the term sets in the background (amp_post.lua), in
batches, on every broker process. A write only records its cell's new terms and marks the cell
unposted, which keeps creates and patches short; search finds unposted cells by itself."""

from __future__ import annotations

import asyncio

from broker.storage.amp import CellIndexStore


class TermPoster:
    def __init__(self, index: CellIndexStore, batch: int = 100) -> None:
        self.index = index
        self.batch = batch

    async def run_forever(self, interval: float) -> None:
        """Post a batch; wait `interval` when there was less than a batch to post. A failure
        ends the run (the supervisor restarts it)."""
        while True:
            taken = await self.index.post(self.batch)
            if taken < self.batch:
                await asyncio.sleep(interval)
