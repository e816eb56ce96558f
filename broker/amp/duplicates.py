"""Near duplicates on a create's reply (docs/amp.md, "Near duplicates"): the same owner's
cells whose text means nearly what the new cell's does, so an agent can merge instead of
piling up copies. Computed only when it costs the write next to nothing: with the builtin
embedder already in memory (microseconds a sentence), never by calling a service."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec
import numpy as np

from broker.amp.cells import MemoryCell, NewCell, parse_time
from broker.amp.embedders import BuiltinEmbedder, Vectors
from broker.amp.embedding import text_digest
from broker.amp.recall import Recall
from broker.amp.rules import can_read
from broker.amp.service import CellService, cell_key, stored_cell
from broker.core.errors import MempError
from broker.services.auth import Principal
from broker.storage.amp_vectors import Neighbours, VectorWrite

log = logging.getLogger("memp.amp")
# Cosine similarity at or above which two cells are near duplicates. Measured with
# `python -m bench.duplicates`: no two distinct memories of one owner in bench/recall's corpus
# reach 0.62, while most restatements of one of them in other words pass 0.8.
THRESHOLD = 0.8
_FLOOR = float(np.float32(THRESHOLD))  # a float32 score passes as it would in float32
MAX_COMPARED = 500  # the owner's cells compared, in key (id, so creation) order
MAX_LISTED = 10
NEW_VERSION = 1  # a new cell's entry version: its vector is stored unless it changed since


class NearDuplicate(msgspec.Struct):
    id: str
    similarity: float


class CreatedCell(MemoryCell, kw_only=True):
    """A create's reply: the cell as stored and, beside it, its near duplicates (null when
    they were not computed)."""

    near_duplicates: list[NearDuplicate] | None = None


@dataclass(frozen=True, slots=True)
class _Stored:
    """A new cell's vector and what storing it answered; `served`: the owner's vectors are
    to be taken from this process's vector index (the call did not return them)."""

    cell_id: str
    vector: Vectors
    found: Neighbours
    served: bool


class NearDuplicates:
    """Finds a new cell's near duplicates among its owner's cells."""

    def __init__(self, cells: CellService, recall: Recall) -> None:
        self.cells = cells
        self.recall = recall

    def ready(self) -> bool:
        """Whether the embedder answers at once: the builtin one, once loaded."""
        embedder = self.recall.embedder
        return isinstance(embedder, BuiltinEmbedder) and embedder.loaded

    async def create(self, by: Principal, agent: str, body: NewCell) -> CreatedCell:
        """Create the cell and list its near duplicates: the call storing its vector leaves in
        the same round trip as the cell's write, and runs after it (`CellService.create`),
        where calls are pipelined; elsewhere it is sent once the write is done."""
        if not self.recall.vectors.pipelined:
            cell = await self.cells.create(by, agent, body)
            return CreatedCell(**msgspec.structs.asdict(cell),
                               near_duplicates=await self.find(agent, cell))
        kept: list[_Stored | None] = []

        async def beside(cell: MemoryCell) -> None:
            kept.append(await self._store(cell, agent))

        ready = self.ready()
        try:
            cell = await self.cells.create(by, agent, body, beside if ready else None)
        except MempError:
            if kept and kept[0] is not None and kept[0].found.stored:
                # The id was another cell's (write_conflict): that cell is embedded again
                # from its own text, over the vector just stored under its id.
                await self.recall.vectors.requeue([kept[0].cell_id])
            raise
        listed = await self._listed(agent, cell, kept[0]) if ready and kept else None
        return CreatedCell(**msgspec.structs.asdict(cell), near_duplicates=listed)

    async def find(self, agent: str, cell: MemoryCell) -> list[NearDuplicate] | None:
        """Store the vector of `cell`, already written by `agent`, and list its near
        duplicates: up to MAX_LISTED of the owner's active or stale cells the agent may read,
        by falling similarity, at or above THRESHOLD; None when not computed (the embedder
        would make the write wait, or failed: the write stands either way)."""
        if not self.ready():
            return None
        return await self._listed(agent, cell, await self._store(cell, agent))

    async def _store(self, cell: MemoryCell, agent: str) -> _Stored | None:
        """One embedding and one call storing it and listing the owner's cells with a vector,
        with whether `agent` may see each listed: with their vectors only while this process's
        vector index is not ready (else they are taken from it). None when that failed."""
        recall, identity = self.recall, cell.identity
        embedder, index = recall.embedder, recall.index
        try:
            vector = await recall.query_vector(cell.content.text)
            assert embedder is not None  # ready() checked it
            served = index is not None and index.ready and index.model == embedder.model
            digest, data = text_digest(cell.content.text), vector.tobytes()
            found = await recall.vectors.save_new(
                VectorWrite(cell.id, cell_key(cell), NEW_VERSION, embedder.model,
                            int(vector.shape[0]), digest, data),
                f"cells/{identity.owner_type}/{identity.owner_id}/", MAX_COMPARED,
                self.cells.clock(), agent, send=not served)
        except Exception:
            log.warning("near duplicates of cell %s not computed", cell.id, exc_info=True)
            return None
        if found.stored and index is not None:
            index.add_new(cell.id, data, digest)
        return _Stored(cell.id, vector, found, served)

    async def _listed(self, agent: str, cell: MemoryCell, stored: _Stored | None
                      ) -> list[NearDuplicate] | None:
        """`find`'s list from what `_store` answered; None when either failed."""
        if stored is None:
            return None
        try:
            return await self._judged(agent, stored)
        except Exception:
            log.warning("near duplicates of cell %s not computed", cell.id, exc_info=True)
            return None

    async def _judged(self, agent: str, stored: _Stored) -> list[NearDuplicate]:
        """One product scoring the owner's vectors. The cells that pass THRESHOLD are judged
        in falling similarity until MAX_LISTED are listed (none after them could be): each as
        the vector-storing call judged it by its index record, when its vector, record and
        entry are of one version, else read (all such in one call) and judged by its text."""
        cells, found, vector = self.cells, stored.found, stored.vector
        if not found.ids:
            return []
        rows = await self._rows(found, vector) if stored.served else \
            np.frombuffer(found.vectors, dtype=np.float32).reshape(len(found.ids), -1)
        scores = rows @ vector
        top = np.argsort(-scores, kind="stable")[:MAX_LISTED * 2]
        now = cells.clock()
        judged: list[tuple[int, float, bool | None]] = []  # position, score, listable
        listed = 0
        for at, score in zip(top.tolist(), scores[top].tolist(), strict=True):
            if not score >= _FLOOR:  # falling from here (a NaN sorts last)
                break
            keep = found.listable[at]
            judged.append((at, score, keep))
            listed += keep is True
            if listed == MAX_LISTED:
                break
        unsure = [found.ids[at] for at, _, keep in judged if keep is None]
        loaded = await cells.index.load(unsure) if unsure else {}
        out: list[NearDuplicate] = []
        for at, score, keep in judged:
            cell_id = found.ids[at]
            if keep is None:
                record = loaded.get(cell_id)
                other = stored_cell(cells.namespace, *record, now) if record else None
                # A vector of a text since patched is not the cell's: only current ones count.
                keep = other is not None and _listable(other[0], agent, now) and \
                    found.digests[at] == text_digest(other[0].content.text)
            if keep:
                out.append(NearDuplicate(cell_id, round(score, 4)))
        return out[:MAX_LISTED]

    async def _rows(self, found: Neighbours, vector: Vectors) -> Vectors:
        """The vectors of `found`'s cells from the vector index, those it does not hold with
        the digest stored loaded from Redis; a row left zero (its vector changed since the
        call, or the index changed model) scores 0, below THRESHOLD."""
        recall = self.recall
        assert recall.index is not None and recall.embedder is not None
        model = recall.embedder.model
        taken = recall.index.rows(model, found.ids, found.digests)
        if taken is None or taken[0].shape[1] != vector.shape[0]:
            rows: Vectors = np.zeros((len(found.ids), vector.shape[0]), dtype=np.float32)
            missing = list(range(len(found.ids)))
        else:
            rows, missing = taken
        if missing:
            stored = await recall.vectors.load([found.ids[at] for at in missing])
            for at in missing:
                one = stored.get(found.ids[at])
                if one is not None and one.model == model and \
                        one.digest == found.digests[at] and len(one.vector) == vector.nbytes:
                    rows[at] = np.frombuffer(one.vector, dtype=np.float32)
        return rows


def _listable(cell: MemoryCell, agent: str, now: int) -> bool:
    expires = cell.lifecycle.expires_at
    return cell.lifecycle.status in ("active", "stale") and can_read(cell, agent) \
        and (expires is None or parse_time(expires, "expires_at") > now)

