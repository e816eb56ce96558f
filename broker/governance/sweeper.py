"""Background job on every broker process: turns due TTL entries into `expire` changes and
drops change-log records older than the retention age.

Each entry is expired by one atomic script that re-checks it is still due, so processes that
sweep at the same time never expire (or announce) an entry twice. A namespace is looked at only
when its earliest expiry is due, when this process just wrote a TTL into it, or every
RECHECK_MS at the least (for TTLs other processes wrote), so idle namespaces cost nothing."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from broker.core.clock import Clock
from broker.storage.audit import AuditStore
from broker.storage.entries import EntryStore

if TYPE_CHECKING:
    from broker.governance.proposals import ProposalService

RECHECK_MS = 5_000


class ExpirySweeper:
    """Expires due entries of every namespace, `batch` per script call, until none are due."""

    def __init__(self, store: EntryStore, clock: Clock, interval: float, batch: int,
                 changelog_max_age_ms: int = 0, trim_every: float = 10.0) -> None:
        self.store = store
        self.clock = clock
        self.interval = interval
        self.batch = batch
        self.changelog_max_age_ms = changelog_max_age_ms
        self.trim_every = trim_every
        self._next_trim = 0.0
        self._next_look: dict[str, int] = {}
        self._next_listing = 0

    async def sweep_once(self) -> int:
        """Expire every due entry of the namespaces due a look; returns how many it expired."""
        expired = 0
        now = self.clock()
        if now >= self._next_listing:
            for namespace in await self.store.namespaces():
                self._next_look.setdefault(namespace, now)
            self._next_listing = now + RECHECK_MS
        for namespace, when in self.store.take_expiry_hints().items():
            self._next_look[namespace] = min(self._next_look.get(namespace, when), when)
        for namespace, when in list(self._next_look.items()):
            if when > now:
                continue
            while True:
                count = await self.store.expire_due(namespace, now, self.batch)
                expired += count
                if count < self.batch:
                    break
            earliest = await self.store.next_expiry(namespace)
            look = now + RECHECK_MS if earliest is None else min(earliest, now + RECHECK_MS)
            self._next_look[namespace] = look
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
        """Sweep every `interval` seconds; a failure ends the run (the supervisor restarts it)."""
        while True:
            await self.sweep_once()
            if time.monotonic() >= self._next_trim:
                await self.trim_once()
                self._next_trim = time.monotonic() + self.trim_every
            await asyncio.sleep(self.interval)


class GovernanceSweeper:
    """Closes pending proposals whose time is up; every `purge_every` seconds drops closed
    ones past the proposal retention and audit records past the audit retention (retentions
    are days: a second's precision would cost a script call per namespace per second). Each
    close and each drop is one script that re-checks what it acts on, so processes sweeping
    at once close or drop a proposal once. A namespace's proposals of
    earlier releases are adopted (counted, and set to expire) the first time this process
    drops closed ones there."""

    def __init__(self, entries: EntryStore, proposals: ProposalService, audit: AuditStore,
                 clock: Clock, audit_retention_ms: int, proposal_retention_ms: int,
                 batch: int = 1000, purge_every: float = 10.0) -> None:
        self.entries = entries
        self.proposals = proposals
        self.audit = audit
        self.clock = clock
        self.audit_retention_ms = audit_retention_ms
        self.proposal_retention_ms = proposal_retention_ms
        self.batch = batch
        self.purge_every = purge_every
        self._next_purge = 0.0
        self._adopted: set[str] = set()

    async def sweep_once(self) -> None:
        purge = time.monotonic() >= self._next_purge
        if purge:
            self._next_purge = time.monotonic() + self.purge_every
        for namespace in await self.entries.namespaces():
            await self.proposals.expire_due(namespace)
            if purge:
                await self._drop_closed(namespace)
            # A retention of days is kept to `purge_every` seconds (on by default: a
            # script call per namespace per second would cost more than it is worth); one
            # under a minute, to the sweep.
            if self.audit_retention_ms and (purge or self.audit_retention_ms < 60_000):
                before = self.clock() - self.audit_retention_ms
                while await self.audit.trim(namespace, before, self.batch) == self.batch:
                    pass

    async def _drop_closed(self, namespace: str) -> None:
        store = self.proposals.store
        if namespace not in self._adopted:
            await store.adopt(namespace, self.clock())
            self._adopted.add(namespace)
        before = self.clock() - self.proposal_retention_ms
        while await store.purge_closed(namespace, before, self.batch) == self.batch:
            pass
