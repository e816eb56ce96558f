"""Recall by meaning for AMP search (docs/amp.md): the query's vector, the similarity of each
ranked cell's stored vector to it, and the fusion of that similarity with the keyword score.
Only vectors of the configured model, made from the cell's current text, take part: after a
model switch or a patch, a cell waits for its new vector rather than being ranked by one that
no longer describes it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from broker.amp.cells import MemoryCell
from broker.amp.embedders import Embedder, EmbedderUnavailable, Vectors
from broker.amp.embedding import text_digest
from broker.amp.nearest import NearestCells
from broker.core.errors import MempError
from broker.storage.amp_vectors import CellVectorStore, StoredVector

MODES = ("hybrid", "semantic", "keyword")
# Hybrid relevance = SEMANTIC_WEIGHT x cosine + (1 - SEMANTIC_WEIGHT) x the share of the
# query's words a cell holds; chosen over Reciprocal Rank Fusion and other weights on
# bench/recall's labelled questions (docs/amp.md, "How recall ranks").
SEMANTIC_WEIGHT = 0.8
# A word share below this is a stray word or two of a longer question ("ana" in "what should
# we avoid when cooking for Ana?", held by every one of her cells): it counts as none, so that
# only cells holding much of the query's words rise above their cosine (docs/amp.md).
KEYWORD_FLOOR = 0.3
# Words that say nothing about which memory answers: a question's "what", "does", "her" must
# not lift cells that happen to hold them.
_STOP = (
    "a an and are as at be by can could do does for from had has have he her hers him his how "
    "i if in is it its me my of on or our she should so than that the their them they this to "
    "us was we were what when where which who whom why will with would you your")
STOP_WORDS = frozenset(_STOP.split())
UNAVAILABLE = "embedder_unavailable"


class Recall:
    """The embedder (None: keyword search only) and the cells' stored vectors."""

    def __init__(self, vectors: CellVectorStore, embedder: Embedder | None,
                 index: NearestCells | None = None) -> None:
        self.vectors = vectors
        self.embedder = embedder
        self.index = index  # this process's vector index of every cell (broker/amp/nearest.py)

    @property
    def indexed(self) -> int:
        """How many cells this process's vector index holds; 0 also while it is not ready
        (or there is none): search then ranks without it."""
        if self.index is None or self.index.index is None or self.embedder is None or \
                self.index.model != self.embedder.model:
            return 0
        return len(self.index.index)

    def near(self, query: Vectors, limit: int) -> list[tuple[str, float]]:
        """Up to `limit` cells of the whole namespace by falling cosine to `query`, from this
        process's vector index (none while it is not ready)."""
        found = self.index.nearest(query, limit) if self.index is not None else None
        return found or []

    def mode(self, asked: str | None) -> str:
        """The mode a search runs in: `hybrid` by default when an embedder is configured."""
        if asked is None:
            return "keyword" if self.embedder is None else "hybrid"
        if asked != "keyword" and self.embedder is None:
            if asked == "semantic":
                raise MempError("invalid_request", "mode semantic needs an embedder, and this "
                                "broker runs with MEMP_EMBEDDER=none", {"field": "mode"})
            return "keyword"
        return asked

    async def query_vector(self, query: str) -> Vectors:
        """The query's unit vector; EmbedderUnavailable when it cannot be had."""
        if self.embedder is None:
            raise EmbedderUnavailable("no embedder configured")
        vector: Vectors = (await self.embedder.embed([query]))[0]
        return vector

    async def stored(self, cell_ids: Sequence[str]) -> dict[str, StoredVector]:
        """The cells' stored vectors (none without an embedder), for `similarities`."""
        return await self.vectors.load(cell_ids) if self.embedder is not None else {}

    async def similarities(self, query: Vectors, cells: Sequence[MemoryCell],
                           stored: Mapping[str, StoredVector] | None = None
                           ) -> dict[str, float]:
        """Cosine similarity to `query` of each cell with a vector of the configured model
        made from its current text (`stored`: the vectors, when already loaded)."""
        if self.embedder is None:
            return {}
        if stored is None:
            stored = await self.vectors.load([c.id for c in cells])
        model, ids, rows = self.embedder.model, [], []
        for cell in cells:
            found = stored.get(cell.id)
            if found is None or found.model != model or \
                    found.digest != text_digest(cell.content.text):
                continue
            row = np.frombuffer(found.vector, dtype=np.float32)
            if row.shape == query.shape:
                ids.append(cell.id)
                rows.append(row)
        if not rows:
            return {}
        scores = np.stack(rows) @ query
        return {cell_id: float(s) for cell_id, s in zip(ids, scores, strict=True)}

    def ranked(self, query: Vectors, stored: Mapping[str, StoredVector]
               ) -> list[tuple[str, float]]:
        """The cells of `stored` with a vector of the configured model, by falling cosine to
        `query` (whether a vector still matches its cell's text is checked when the cell is
        ranked)."""
        if self.embedder is None:
            return []
        ids, rows = [], []
        for cell_id, found in stored.items():
            if found.model == self.embedder.model:
                row = np.frombuffer(found.vector, dtype=np.float32)
                if row.shape == query.shape:
                    ids.append(cell_id)
                    rows.append(row)
        if not rows:
            return []
        scores = np.stack(rows) @ query
        order = np.argsort(-scores, kind="stable")
        return [(ids[i], float(scores[i])) for i in order]


def word_shares(terms: set[str], cells: Mapping[str, Counter[str]]) -> dict[str, float]:
    """Each cell's share (0..1) of the query's weighted words, stop words left out: BM25's
    saturating term frequency weighted by inverse document frequency among `cells`, over what
    a cell holding every word once scores."""
    words = sorted(terms - STOP_WORDS)
    counts = Counter(t for held in cells.values() for t in words if held[t])
    idf = {t: math.log(1 + (len(cells) + 1) / (counts[t] + 0.5)) for t in words}
    whole = sum(idf.values()) / 2.2
    if not whole:
        return {}
    return {cell_id: min(sum(idf[t] * held[t] / (held[t] + 1.2) for t in words if held[t])
                         / whole, 1.0) for cell_id, held in cells.items()}


def fused(similarity: float | None, keyword: float) -> float:
    """Hybrid relevance in [0, 1] from a cosine (None: no vector) and a keyword score already
    scaled to [0, 1], counted from KEYWORD_FLOOR up."""
    semantic = max(similarity or 0.0, 0.0)
    counted = keyword if keyword >= KEYWORD_FLOOR else 0.0
    return SEMANTIC_WEIGHT * semantic + (1 - SEMANTIC_WEIGHT) * counted


def unavailable(reason: str) -> MempError:
    return MempError("unavailable", f"mode semantic needs the embedder, which is unavailable: "
                     f"{reason}", {"field": "mode"}, headers={"Retry-After": "1"})
