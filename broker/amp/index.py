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
RECORD_FIELDS = ("key", "status", "ref", "count", "accessed")


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
        return cls.from_values(cell_id, [raw.get(f.encode()) for f in RECORD_FIELDS])

    @classmethod
    def from_values(cls, cell_id: str, values: list[bytes | None]) -> CellRecord:
        """From the values of RECORD_FIELDS, in that order (an HMGET reply)."""
        key, status, ref, count, accessed = values
        if key is None or status is None or ref is None:
            raise ValueError(f"incomplete index record for cell {cell_id}")
        return cls(cell_id, key.decode(), status.decode(), int(ref), int(count or 0),
                   int(accessed) if accessed else None)


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
                pipe.hmget(layout.amp_cell(self.namespace, cell_id), RECORD_FIELDS)
            rows = await pipe.execute()
        # A record without its key is absent (HMGET answers nils for a missing hash).
        return {i: CellRecord.from_values(i, r) for i, r in zip(ids, rows, strict=True)
                if r[0] is not None}

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
        self.schedule_many(pipe, [(cell, ref)])

    def schedule_many(self, pipe: Any, cells: list[tuple[MemoryCell, int]]) -> None:
        """`schedule` for several cells (each with its decay reference time), with one command
        per set rather than per cell: every set loses the cells, then gains those due in it."""
        if not cells:
            return
        ids = [cell.id for cell, _ in cells]
        due: dict[str, dict[str, int]] = {t: {} for t in ("stale", "archive", "expire", "purge")}
        for transition in due:
            pipe.zrem(self._due(transition), *ids)
        pipe.srem(layout.amp_recover(self.namespace), *ids)
        for cell, ref in cells:
            status = cell.lifecycle.status
            scoring = cell.scoring
            if status == "active":
                at = stale_at(scoring.importance, scoring.confidence, scoring.decay_rate, ref)
                if math.isfinite(at):
                    due["stale"][cell.id] = int(at)
            if status == "stale":
                since = _ms(cell.lifecycle.stale_since, "lifecycle.stale_since") or ref
                due["archive"][cell.id] = max(since, ref) + ARCHIVE_AFTER_MS
            if status in ("active", "stale"):
                expires = _ms(cell.lifecycle.expires_at, "lifecycle.expires_at")
                if expires is not None:
                    due["expire"][cell.id] = expires
            if status == "deleted":
                deleted = _ms(cell.lifecycle.deleted_at, "lifecycle.deleted_at") or ref
                due["purge"][cell.id] = deleted + PURGE_AFTER_MS
        for transition, members in due.items():
            if members:
                pipe.zadd(self._due(transition), members)

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
