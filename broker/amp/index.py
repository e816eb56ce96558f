"""The AMP bridge's indexes beside the cells' MEMP entries: per-cell records, due-time sets for
the lifecycle engine, creation order and the term index for search."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis

from broker import layout
from broker.amp.cells import MemoryCell, parse_time
from broker.amp.rules import ARCHIVE_AFTER_MS, PURGE_AFTER_MS, stale_at

_TERM_RE = re.compile(r"[a-z0-9]+")
MAX_TERMS = 200


def words_of(text: str) -> list[str]:
    """Lowercase alphanumeric words of 2-40 characters, in order, repeats kept."""
    return [w for w in _TERM_RE.findall(text.lower()) if 2 <= len(w) <= 40]


def terms_of(text: str) -> set[str]:
    """The distinct words of a text (at most MAX_TERMS per cell)."""
    return set(sorted(set(words_of(text)))[:MAX_TERMS])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms(value: str | None, field: str) -> int | None:
    return parse_time(value, field) if value else None


@dataclass(slots=True)
class CellRecord:
    """What the indexes know about a cell without reading its entry."""

    id: str
    key: str
    status: str
    ref: int
    count: int
    accessed: int | None

    @classmethod
    def from_hash(cls, cell_id: str, raw: dict[bytes, bytes]) -> CellRecord:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(cell_id, fields["key"], fields["status"], int(fields["ref"]),
                   int(fields.get("count", "0")),
                   int(fields["accessed"]) if fields.get("accessed") else None)


def reference_ms(cell: MemoryCell) -> int:
    """The decay clock: the latest of created, updated and accessed."""
    life = cell.lifecycle
    times = [_ms(life.created_at, "lifecycle.created_at"),
             _ms(life.last_updated_at, "lifecycle.last_updated_at"),
             _ms(life.last_accessed_at, "lifecycle.last_accessed_at")]
    return max(t for t in times if t is not None) if any(times) else 0


class CellIndex:
    """Reads and writes the AMP indexes of one namespace."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.redis = client
        self.namespace = namespace

    def _due(self, transition: str) -> str:
        return layout.amp_due(self.namespace, transition)

    async def record(self, cell_id: str) -> CellRecord | None:
        raw = await self.redis.hgetall(layout.amp_cell(self.namespace, cell_id))
        return CellRecord.from_hash(cell_id, cast(dict[bytes, bytes], raw)) if raw else None

    async def records(self, cell_ids: Iterable[str]) -> dict[str, CellRecord]:
        ids = list(cell_ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for cell_id in ids:
                pipe.hgetall(layout.amp_cell(self.namespace, cell_id))
            rows = await pipe.execute()
        return {i: CellRecord.from_hash(i, r) for i, r in zip(ids, rows, strict=True) if r}

    def save(self, pipe: Any, cell: MemoryCell, key: str, old_text: str | None = None,
             count: int | None = None) -> None:
        """Queue the index updates that follow from the cell as it now is."""
        life = cell.lifecycle
        ref = reference_ms(cell)
        fields: dict[str, Any] = {"key": key, "status": life.status, "ref": ref}
        if count is not None:
            fields["count"] = count
        accessed = _ms(life.last_accessed_at, "lifecycle.last_accessed_at")
        if accessed is not None:
            fields["accessed"] = accessed
        pipe.hset(layout.amp_cell(self.namespace, cell.id), mapping=fields)
        created = _ms(life.created_at, "lifecycle.created_at") or ref
        pipe.zadd(layout.amp_created(self.namespace), {cell.id: created})
        self.schedule(pipe, cell, ref)
        if old_text is not None:
            for term in terms_of(old_text) - terms_of(cell.content.text):
                pipe.srem(layout.amp_term(self.namespace, term), cell.id)
        searchable = life.status in ("active", "stale", "archived")
        for term in terms_of(cell.content.text):
            if searchable:
                pipe.sadd(layout.amp_term(self.namespace, term), cell.id)
            else:
                pipe.srem(layout.amp_term(self.namespace, term), cell.id)

    def schedule(self, pipe: Any, cell: MemoryCell, ref: int) -> None:
        """Put the cell in exactly the due-time sets its status calls for."""
        status = cell.lifecycle.status
        for transition in ("stale", "archive", "expire", "purge"):
            pipe.zrem(self._due(transition), cell.id)
        pipe.srem(layout.amp_recover(self.namespace), cell.id)
        scoring = cell.scoring
        if status == "active":
            due = stale_at(scoring.importance, scoring.confidence, scoring.decay_rate, ref)
            if math.isfinite(due):
                pipe.zadd(self._due("stale"), {cell.id: int(due)})
        if status == "stale":
            since = _ms(cell.lifecycle.stale_since, "lifecycle.stale_since") or ref
            pipe.zadd(self._due("archive"), {cell.id: max(since, ref) + ARCHIVE_AFTER_MS})
        if status in ("active", "stale"):
            expires = _ms(cell.lifecycle.expires_at, "lifecycle.expires_at")
            if expires is not None:
                pipe.zadd(self._due("expire"), {cell.id: expires})
        if status == "deleted":
            deleted = _ms(cell.lifecycle.deleted_at, "lifecycle.deleted_at") or ref
            pipe.zadd(self._due("purge"), {cell.id: deleted + PURGE_AFTER_MS})

    def recheck(self, pipe: Any, cell_id: str) -> None:
        """A stale cell was read or patched: the engine's next run looks at it again."""
        pipe.sadd(layout.amp_recover(self.namespace), cell_id)

    async def due(self, transition: str, as_of: int, limit: int) -> list[str]:
        found = await self.redis.zrangebyscore(self._due(transition), "-inf", as_of, 0, limit)
        return [_text(i) for i in found]

    async def take_recovering(self, limit: int) -> list[str]:
        """Remove and return up to `limit` recheck marks."""
        found = await self.redis.spop(layout.amp_recover(self.namespace), limit)
        return [_text(i) for i in found or []]

    async def by_term(self, terms: Iterable[str]) -> set[str]:
        keys = [layout.amp_term(self.namespace, t) for t in terms]
        if not keys:
            return set()
        found = await self.redis.sunion(keys)
        return {_text(i) for i in found}

    async def created_between(self, start: int | None, end: int | None, offset: int,
                              limit: int) -> list[str]:
        """Ids by creation time, newest first, optionally bounded by time."""
        found = await self.redis.zrevrangebyscore(
            layout.amp_created(self.namespace), "+inf" if end is None else end,
            "-inf" if start is None else start, start=offset, num=limit)
        return [_text(i) for i in found]

    def forget(self, pipe: Any, cell_id: str, text: str) -> None:
        """Queue removal of every index entry of a cell (purge)."""
        pipe.delete(layout.amp_cell(self.namespace, cell_id))
        pipe.zrem(layout.amp_created(self.namespace), cell_id)
        for transition in ("stale", "archive", "expire", "purge"):
            pipe.zrem(self._due(transition), cell_id)
        pipe.srem(layout.amp_recover(self.namespace), cell_id)
        for term in terms_of(text):
            pipe.srem(layout.amp_term(self.namespace, term), cell_id)
