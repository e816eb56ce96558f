"""AMP search: candidates from indexes (owner prefix, term index, creation order), then filters,
relevance x decay ranking and pagination. Relevance is by shared words (`keyword`), by meaning
(`semantic`) or both (`hybrid`, broker/amp/recall.py). Only cells the caller may read are
returned, and relevance weighs words by statistics of those cells alone (docs/security.md)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from broker.amp.cells import MemoryCell, MemoryType, OwnerId, OwnerType, Status, iso, parse_time
from broker.amp.embedders import EmbedderUnavailable, Vectors
from broker.amp.index import terms_of, words_of
from broker.amp.lifecycle import score_at
from broker.amp.recall import (
    STOP_WORDS,
    UNAVAILABLE,
    Recall,
    fused,
    unavailable,
    word_shares,
)
from broker.amp.rules import can_read
from broker.amp.service import CellService, loaded_content
from broker.core.errors import MempError
from broker.core.grammar import compile_pattern, glob_match
from broker.services.auth import Principal
from broker.storage.amp import CellRecord
from broker.storage.amp_vectors import StoredVector

MAX_CANDIDATES = 5_000
# Candidates ranked by `semantic` (`_best_by_meaning`) are loaded _BATCH_PER_HIT times the hits
# the page needs at a time, at most _EAGER: for a page of five, about half of an owner's hundred
# cells are loaded (bench/README.md, "Recall benchmark").
_EAGER = 200
_BATCH_PER_HIT = 4
_WALK_BATCH = 500
_ACCESS_BATCH = 2_000  # index records looked at per round trip when picking readable cells
# Search by meaning over every cell, from the vector index (`_by_index`): the cells nearest in
# meaning that pass the filters, loaded this many at a time, are ranked (at least this many,
# or as many as the page needs); in hybrid with about as many holding the query's rarer words
# (docs/amp.md).
_NEAR = 100
_WORDED = 100
_FIRST_LOOK = 4  # x the cells ranked: how many nearest are ordered before all of them


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
    mode: Literal["hybrid", "semantic", "keyword"] | None = None
    min_score: Annotated[float, Meta(ge=0, le=1)] | None = None


class SearchHit(msgspec.Struct):
    cell: MemoryCell
    score: float
    decay_score: float


@dataclass(frozen=True, slots=True)
class _Query:
    """One search request, decoded once."""

    body: SearchBody
    agent: str
    statuses: set[str]
    start: int | None
    end: int | None
    terms: set[str]
    now: int
    mode: str = "keyword"
    vector: Vectors | None = None  # the query's, in `semantic` and `hybrid`

    @property
    def meaning(self) -> bool:
        """Whether cells are ranked by meaning too (not only those sharing a word)."""
        return self.vector is not None


def _statuses(body: SearchBody) -> set[str]:
    if body.status is not None:
        if "deleted" in body.status:
            raise MempError("invalid_request", "deleted cells are never searchable",
                            {"field": "status"})
        return set(body.status)
    return {"active", "stale"} if body.include_stale else {"active"}


class CellSearch:
    """Runs searches for one acting agent."""

    def __init__(self, cells: CellService, recall: Recall) -> None:
        self.cells = cells
        self.recall = recall

    async def search(self, by: Principal, agent: str, body: SearchBody) -> dict[str, Any]:
        """One page of `agent`'s search (made by `by`), held to the read rates."""
        walk, offset = _offset(body.cursor)
        statuses = _statuses(body)
        start = parse_time(body.created_after, "created_after") if body.created_after else None
        end = parse_time(body.created_before, "created_before") if body.created_before else None
        terms = terms_of(body.query) if body.query else set()
        if body.query is not None and not terms:
            raise MempError("invalid_request", "query has no searchable words", {"field": "query"})
        mode = self.recall.mode(body.mode)
        await self.cells.check_read(by, agent)
        vector, degraded = None, None
        if body.query is not None and mode != "keyword":
            try:
                vector = await self.recall.query_vector(body.query)
            except EmbedderUnavailable as exc:
                if mode == "semantic":
                    raise unavailable(str(exc)) from None
                degraded = UNAVAILABLE
        query = _Query(body, agent, statuses, start, end, terms, self.cells.clock(), mode,
                       vector)
        if not walk:
            hits = await self._ranked(query, offset + body.limit + 1)
            if hits is not None:
                more = len(hits) > offset + body.limit
                next_cursor = str(offset + body.limit) if more else None
                page = {"results": hits[offset:offset + body.limit], "next_cursor": next_cursor}
                return {**page, "degraded": degraded} if degraded else page
        return await self._walk(query, offset)

    async def _ranked(self, query: _Query, want: int) -> list[SearchHit] | None:
        """The ranking whose first `want` hits are right, best first; None when there are
        more candidates than one request ranks (the search then walks creation order)."""
        hits = await self._by_index(query, want)
        if hits is not None:
            return hits
        candidates = await self._candidates(query)
        if candidates is None:
            return None
        hits = await self._best_by_meaning(candidates, query, want)
        if hits is None:
            hits = await self._hits(candidates, query)
            hits.sort(key=lambda h: (-h.score, h.cell.id))
        return hits

    async def _walk(self, query: _Query, position: int) -> dict[str, Any]:
        """More cells than one request ranks: page through creation order (newest first),
        the cursor being the position reached in it."""
        body = query.body
        page: list[SearchHit] = []
        while len(page) < body.limit:
            ids = await self.cells.index.created_between(query.start, query.end, position,
                                                         _WALK_BATCH)
            if not ids:
                return {"results": page, "next_cursor": None}
            found = {h.cell.id: h for h in await self._hits(ids, query)}
            for cell_id in ids:
                position += 1
                if cell_id in found:
                    page.append(found[cell_id])
                    if len(page) == body.limit:
                        break
        return {"results": page, "next_cursor": f"p{position}"}

    async def _by_index(self, query: _Query, want: int) -> list[SearchHit] | None:
        """The best `want` hits, sorted, of a search by meaning over every cell (no owner, no
        time range), from this process's vector index: cells by falling cosine, then checked
        and ranked as any candidate. Which cells are ranked never depends on cells the agent
        may not read: the walk goes on until enough pass. None: not such a search, or the
        index is not ready."""
        body = query.body
        if query.vector is None or body.owner_id is not None or query.start is not None or \
                query.end is not None or not self.recall.indexed:
            return None
        most = max(_NEAR, want)
        batches = self._by_cosine(query.vector, _FIRST_LOOK * most)
        if query.mode == "semantic":
            return await self._falling(batches, query, want, most)
        kept: list[tuple[MemoryCell, CellRecord, Counter[str]]] = []
        for batch in batches:
            kept += await self._kept(sorted(i for i, _ in batch), query)
            if len(kept) >= most:
                break
        seen = {cell.id for cell, _, _ in kept}
        worded = [i for i in await self._rare_worded(query) if i not in seen]
        kept += await self._kept(worded, query)
        hits = list((await self._scored(kept, query)).values())
        hits.sort(key=lambda h: (-h.score, h.cell.id))
        return hits

    def _by_cosine(self, vector: Vectors, first: int) -> Iterator[list[tuple[str, float]]]:
        """The index's cells by falling cosine to `vector`, _NEAR at a time: the nearest
        `first`, then, if more are asked for, the others."""
        nearest = self.recall.near(vector, first)
        yield from _chunks(nearest, _NEAR)
        if len(nearest) == first:
            seen = {i for i, _ in nearest}
            rest = [h for h in self.recall.near(vector, len(seen) + self.recall.indexed)
                    if h[0] not in seen]
            yield from _chunks(rest, _NEAR)

    async def _rare_worded(self, query: _Query) -> list[str]:
        """Cells holding the query's rarer words (stop words left out), rarest first, up to
        about _WORDED cells: in hybrid a cell holding a word few cells hold may rank high
        whatever its cosine; words most cells hold weigh little."""
        sizes = await self.cells.index.term_sizes(sorted(query.terms - STOP_WORDS))
        chosen: list[str] = []
        total = 0
        for term, size in sorted(sizes.items(), key=lambda t: (t[1], t[0])):
            if total + size > _WORDED:
                break
            chosen.append(term)
            total += size
        return sorted(await self.cells.index.by_term(chosen)) if chosen else []

    async def _best_by_meaning(self, candidates: list[str], query: _Query, want: int
                               ) -> list[SearchHit] | None:
        """The best `want` hits of the candidates ranked by `semantic`, sorted: their stored
        vectors scored first, then cells loaded by falling cosine only as far as the page
        needs (`_falling`). None: a mode whose relevance depends on the other ranked cells."""
        if query.mode != "semantic" or query.vector is None:
            return None
        stored = await self.recall.stored(candidates)
        nearest = self.recall.ranked(query.vector, stored)
        size = min(_EAGER, _BATCH_PER_HIT * want)
        return await self._falling(_chunks(nearest, size), query, want, stored=stored)

    async def _falling(self, batches: Iterable[list[tuple[str, float]]], query: _Query,
                       want: int, most: int | None = None,
                       stored: Mapping[str, StoredVector] | None = None) -> list[SearchHit]:
        """The best `want` semantic hits, sorted, of batches of cells by falling cosine:
        loaded a batch at a time until the `want`-th score beats the next cosine (a score is
        at most its cosine), or once `most` are ranked (None: no such cut); `stored`: the
        cells' vectors, when already loaded."""
        floor = query.body.min_score
        hits: list[SearchHit] = []
        for batch in batches:
            left = max(batch[0][1], 0.0)
            if (len(hits) >= want and hits[want - 1].score > left) or (
                    floor is not None and left < floor) or (
                    most is not None and len(hits) >= most):
                break
            hits += await self._hits(sorted(i for i, _ in batch), query, stored)
            hits.sort(key=lambda h: (-h.score, h.cell.id))
        return hits

    async def _hits(self, candidates: list[str], query: _Query,
                    stored: Mapping[str, StoredVector] | None = None) -> list[SearchHit]:
        """The candidates that pass every filter (the caller's right to read included), scored,
        in candidate order (with their `stored` vectors when already loaded). A word's weight
        comes from how many of these cells have it: the statistics of cells the caller may
        read, whatever else the namespace holds."""
        if stored is None and query.vector is not None and query.terms:  # asked for at once
            kept, stored = await asyncio.gather(self._kept(candidates, query),
                                                self.recall.stored(candidates))
        else:
            kept = await self._kept(candidates, query)
        hits = await self._scored(kept, query, stored)
        return [hits[i] for i in candidates if i in hits]

    async def _kept(self, candidates: list[str], query: _Query
                    ) -> list[tuple[MemoryCell, CellRecord, Counter[str]]]:
        """The candidates that pass every filter, loaded, with their words when the query has
        some; by keywords alone, only those holding a query word."""
        cells = self.cells
        kept: list[tuple[MemoryCell, CellRecord, Counter[str]]] = []
        for record, raw in (await cells.index.load(candidates)).values():
            if record.status not in query.statuses:
                continue
            cell = loaded_content(cells.namespace, record, raw, query.now)
            if cell is None or not self._keep(cell, record, query):
                continue
            words = Counter(words_of(cell.content.text)) \
                if query.terms and query.mode != "semantic" else Counter()
            if not query.terms or query.meaning or not query.terms.isdisjoint(words):
                kept.append((cell, record, words))
        return kept

    async def _scored(self, kept: list[tuple[MemoryCell, CellRecord, Counter[str]]],
                      query: _Query, stored: Mapping[str, StoredVector] | None = None
                      ) -> dict[str, SearchHit]:
        """The kept cells that have a relevance in the query's mode, scored, by id (with their
        `stored` vectors when already loaded)."""
        idf = _idf(query.terms, [words for _, _, words in kept if
                                 not query.terms.isdisjoint(words)])
        relevance = await self._relevance(kept, idf, query, stored)
        hits: dict[str, SearchHit] = {}
        for cell, record, _ in kept:
            if cell.id not in relevance:
                continue
            cell.scoring.access_count = record.count
            if record.accessed is not None:
                cell.lifecycle.last_accessed_at = iso(record.accessed)
            decay = score_at(cell, record, query.now)
            hits[cell.id] = SearchHit(cell, relevance[cell.id] * (0.2 + 0.8 * decay), decay)
        return hits

    async def _relevance(self, kept: list[tuple[MemoryCell, CellRecord, Counter[str]]],
                         idf: dict[str, float], query: _Query,
                         stored: Mapping[str, StoredVector] | None) -> dict[str, float]:
        """Each ranked cell's relevance in the query's mode, cells under `min_score` left
        out. `min_score` is held against a relevance in [0, 1]: the keyword relevance over the
        best one (`keyword`), the cosine (`semantic`), the fused score (`hybrid`)."""
        if not query.terms:
            return {cell.id: 1.0 for cell, _, _ in kept}
        floor = query.body.min_score
        if query.vector is None:
            keyword = {cell.id: _relevance(words, idf) for cell, _, words in kept}
            best = max(keyword.values(), default=0.0) or 1.0
            return {i: s for i, s in keyword.items() if s > 0 and (
                floor is None or s / best >= floor)}
        similar = await self.recall.similarities(query.vector, [c for c, _, _ in kept], stored)
        if query.mode == "semantic":
            scores = {i: max(s, 0.0) for i, s in similar.items()}
        else:
            shares = word_shares(query.terms, {cell.id: words for cell, _, words in kept})
            scores = {cell.id: fused(similar.get(cell.id), shares.get(cell.id, 0.0))
                      for cell, _, _ in kept
                      if cell.id in similar or shares.get(cell.id, 0.0) > 0}
        return {i: s for i, s in scores.items() if floor is None or s >= floor}

    async def _candidates(self, query: _Query) -> list[str] | None:
        """Every candidate id, to rank then page; None when there are more than one request
        ranks (unfiltered by owner or words, over MAX_CANDIDATES cells)."""
        cells, body, terms = self.cells, query.body, query.terms
        owned: set[str] | None = None
        if body.owner_id is not None:
            types = [body.owner_type] if body.owner_type else ["user", "agent", "organization"]
            found_keys = await asyncio.gather(*(
                cells.index.entries.scan_keys(
                    cells.namespace, compile_pattern(f"cells/{owner_type}/{body.owner_id}/*"),
                    None, MAX_CANDIDATES) for owner_type in types))
            owned = {k.rsplit("/", 1)[1] for keys, _ in found_keys for k in keys}
        if owned is not None:
            # One owner's cells are few: their text decides relevance (`_hits` drops cells
            # without a query word), which is far cheaper than a union of the term sets of every
            # cell in the namespace, which a common word makes as large as the namespace.
            return sorted(owned)
        if query.meaning:
            # By meaning, any cell may answer: the newest, and in hybrid up to half of
            # MAX_CANDIDATES sharing a word (docs/amp.md).
            found: list[str] = []
            if query.mode == "hybrid":
                found = sorted(await cells.index.by_term(terms))
                if len(found) > MAX_CANDIDATES // 2:
                    found = (await self._readable(found, query))[:MAX_CANDIDATES // 2]
            recent = await self._newest_readable(query, MAX_CANDIDATES - len(found))
            return sorted({*recent, *found})
        if terms:
            found = sorted(await cells.index.by_term(terms))
            return found if len(found) <= MAX_CANDIDATES else await self._readable(found, query)
        ids = await cells.index.created_between(query.start, query.end, 0, MAX_CANDIDATES + 1)
        return ids if len(ids) <= MAX_CANDIDATES else None

    async def _newest_readable(self, query: _Query, want: int) -> list[str]:
        """The newest `want` cells in the time range that the agent may read and whose status
        the search wants, by their index records: others' private cells never push the
        agent's own out."""
        kept: list[str] = []
        position = 0
        while len(kept) < want:
            ids = await self.cells.index.created_between(query.start, query.end, position,
                                                         _ACCESS_BATCH)
            if not ids:
                break
            position += len(ids)
            kept += (await self._readable(ids, query))[:want - len(kept)]
        return kept

    async def _readable(self, ids: list[str], query: _Query) -> list[str]:
        """The first MAX_CANDIDATES of `ids` in a status the search wants and readable by the
        agent, by their index records: which cells make the cut never depends on cells the
        agent may not read. A record without readers (written before records held them) is
        let through, and `_keep` decides."""
        kept: list[str] = []
        for at in range(0, len(ids), _ACCESS_BATCH):
            batch = ids[at:at + _ACCESS_BATCH]
            for cell_id, (status, globs) in zip(batch, await self.cells.index.access(batch),
                                                 strict=True):
                if status in query.statuses and (globs is None or any(
                        glob_match(g, query.agent) for g in globs.split())):
                    kept.append(cell_id)
                    if len(kept) == MAX_CANDIDATES:
                        return kept
        return kept

    @staticmethod
    def _keep(cell: MemoryCell, record: CellRecord, query: _Query) -> bool:
        body = query.body
        if body.types is not None and cell.type not in body.types:
            return False
        if body.owner_type is not None and cell.identity.owner_type != body.owner_type:
            return False
        if body.owner_id is not None and cell.identity.owner_id != body.owner_id:
            return False
        expires = cell.lifecycle.expires_at
        if expires is not None and parse_time(expires, "expires_at") <= query.now:
            return False
        created = parse_time(cell.lifecycle.created_at or "1970-01-01T00:00:00Z", "created_at")
        if (query.start is not None and created < query.start) or (
                query.end is not None and created > query.end):
            return False
        metadata = cell.content.metadata
        if any(not _json_equal(metadata.get(k, _ABSENT), v) for k, v in body.metadata.items()):
            return False
        return can_read(cell, query.agent)


_ABSENT = object()


def _chunks(nearest: list[tuple[str, float]], size: int) -> Iterator[list[tuple[str, float]]]:
    """Cells by falling cosine, `size` at a time."""
    for at in range(0, len(nearest), size):
        yield nearest[at:at + size]


def _idf(terms: set[str], ranked: list[Counter[str]]) -> dict[str, float]:
    """Inverse document frequency of each query word among the cells a search ranks."""
    counts = Counter(t for words in ranked for t in terms & words.keys())
    return {t: math.log(1 + (len(ranked) + 1) / (counts[t] + 0.5)) for t in sorted(terms)}


def _relevance(words: Counter[str], idf: dict[str, float]) -> float:
    """BM25-style: saturating term frequency weighted by inverse document frequency, summed in
    word order, so every process computes the same score to the last bit."""
    return sum(idf[t] * words[t] / (words[t] + 1.2) for t in sorted(idf.keys() & words.keys()))


def _json_equal(left: Any, right: Any) -> bool:
    """Equality as JSON means it: `true` is not `1`, and `1` equals `1.0`."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_json_equal(v, right[k])
                                                   for k, v in left.items())
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_json_equal, left, right))
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and left == right


def _offset(cursor: str | None) -> tuple[bool, int]:
    """(walking creation order, position): `12` is a rank offset, `p12` a walk position."""
    if cursor is None:
        return False, 0
    walk = cursor.startswith("p")
    digits = cursor[1:] if walk else cursor
    if not digits.isdigit() or not digits.isascii() or len(digits) > 9:
        raise MempError("invalid_request", "cursor is not one this broker issued",
                        {"field": "cursor"})
    return walk, int(digits)
