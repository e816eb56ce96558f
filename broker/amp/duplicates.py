"""Near duplicates on a create's reply (docs/amp.md, "Near duplicates"): the same owner's
cells whose text means nearly what the new cell's does, so an agent can merge instead of
piling up copies. Computed only when it costs the write next to nothing: with the builtin
embedder already in memory (microseconds a sentence), never by calling a service."""

from __future__ import annotations

import logging

import msgspec

from broker.amp.cells import MemoryCell, parse_time
from broker.amp.embedders import BuiltinEmbedder
from broker.amp.embedding import text_digest
from broker.amp.recall import Recall
from broker.amp.rules import can_read
from broker.amp.service import CellService, loaded_cell
from broker.core.grammar import compile_pattern

log = logging.getLogger("memp.amp")
# Cosine similarity at or above which two cells are near duplicates. Measured with
# `python -m bench.duplicates`: no two distinct memories of one owner in bench/recall's corpus
# reach 0.62, while most restatements of one of them in other words pass 0.8.
THRESHOLD = 0.8
MAX_COMPARED = 500  # the owner's cells compared, in key (id, so creation) order
MAX_LISTED = 10


class NearDuplicate(msgspec.Struct):
    id: str
    similarity: float


class CreatedCell(MemoryCell, kw_only=True):
    """A create's reply: the cell as stored and, beside it, its near duplicates (null when
    they were not computed)."""

    near_duplicates: list[NearDuplicate] | None = None


class NearDuplicates:
    """Finds a new cell's near duplicates among its owner's cells."""

    def __init__(self, cells: CellService, recall: Recall) -> None:
        self.cells = cells
        self.recall = recall

    def ready(self) -> bool:
        """Whether the embedder answers at once: the builtin one, once loaded."""
        embedder = self.recall.embedder
        return isinstance(embedder, BuiltinEmbedder) and embedder.loaded

    async def reply(self, agent: str, cell: MemoryCell) -> CreatedCell:
        """The create's reply for `cell`, just stored by `agent`."""
        return CreatedCell(**msgspec.structs.asdict(cell),
                           near_duplicates=await self.find(agent, cell))

    async def find(self, agent: str, cell: MemoryCell) -> list[NearDuplicate] | None:
        """Up to MAX_LISTED of the owner's active or stale cells the agent may read, by
        falling similarity, at or above THRESHOLD; None when not computed (the embedder would
        make the write wait, or failed: the write stands either way)."""
        if not self.ready():
            return None
        try:
            return await self._find(agent, cell)
        except Exception:
            log.warning("near duplicates of cell %s not computed", cell.id, exc_info=True)
            return None

    async def _find(self, agent: str, cell: MemoryCell) -> list[NearDuplicate]:
        cells, recall, identity = self.cells, self.recall, cell.identity
        vector = await recall.query_vector(cell.content.text)
        pattern = compile_pattern(f"cells/{identity.owner_type}/{identity.owner_id}/*")
        keys, _ = await cells.index.entries.scan_keys(cells.namespace, pattern, None,
                                                      MAX_COMPARED)
        ids = [i for i in (key.rsplit("/", 1)[1] for key in keys) if i != cell.id]
        stored = await recall.vectors.load(ids)
        close = [(i, s) for i, s in recall.ranked(vector, stored) if s >= THRESHOLD]
        if not close:
            return []
        loaded = await cells.index.load([i for i, _ in close[:MAX_LISTED * 2]])
        now = cells.clock()
        listed: list[NearDuplicate] = []
        for cell_id, similarity in close[:MAX_LISTED * 2]:
            found = loaded.get(cell_id)
            other = loaded_cell(cells.namespace, *found, now) if found else None
            if other is not None and _listable(other[1], agent, now) and \
                    stored[cell_id].digest == text_digest(other[1].content.text):
                # A vector of a text since patched is not the cell's: only current ones count.
                listed.append(NearDuplicate(cell_id, round(similarity, 4)))
        return listed[:MAX_LISTED]


def _listable(cell: MemoryCell, agent: str, now: int) -> bool:
    expires = cell.lifecycle.expires_at
    return cell.lifecycle.status in ("active", "stale") and can_read(cell, agent) \
        and (expires is None or parse_time(expires, "expires_at") > now)
