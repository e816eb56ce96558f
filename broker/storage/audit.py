"""The per-namespace audit log: an append-only Redis stream of hash-chained records
(docs/governance.md). Entry writes append theirs inside their own script (`audit.lua`, called
from `commit`); everything else appends through `append`. Reads walk the stream either way."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from broker.storage import layout, scripts
from broker.storage.client import Backend
from broker.storage.entries import TRIM
from broker.storage.records import CorruptRecord
from broker.storage.scripts import Fields

AUDIT_KEYS = Fields("audit_keys", ("audit", "meta"))
AUDIT_ADD = Fields("audit_add", (), rest="pairs")


@dataclass(frozen=True, slots=True)
class StoredAudit:
    """One record as stored: its stream id, the exact JSON that was hashed, and its hash."""

    position: str
    body: bytes
    hash: str

    @property
    def intact(self) -> bool:
        return hashlib.sha1(self.body).hexdigest() == self.hash


@dataclass(frozen=True, slots=True)
class ChainState:
    """Where the chain starts (after records dropped by retention) and where it ends."""

    anchor: str  # hash of the newest record dropped by retention ("" for none)
    anchor_seq: int
    head: str  # hash of the newest record
    seq: int  # its sequence number
    last_position: str | None  # stream id of the newest record still stored


def _stored(raw: Any) -> StoredAudit:
    position, fields = raw
    body, digest = fields.get(b"r"), fields.get(b"h")
    where = f"audit record {position.decode()}"
    if body is None or digest is None:
        raise CorruptRecord(f"{where}: fields r and h are required")
    return StoredAudit(position.decode(), body, digest.decode())


class AuditStore:
    """Appends, reads, trims and describes the audit logs of every namespace."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.redis = client = backend.redis
        self._add = scripts.register(client, ["sha1.lua", "audit.lua", "audit_add.lua"],
                                     [AUDIT_KEYS, AUDIT_ADD])
        self._trim = scripts.register(client, ["stream.lua", "audit_trim.lua"], [AUDIT_KEYS, TRIM])
        self._chain = scripts.register(client, ["audit_chain.lua"], [AUDIT_KEYS])

    @staticmethod
    def _keys(namespace: str) -> list[Any]:
        return AUDIT_KEYS.pack(audit=layout.audit(namespace), meta=layout.meta(namespace))

    async def append(self, namespace: str, record: dict[str, str]) -> str:
        """Append one record (string fields); returns its hash."""
        pairs = [item for name, value in record.items() for item in (name, value)]
        digest = await self.backend.call(self._add, self._keys(namespace),
                                         AUDIT_ADD.pack(pairs=pairs), durable=True)
        return digest.decode() if isinstance(digest, bytes) else str(digest)

    async def newest_first(self, namespace: str, upto: str, downto: str, count: int
                           ) -> list[StoredAudit]:
        """Up to `count` records from `upto` back to `downto` (stream range bounds)."""
        rows: Any = await self.redis.xrevrange(layout.audit(namespace), upto, downto,
                                               count=count)
        return [_stored(r) for r in rows or []]

    async def oldest_first(self, namespace: str, start: str, end: str, count: int
                           ) -> list[StoredAudit]:
        rows: Any = await self.redis.xrange(layout.audit(namespace), start, end, count=count)
        return [_stored(r) for r in rows or []]

    async def chain(self, namespace: str) -> ChainState:
        """The chain's anchor and head with the newest record, read together."""
        raw = await self.backend.call(self._chain, self._keys(namespace), [])
        anchor, anchor_seq, head, seq, newest = (v.decode() if isinstance(v, bytes) else str(v)
                                                 for v in raw)
        return ChainState(anchor=anchor, anchor_seq=int(anchor_seq or 0), head=head,
                          seq=int(seq or 0), last_position=newest or None)

    async def trim(self, namespace: str, before_ms: int, batch: int) -> int:
        """Drop up to `batch` records appended before `before_ms` (retention)."""
        args = TRIM.pack(upto=max(before_ms - 1, 0), count=batch)
        return int(await self.backend.call(self._trim, self._keys(namespace), args))
