"""The AMP bridge (`/amp`): memory cells with decay, a lifecycle, access policies and search,
for `MEMP` (`broker.amp`) and `AsyncMEMP`. Calls act as the client's registered agent
(`X-AMP-Agent-ID`), else as the token's own; `agent=` names another (gateways with the
`impersonate` permission)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from memp import _calls
from memp._transport import AsyncTransport, SyncTransport
from memp.models import (
    AccessPolicy,
    CellSearchPage,
    CellStatus,
    CreatedCell,
    ImportResult,
    MemoryCell,
    MemoryType,
    OwnerType,
    Provenance,
    SearchMode,
)

ActingAgent = Callable[[], str | None]


class _Base:
    def __init__(self, acting: ActingAgent) -> None:
        self._acting = acting

    def _agent(self, agent: str | None) -> str | None:
        return agent or self._acting()

    @staticmethod
    def _search(query: str | None, owner_id: str | None, owner_type: OwnerType | None,
                types: Sequence[MemoryType] | None, status: Sequence[CellStatus] | None,
                include_stale: bool, metadata: Mapping[str, Any] | None,
                created_after: str | datetime | None, created_before: str | datetime | None,
                limit: int | None, cursor: str | None, mode: SearchMode | None,
                min_score: float | None) -> dict[str, Any]:
        return _calls.search_body(query, {"mode": mode, "min_score": min_score,
            "owner_id": owner_id, "owner_type": owner_type,
            "types": list(types) if types is not None else None,
            "status": list(status) if status is not None else None,
            "include_stale": include_stale,
            "metadata": dict(metadata) if metadata is not None else None,
            "created_after": created_after, "created_before": created_before,
            "limit": limit, "cursor": cursor})


class Amp(_Base):
    """AMP memory cells."""

    def __init__(self, transport: SyncTransport, acting: ActingAgent) -> None:
        super().__init__(acting)
        self._transport = transport

    def create(self, text: str, *, owner_id: str, owner_type: OwnerType = "user",
               type: MemoryType = "semantic", metadata: Mapping[str, Any] | None = None,
               importance: float | None = None, confidence: float | None = None,
               decay_rate: float | None = None, access_policy: AccessPolicy | None = None,
               provenance: Provenance | None = None, session_id: str | None = None,
               expires_at: str | datetime | None = None, agent: str | None = None
               ) -> CreatedCell:
        """Create a cell; the broker sets its id, creator (the acting agent) and lifecycle.
        `near_duplicates` lists the owner's cells that say nearly the same (None when the
        broker did not look), to `merge` with."""
        return self._transport.send(_calls.create_cell(self._agent(agent), _calls.new_cell(
            text, owner_id=owner_id, owner_type=owner_type, type=type, metadata=metadata,
            importance=importance, confidence=confidence, decay_rate=decay_rate,
            access_policy=access_policy, provenance=provenance, session_id=session_id,
            expires_at=expires_at)))

    def get(self, cell_id: str, *, agent: str | None = None) -> MemoryCell:
        """Read a cell (a read counts as an access and restarts its decay)."""
        return self._transport.send(_calls.get_cell(self._agent(agent), cell_id))

    def patch(self, cell_id: str, *, text: str | None = None,
              metadata: Mapping[str, Any] | None = None, importance: float | None = None,
              confidence: float | None = None, decay_rate: float | None = None,
              access_policy: AccessPolicy | None = None,
              expires_at: str | datetime | None = None, agent: str | None = None
              ) -> MemoryCell:
        """Change what is given; an archived cell refuses (ConflictError, `cell_status`)."""
        return self._transport.send(_calls.patch_cell(self._agent(agent), cell_id,
                                                      _calls.cell_patch(
            text=text, metadata=metadata, importance=importance, confidence=confidence,
            decay_rate=decay_rate, access_policy=access_policy, expires_at=expires_at)))

    def delete(self, cell_id: str, *, agent: str | None = None) -> MemoryCell:
        """Soft-delete an archived cell (others: ConflictError naming their status)."""
        return self._transport.send(_calls.delete_cell(self._agent(agent), cell_id))

    def search(self, query: str | None = None, *, owner_id: str | None = None,
               owner_type: OwnerType | None = None, types: Sequence[MemoryType] | None = None,
               status: Sequence[CellStatus] | None = None, include_stale: bool = False,
               metadata: Mapping[str, Any] | None = None,
               created_after: str | datetime | None = None,
               created_before: str | datetime | None = None, limit: int | None = None,
               cursor: str | None = None, mode: SearchMode | None = None,
               min_score: float | None = None, agent: str | None = None) -> CellSearchPage:
        """Cells the acting agent may read, best first; pass `next_cursor` back for more.
        `mode`: `hybrid` (meaning and words; the broker's default when it has an embedder),
        `semantic` or `keyword`; `min_score` (0-1) leaves out weaker matches."""
        return self._transport.send(_calls.search_cells(self._agent(agent), self._search(
            query, owner_id, owner_type, types, status, include_stale, metadata,
            created_after, created_before, limit, cursor, mode, min_score)))

    def merge(self, ids: Sequence[str], text: str, *, type: MemoryType | None = None,
              metadata: Mapping[str, Any] | None = None, importance: float | None = None,
              confidence: float | None = None, decay_rate: float | None = None,
              access_policy: AccessPolicy | None = None, agent: str | None = None
              ) -> MemoryCell:
        """One new cell of the sources' owner from 2-50 cells the agent may write, which
        become archived; its provenance names them. A source already archived (another merge
        won) raises ConflictError."""
        return self._transport.send(_calls.merge_cells(self._agent(agent), _calls.merge_body(
            ids, text, type=type, metadata=metadata, importance=importance,
            confidence=confidence, decay_rate=decay_rate, access_policy=access_policy)))

    def import_cells(self, cells: Sequence[MemoryCell | Mapping[str, Any]], *,
                     agent: str | None = None) -> ImportResult:
        """Store cells from another system as they are (needs `admin` on the AMP
        namespace); `errors` names each refused one."""
        return self._transport.send(_calls.import_cells(self._agent(agent), cells))


class AsyncAmp(_Base):
    """AMP memory cells; see `Amp`."""

    def __init__(self, transport: AsyncTransport, acting: ActingAgent) -> None:
        super().__init__(acting)
        self._transport = transport

    async def create(self, text: str, *, owner_id: str, owner_type: OwnerType = "user",
                     type: MemoryType = "semantic", metadata: Mapping[str, Any] | None = None,
                     importance: float | None = None, confidence: float | None = None,
                     decay_rate: float | None = None, access_policy: AccessPolicy | None = None,
                     provenance: Provenance | None = None, session_id: str | None = None,
                     expires_at: str | datetime | None = None, agent: str | None = None
                     ) -> CreatedCell:
        return await self._transport.send(_calls.create_cell(self._agent(agent),
                                                             _calls.new_cell(
            text, owner_id=owner_id, owner_type=owner_type, type=type, metadata=metadata,
            importance=importance, confidence=confidence, decay_rate=decay_rate,
            access_policy=access_policy, provenance=provenance, session_id=session_id,
            expires_at=expires_at)))

    async def get(self, cell_id: str, *, agent: str | None = None) -> MemoryCell:
        return await self._transport.send(_calls.get_cell(self._agent(agent), cell_id))

    async def patch(self, cell_id: str, *, text: str | None = None,
                    metadata: Mapping[str, Any] | None = None, importance: float | None = None,
                    confidence: float | None = None, decay_rate: float | None = None,
                    access_policy: AccessPolicy | None = None,
                    expires_at: str | datetime | None = None, agent: str | None = None
                    ) -> MemoryCell:
        return await self._transport.send(_calls.patch_cell(self._agent(agent), cell_id,
                                                            _calls.cell_patch(
            text=text, metadata=metadata, importance=importance, confidence=confidence,
            decay_rate=decay_rate, access_policy=access_policy, expires_at=expires_at)))

    async def delete(self, cell_id: str, *, agent: str | None = None) -> MemoryCell:
        return await self._transport.send(_calls.delete_cell(self._agent(agent), cell_id))

    async def search(self, query: str | None = None, *, owner_id: str | None = None,
                     owner_type: OwnerType | None = None,
                     types: Sequence[MemoryType] | None = None,
                     status: Sequence[CellStatus] | None = None, include_stale: bool = False,
                     metadata: Mapping[str, Any] | None = None,
                     created_after: str | datetime | None = None,
                     created_before: str | datetime | None = None, limit: int | None = None,
                     cursor: str | None = None, mode: SearchMode | None = None,
                     min_score: float | None = None, agent: str | None = None
                     ) -> CellSearchPage:
        return await self._transport.send(_calls.search_cells(self._agent(agent), self._search(
            query, owner_id, owner_type, types, status, include_stale, metadata,
            created_after, created_before, limit, cursor, mode, min_score)))

    async def merge(self, ids: Sequence[str], text: str, *, type: MemoryType | None = None,
                    metadata: Mapping[str, Any] | None = None,
                    importance: float | None = None, confidence: float | None = None,
                    decay_rate: float | None = None, access_policy: AccessPolicy | None = None,
                    agent: str | None = None) -> MemoryCell:
        return await self._transport.send(_calls.merge_cells(
            self._agent(agent), _calls.merge_body(
                ids, text, type=type, metadata=metadata, importance=importance,
                confidence=confidence, decay_rate=decay_rate, access_policy=access_policy)))

    async def import_cells(self, cells: Sequence[MemoryCell | Mapping[str, Any]], *,
                           agent: str | None = None) -> ImportResult:
        return await self._transport.send(_calls.import_cells(self._agent(agent), cells))
