"""Background job on every broker process: turns due TTL entries into `expire` changes and
drops change-log records older than the retention age.

Each entry is expired by one atomic script that re-checks it is still due, so processes that
sweep at the same time never expire (or announce) an entry twice."""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import RedisError

from broker.clock import Clock
from broker.store import Store

log = logging.getLogger("memp.sweeper")


class ExpirySweeper:
    """Expires due entries of every namespace, `batch` per script call, until none are due."""

    def __init__(self, store: Store, clock: Clock, interval: float, batch: int,
                 changelog_max_age_ms: int = 0, trim_every: float = 10.0) -> None:
        self.store = store
        self.clock = clock
        self.interval = interval
        self.batch = batch
        self.changelog_max_age_ms = changelog_max_age_ms
        self.trim_every = trim_every
        self._next_trim = 0.0

    async def sweep_once(self) -> int:
        """Expire every due entry; returns how many it expired."""
        expired = 0
        now = self.clock()
        for namespace in await self.store.namespaces():
            while True:
                count = await self.store.expire_due(namespace, now, self.batch)
                expired += count
                if count < self.batch:
                    break
        return expired

    async def trim_once(self) -> int:
        """Drop change-log records older than the retention age; returns how many."""
        if not self.changelog_max_age_ms:
            return 0
        dropped = 0
        before = self.clock() - self.changelog_max_age_ms
        for namespace in await self.store.namespaces():
            while True:
                count = await self.store.trim_changelog(namespace, before, self.batch)
                dropped += count
                if count < self.batch:
                    break
        return dropped

    async def run(self) -> None:
        delay = self.interval
        while True:
            try:
                await self.sweep_once()
                if time.monotonic() >= self._next_trim:
                    await self.trim_once()
                    self._next_trim = time.monotonic() + self.trim_every
                delay = self.interval
            except RedisError as exc:
                delay = min(max(delay * 2, self.interval), 5.0)
                log.warning("expiry sweep failed, retrying in %.1fs: %s", delay, exc)
            await asyncio.sleep(delay)
