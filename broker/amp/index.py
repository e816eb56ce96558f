"""The AMP bridge's indexes beside the cells' MEMP entries: per-cell records, due-time sets for
the lifecycle engine, creation order and the term index for search."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from broker import layout
from broker.amp.cells import MemoryCell, parse_time
from broker.amp.rules import ARCHIVE_AFTER_MS, PURGE_AFTER_MS, readers, stale_at
from broker.store import RawHash, ScriptCall, Store, WriteRequest

_TERM_RE = re.compile(r"[a-z0-9]+")
MAX_TERMS = 200
RECORD_FIELDS = ("key", "status", "ref", "count", "accessed")
COMMIT_CHUNK = 50  # changes per amp_commit.lua call: a few milliseconds of Redis at most


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


TRANSITIONS = ("stale", "archive", "expire", "purge")


def due_times(cell: MemoryCell, ref: int) -> dict[str, int]:
    """When the lifecycle engine should next look at the cell, per transition, given its decay
    reference time; a time is the earliest the transition can apply (a later read or update
    only moves it on, and the engine checks again before acting)."""
    life = cell.lifecycle
    status = life.status
    due: dict[str, int] = {}
    if status == "active":
        scoring = cell.scoring
        at = stale_at(scoring.importance, scoring.confidence, scoring.decay_rate, ref)
        if math.isfinite(at):
            due["stale"] = int(at)
    if status == "stale":
        since = _ms(life.stale_since, "lifecycle.stale_since") or ref
        due["archive"] = max(since, ref) + ARCHIVE_AFTER_MS
    if status in ("active", "stale"):
        expires = _ms(life.expires_at, "lifecycle.expires_at")
        if expires is not None:
            due["expire"] = expires
    if status == "deleted":
        due["purge"] = (_ms(life.deleted_at, "lifecycle.deleted_at") or ref) + PURGE_AFTER_MS
    return due


@dataclass(slots=True)
class IndexUpdate:
    """What one cell's write (or the engine's look at it) changes in the indexes."""

    cell: MemoryCell
    key: str
    ref: int  # the decay reference time the writer saw
    # The entry version the update describes; it applies only while the entry still holds
    # it. A write committed with the update fills it in.
    version: int | None = None
    count: int | None = None  # the access count to set (create, import)
    created: bool = True  # False when the cell is known to the creation-order index
    terms: bool = True  # False when the text and its searchability cannot have changed
    recheck: bool = False  # a stale cell the engine must look at again

    def args(self) -> list[Any]:
        """This update's part of amp_commit.lua's arguments (see amp_index.lua)."""
        cell, life = self.cell, self.cell.lifecycle
        accessed = _ms(life.last_accessed_at, "lifecycle.last_accessed_at")
        created = (_ms(life.created_at, "lifecycle.created_at") or self.ref) if self.created \
            else ""
        due = due_times(cell, self.ref)
        recheck = "1" if self.recheck else ("" if life.status == "stale" else "0")
        terms: list[str] = []
        if self.terms and life.status in ("active", "stale", "archived"):
            terms = sorted(terms_of(cell.content.text))
        expires = _ms(life.expires_at, "lifecycle.expires_at")
        return [cell.id, self.key, "" if self.version is None else self.version, life.status,
                self.ref,
                "" if self.count is None else self.count,
                "" if accessed is None else accessed, created,
                *(due.get(t, "") for t in TRANSITIONS), recheck, " ".join(readers(cell)),
                "" if expires is None else expires, len(terms) if self.terms else -1, *terms]


def _loaded(cell_id: str, row: list[Any]) -> tuple[CellRecord, RawHash]:
    """A record and its entry's fields from a row of amp_load.lua or amp_read.lua."""
    raw = row[len(RECORD_FIELDS)]
    return (CellRecord.from_values(cell_id, row[:len(RECORD_FIELDS)]),
            dict(zip(raw[::2], raw[1::2], strict=True)))


class CellIndex:
    """Reads and writes the AMP indexes of one namespace."""

    def __init__(self, store: Store, namespace: str) -> None:
        self.store = store
        self.redis = store.redis
        self.namespace = namespace
        self._load = store.script("amp_load.lua")
        self._read = store.script("amp_common.lua", "amp_read.lua")
        self._touch = store.script("amp_common.lua", "amp_touch.lua")
        self._commit = store.script("common.lua", "put_entry.lua", "amp_index.lua",
                                    "amp_commit.lua")
        self._post = store.script("amp_post.lua")
        self._match = store.script("amp_match.lua")
        self._frequency = store.script("amp_frequency.lua")
        ns = namespace
        self._commit_keys = [layout.amp_created(ns), *map(self._due, TRANSITIONS),
                             layout.amp_recover(ns), layout.amp_unposted(ns), layout.index(ns),
                             layout.expiries(ns), layout.changelog(ns), layout.meta(ns)]
        self._commit_prefixes = [layout.entry_prefix(ns), layout.amp_cell(ns, ""),
                                 layout.amp_term(ns, "")]

    def _due(self, transition: str) -> str:
        return layout.amp_due(self.namespace, transition)

    async def load(self, cell_ids: Iterable[str]) -> dict[str, tuple[CellRecord, RawHash]]:
        """The cells' index records with their MEMP entries' raw fields, read together in one
        call; cells without a record are left out."""
        ids = list(cell_ids)
        if not ids:
            return {}
        rows = await self._load(
            keys=[layout.amp_cell(self.namespace, i) for i in ids],
            args=[layout.entry_prefix(self.namespace), *RECORD_FIELDS])
        return {i: _loaded(i, row) for i, row in zip(ids, rows, strict=True) if row}

    async def read(self, cell_id: str, agent: str, now: int
                   ) -> tuple[CellRecord, RawHash, int] | None:
        """`load` of one cell that also counts the read when the cell's record lets `agent`
        read it; the count is the new access count, or -1 when the read was not counted."""
        row = await self._read(
            keys=[layout.amp_cell(self.namespace, cell_id), layout.amp_recover(self.namespace)],
            args=[layout.entry_prefix(self.namespace), cell_id, agent, now, *RECORD_FIELDS])
        if not row:
            return None
        return (*_loaded(cell_id, row), int(row[-1]))

    async def touch(self, reads: list[tuple[str, int]]) -> list[int]:
        """Count reads (cell id, time): each cell's new access count, -1 where it is gone."""
        keys = [layout.amp_recover(self.namespace)]
        args: list[Any] = []
        for cell_id, now in reads:
            keys.append(layout.amp_cell(self.namespace, cell_id))
            args += [cell_id, now]
        return [int(c) for c in await self._touch(keys=keys, args=args)]

    def commit_calls(self, changes: list[tuple[IndexUpdate, WriteRequest | None]]
                     ) -> list[ScriptCall]:
        """Script calls that make each change's write, if it has one, and then, if the write
        succeeded, its index update (amp_commit.lua), COMMIT_CHUNK changes per call so that no
        call holds Redis long. Each call's reply lists its writes' verdicts (b"ok", ...)."""
        ns = self.namespace
        calls: list[ScriptCall] = []
        for at in range(0, len(changes), COMMIT_CHUNK):
            keys: list[Any] = list(self._commit_keys)
            args: list[Any] = list(self._commit_prefixes)
            for update, request in changes[at:at + COMMIT_CHUNK]:
                if request is None:
                    args.append(0)
                else:
                    keys += [layout.entry(ns, update.key), layout.history(ns, update.key)]
                    write = self.store.put_args(ns, update.key, request)
                    args += [len(write), *write]
                args += update.args()
            calls.append((self._commit, keys, args))
        return calls

    async def due(self, transition: str, as_of: int, limit: int) -> list[str]:
        found = await self.redis.zrangebyscore(self._due(transition), "-inf", as_of, 0, limit)
        return [_text(i) for i in found]

    async def take_recovering(self, limit: int) -> list[str]:
        """Remove and return up to `limit` recheck marks."""
        found = await self.redis.spop(layout.amp_recover(self.namespace), limit)
        return [_text(i) for i in found or []]

    async def by_term(self, terms: Iterable[str]) -> set[str]:
        """The cells whose text has any of the terms, posted to the term sets or not yet."""
        words = list(terms)
        if not words:
            return set()
        found = await self._match(
            keys=[layout.amp_unposted(self.namespace),
                  *(layout.amp_term(self.namespace, t) for t in words)],
            args=[layout.amp_cell(self.namespace, ""), *words])
        return {_text(i) for i in found}

    async def frequencies(self, terms: list[str]) -> tuple[int, list[int]]:
        """How many cells there are, and how many have each term (posted or not yet)."""
        ns = self.namespace
        counts = await self._frequency(
            keys=[layout.amp_unposted(ns), layout.amp_created(ns),
                  *(layout.amp_term(ns, t) for t in terms)],
            args=[layout.amp_cell(ns, ""), *terms])
        return int(counts[0]), [int(c) for c in counts[1:]]

    async def post(self, limit: int) -> int:
        """Post the changed search terms of up to `limit` cells to the term sets (amp_post.lua);
        returns how many cells it took."""
        return int(await self._post(
            keys=[layout.amp_unposted(self.namespace)],
            args=[layout.amp_cell(self.namespace, ""), layout.amp_term(self.namespace, ""),
                  limit]))

    async def indexed_terms(self, cell_ids: list[str]) -> dict[str, set[str]]:
        """Every term a cell's record names, posted or to be posted (purge takes them out)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for cell_id in cell_ids:
                pipe.hmget(layout.amp_cell(self.namespace, cell_id), "terms", "posted")
            rows = await pipe.execute()
        return {cell_id: {w for value in row if value for w in _text(value).split()}
                for cell_id, row in zip(cell_ids, rows, strict=True)}

    async def created_between(self, start: int | None, end: int | None, offset: int,
                              limit: int) -> list[str]:
        """Ids by creation time, newest first, optionally bounded by time."""
        found = await self.redis.zrevrangebyscore(
            layout.amp_created(self.namespace), "+inf" if end is None else end,
            "-inf" if start is None else start, start=offset, num=limit)
        return [_text(i) for i in found]

    def forget(self, pipe: Any, cell_id: str, terms: set[str]) -> None:
        """Queue removal of every index entry of a cell (purge), `terms` being every term it
        may be posted under."""
        pipe.delete(layout.amp_cell(self.namespace, cell_id))
        pipe.zrem(layout.amp_created(self.namespace), cell_id)
        for transition in TRANSITIONS:
            pipe.zrem(self._due(transition), cell_id)
        pipe.srem(layout.amp_recover(self.namespace), cell_id)
        pipe.srem(layout.amp_unposted(self.namespace), cell_id)
        for term in terms:
            pipe.srem(layout.amp_term(self.namespace, term), cell_id)
