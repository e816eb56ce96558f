"""Background job that turns due TTL entries into `expire` changes, on every broker process.

Each entry is expired by one atomic script that re-checks it is still due, so processes that
sweep at the same time never expire (or announce) an entry twice."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from broker.clock import Clock
from broker.store import Store

log = logging.getLogger("memp.sweeper")


class ExpirySweeper:
    """Expires due entries of every namespace, `batch` per script call, until none are due."""

    def __init__(self, store: Store, clock: Clock, interval: float, batch: int) -> None:
        self.store = store
        self.clock = clock
        self.interval = interval
        self.batch = batch

    async def sweep_once(self) -> int:
        expired = 0
        now = self.clock()
        for namespace in await self.store.namespaces():
            while True:
                count = await self.store.expire_due(namespace, now, self.batch)
                expired += count
                if count < self.batch:
                    break
        return expired

    async def run(self) -> None:
        delay = self.interval
        while True:
            try:
                await self.sweep_once()
                delay = self.interval
            except RedisError as exc:
                delay = min(max(delay * 2, self.interval), 5.0)
                log.warning("expiry sweep failed, retrying in %.1fs: %s", delay, exc)
            await asyncio.sleep(delay)
