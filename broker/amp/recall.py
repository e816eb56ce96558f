"""Recall by meaning for AMP search (docs/amp.md): the query's vector, the similarity of each
ranked cell's stored vector to it, and the fusion of that similarity with the keyword score.
Only vectors of the configured model, made from the cell's current text, take part: after a
model switch or a patch, a cell waits for its new vector rather than being ranked by one that
no longer describes it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from broker.amp.cells import MemoryCell
from broker.amp.embedders import Embedder, EmbedderUnavailable, Vectors
from broker.amp.embedding import text_digest
from broker.core.errors import MempError
from broker.storage.amp_vectors import CellVectorStore

MODES = ("hybrid", "semantic", "keyword")
# Hybrid relevance = SEMANTIC_WEIGHT x cosine + (1 - SEMANTIC_WEIGHT) x the keyword score
# over the best keyword score among the ranked cells, measured against Reciprocal Rank Fusion
# on bench/recall's labelled questions (docs/amp.md, "How recall ranks").
SEMANTIC_WEIGHT = 0.7
UNAVAILABLE = "embedder_unavailable"


class Recall:
    """The embedder (None: keyword search only) and the cells' stored vectors."""

    def __init__(self, vectors: CellVectorStore, embedder: Embedder | None) -> None:
        self.vectors = vectors
        self.embedder = embedder

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

    async def similarities(self, query: Vectors, cells: Sequence[MemoryCell]
                           ) -> dict[str, float]:
        """Cosine similarity to `query` of each cell with a vector of the configured model
        made from its current text."""
        if self.embedder is None:
            return {}
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


def fused(similarity: float | None, keyword: float) -> float:
    """Hybrid relevance in [0, 1] from a cosine (None: no vector) and a keyword score already
    scaled to [0, 1]."""
    semantic = max(similarity or 0.0, 0.0)
    return SEMANTIC_WEIGHT * semantic + (1 - SEMANTIC_WEIGHT) * keyword


def unavailable(reason: str) -> MempError:
    return MempError("unavailable", f"mode semantic needs the embedder, which is unavailable: "
                     f"{reason}", {"field": "mode"}, headers={"Retry-After": "1"})
