"""Everything the broker keeps, and the only code that speaks Redis (or the embedded server).

One `Storage` per process holds a store per concern: entries, accounts (agents, API keys,
idempotency replies), namespace configuration, the change log, and the AMP indexes of the AMP
namespace. Services above pass domain values (namespaces, keys, message ids, versions) and
get records back; no module outside this package imports `redis` or names a Redis key
(tests/storage/test_scripts.py checks it). docs/design.md shows the layers."""

from __future__ import annotations

from collections.abc import AsyncIterator

from broker.storage import bulletins
from broker.storage.accounts import AccountStore
from broker.storage.amp import CellIndexStore
from broker.storage.amp_vectors import CellVectorStore
from broker.storage.audit import AuditStore
from broker.storage.changelog import ChangeLogStore
from broker.storage.client import Backend
from broker.storage.config import ConfigStore
from broker.storage.entries import EntryStore
from broker.storage.proposals import ProposalStore
from broker.storage.timing import CommandObserver, time_commands, time_pipe
from broker.storage.writes import RecordWriter


class Storage:
    """The stores of one backend, sharing its client; a second client of their own serves
    blocking change-log reads and pub/sub."""

    def __init__(self, backend: Backend, *, history_limit: int, changelog_maxlen: int,
                 idempotency_window_ms: int) -> None:
        self.backend = backend
        self.entries = EntryStore(backend, history_limit=history_limit,
                                  changelog_maxlen=changelog_maxlen,
                                  idempotency_window_ms=idempotency_window_ms)
        self.fair_share = self.entries.fair_share
        writer = RecordWriter(backend)
        self.accounts = AccountStore(backend, self.entries, idempotency_window_ms, writer)
        self.config = ConfigStore(writer)
        self.audit = AuditStore(backend)
        self.proposals = ProposalStore(backend, self.entries)
        self._waiting = backend.new_client()
        self.changes = ChangeLogStore(self._waiting, backend.pipe)

    @classmethod
    def open(cls, url: str | None, *, timeout: float, history_limit: int,
             changelog_maxlen: int, idempotency_window_ms: int, write_replicas: int = 0,
             write_replicas_timeout_ms: int = 1000) -> Storage:
        """Storage on Redis at `url` (one server, Sentinel or Cluster), or on a fresh
        embedded in-process server when None."""
        backend = Backend.open(url, timeout, replicas=write_replicas,
                               wait_ms=write_replicas_timeout_ms)
        return cls(backend, history_limit=history_limit, changelog_maxlen=changelog_maxlen,
                   idempotency_window_ms=idempotency_window_ms)

    def observe(self, observer: CommandObserver) -> None:
        """Report every command of the shared client (its time, or its failure)."""
        time_commands(self.backend.redis, observer)
        if self.backend.pipe is not None:
            time_pipe(self.backend.pipe, observer)

    @property
    def embedded(self) -> bool:
        return self.backend.embedded

    def cells(self, namespace: str) -> CellIndexStore:
        """The AMP records and indexes of `namespace`."""
        return CellIndexStore(self.backend, self.entries, namespace)

    def vectors(self, namespace: str) -> CellVectorStore:
        """The vectors of `namespace`'s AMP cells."""
        return CellVectorStore(self.backend, namespace, self._waiting)

    def bulletins(self, position: str | None, block_ms: int
                  ) -> AsyncIterator[bulletins.Bulletin]:
        """What other processes announce after `position` (see bulletins.listen)."""
        return bulletins.listen(self._waiting, position, block_ms)

    async def upgrade(self) -> None:
        """Bring data written by earlier releases to today's layout (safe to run from several
        processes at once)."""
        await self.accounts.upgrade()

    async def ping(self) -> bool:
        return await self.backend.ping()

    @property
    def follows_failovers(self) -> bool:
        """Whether `follow_failovers` has work to do (on Sentinel)."""
        return self.backend.follower is not None

    async def follow_failovers(self) -> None:
        """Move every connection to the primary the sentinels announce (a loop)."""
        await self.backend.follow_failovers()

    async def close(self) -> None:
        await self._waiting.aclose()
        await self.backend.close()
