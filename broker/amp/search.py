"""AMP search: candidates from indexes (owner prefix, term index, creation order), then filters,
relevance x decay ranking and pagination. Only cells the caller may read are returned."""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from broker import layout
from broker.amp.cells import MemoryCell, MemoryType, OwnerId, OwnerType, Status, iso, parse_time
from broker.amp.index import CellRecord, terms_of, words_of
from broker.amp.lifecycle import score_at
from broker.amp.rules import can_read
from broker.amp.service import CellService, decode_cell
from broker.errors import MempError
from broker.keys import compile_pattern

MAX_CANDIDATES = 5_000


class SearchBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /amp/memories/search`."""

    query: Annotated[str, Meta(max_length=1000)] | None = None
    owner_id: OwnerId | None = None
    owner_type: OwnerType | None = None
    types: list[MemoryType] | None = None
    status: list[Status] | None = None
    include_stale: bool = False
    metadata: dict[str, Any] = {}
    created_after: str | None = None
    created_before: str | None = None
    limit: Annotated[int, Meta(ge=1, le=100)] = 20
    cursor: str | None = None


class SearchHit(msgspec.Struct):
    cell: MemoryCell
    score: float
    decay_score: float


def _statuses(body: SearchBody) -> set[str]:
    if body.status is not None:
        if "deleted" in body.status:
            raise MempError("invalid_request", "deleted cells are never searchable",
                            {"field": "status"})
        return set(body.status)
    return {"active", "stale"} if body.include_stale else {"active"}


class CellSearch:
    """Runs searches for one acting agent."""

    def __init__(self, cells: CellService) -> None:
        self.cells = cells

    async def search(self, agent: str, body: SearchBody) -> dict[str, Any]:
        offset = _offset(body.cursor)
        statuses = _statuses(body)
        start = parse_time(body.created_after, "created_after") if body.created_after else None
        end = parse_time(body.created_before, "created_before") if body.created_before else None
        terms = terms_of(body.query) if body.query else set()
        if body.query is not None and not terms:
            raise MempError("invalid_request", "query has no searchable words", {"field": "query"})
        now = self.cells.clock()
        hits: list[SearchHit] = []
        candidates, exhaustive = await self._candidates(body, terms, start, end, offset)
        records = await self.cells.index.records(candidates)
        records = {i: r for i, r in records.items() if r.status in statuses}
        entries = await self.cells.store.get_many(self.cells.namespace,
                                                  [r.key for r in records.values()], now)
        by_key = {r.key: r for r in records.values()}
        idf = await self._idf(terms)
        for entry in entries:
            record = by_key[entry.key]
            cell = decode_cell(entry)
            if not self._keep(cell, record, body, agent, start, end, now):
                continue
            cell.scoring.access_count = record.count
            if record.accessed is not None:
                cell.lifecycle.last_accessed_at = iso(record.accessed)
            decay = score_at(cell, record, now)
            relevance = _relevance(cell.content.text, idf) if terms else 1.0
            if terms and relevance == 0:
                continue
            hits.append(SearchHit(cell, relevance * (0.2 + 0.8 * decay), decay))
        if exhaustive:
            hits.sort(key=lambda h: (-h.score, h.cell.id))
            page = hits[offset:offset + body.limit]
            more = len(hits) > offset + body.limit
            next_offset = offset + body.limit
        else:
            page = hits[:body.limit]
            more = len(candidates) == MAX_CANDIDATES
            next_offset = offset + len(candidates)
        return {"results": page, "next_cursor": str(next_offset) if more else None}

    async def _candidates(self, body: SearchBody, terms: set[str], start: int | None,
                          end: int | None, offset: int) -> tuple[list[str], bool]:
        """Candidate ids, and whether they are all matches (rank then page) or one slice of
        creation order (page by position)."""
        cells = self.cells
        owned: set[str] | None = None
        if body.owner_id is not None:
            owned = set()
            types = [body.owner_type] if body.owner_type else ["user", "agent", "organization"]
            for owner_type in types:
                pattern = compile_pattern(f"cells/{owner_type}/{body.owner_id}/*")
                keys, _ = await cells.store.scan_keys(cells.namespace, pattern, None,
                                                      MAX_CANDIDATES)
                owned.update(k.rsplit("/", 1)[1] for k in keys)
        if terms:
            found = await cells.index.by_term(terms)
            found = found & owned if owned is not None else found
            return sorted(found)[:MAX_CANDIDATES], True
        if owned is not None:
            return sorted(owned), True
        return await cells.index.created_between(start, end, offset, MAX_CANDIDATES), False

    async def _idf(self, terms: set[str]) -> dict[str, float]:
        if not terms:
            return {}
        redis = self.cells.store.redis
        ns = self.cells.namespace
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zcard(layout.amp_created(ns))
            for term in sorted(terms):
                pipe.scard(layout.amp_term(ns, term))
            total, *counts = await pipe.execute()
        return {t: math.log(1 + (total + 1) / (c + 0.5)) for t, c in
                zip(sorted(terms), counts, strict=True)}

    @staticmethod
    def _keep(cell: MemoryCell, record: CellRecord, body: SearchBody, agent: str,
              start: int | None, end: int | None, now: int) -> bool:
        if body.types is not None and cell.type not in body.types:
            return False
        if body.owner_type is not None and cell.identity.owner_type != body.owner_type:
            return False
        if body.owner_id is not None and cell.identity.owner_id != body.owner_id:
            return False
        expires = cell.lifecycle.expires_at
        if expires is not None and parse_time(expires, "expires_at") <= now:
            return False
        created = parse_time(cell.lifecycle.created_at or "1970-01-01T00:00:00Z", "created_at")
        if (start is not None and created < start) or (end is not None and created > end):
            return False
        metadata = cell.content.metadata
        if any(metadata.get(k, _ABSENT) != v for k, v in body.metadata.items()):
            return False
        return can_read(cell, agent)


_ABSENT = object()


def _relevance(text: str, idf: dict[str, float]) -> float:
    """BM25-style: saturating term frequency weighted by inverse document frequency."""
    words = Counter(words_of(text))
    return sum(idf[t] * words[t] / (words[t] + 1.2) for t in idf if words[t])


def _offset(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit() or len(cursor) > 9:
        raise MempError("invalid_request", "cursor is not one this broker issued",
                        {"field": "cursor"})
    return int(cursor)
