"""Merging cells (memorywire's merge): one new cell from several of one owner's cells, which
become `archived` in the same script call (docs/amp.md, "Merging cells")."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from broker.amp.cells import (
    AMP_VERSION,
    AccessPolicy,
    Content,
    Identity,
    Lifecycle,
    MemoryCell,
    MemoryType,
    Provenance,
    Scoring,
    Text,
    check_policy,
    iso,
    new_ulid,
    parse_time,
)
from broker.amp.index import due_times, index_update, reference_ms
from broker.amp.rules import can_read, can_write
from broker.amp.service import CellService, cell_key, check_id, decode_cell
from broker.core.errors import MempError
from broker.services.auth import Principal
from broker.storage.amp import CellRecord
from broker.storage.amp_merge import CellMergeStore
from broker.storage.amp_status import StatusChange
from broker.storage.records import RawHash

MAX_SOURCES = 50
_ATTEMPTS = 8  # looks at the sources before a merge whose sources keep changing gives up
_encoder = msgspec.json.Encoder()


class MergeBody(Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /amp/memories/merge`: the sources, the merged text, and optionally what a
    create takes besides the owner (which is the sources')."""

    ids: Annotated[list[str], Meta(min_length=2, max_length=MAX_SOURCES)]
    text: Annotated[Text, Meta(min_length=1)]
    type: MemoryType | None = None
    metadata: dict[str, Any] = {}
    scoring: Scoring | None = None
    access_policy: AccessPolicy | None = None


def _check_ids(ids: list[str]) -> None:
    for at, cell_id in enumerate(ids):
        try:
            check_id(cell_id)
        except MempError:
            raise MempError("invalid_request", f"ids[{at}] must be a cell id (a ULID)",
                            {"field": f"ids[{at}]"}) from None
        if cell_id in ids[:at]:
            raise MempError("invalid_request", f"ids[{at}] repeats {cell_id}",
                            {"field": f"ids[{at}]"})


Source = tuple[CellRecord, MemoryCell, RawHash]


class CellMerger:
    """Merges cells the acting agent may read and write, all of one owner."""

    def __init__(self, cells: CellService, store: CellMergeStore) -> None:
        self.cells = cells
        self.store = store

    async def merge(self, by: Principal, agent: str, body: MergeBody) -> MemoryCell:
        """The merged cell, stored; the sources archived in the same call. A source written
        meanwhile (a patch, another merge) makes the merge look again: an archived source
        then answers 409."""
        _check_ids(body.ids)
        check_policy(body.access_policy)
        cells = self.cells
        for attempt in range(_ATTEMPTS):
            sources = await self._sources(agent, body.ids)
            now = cells.clock()
            cell = _merged(body, agent, [source for _, source, _ in sources], now)
            key = cell_key(cell)
            await self._check_ungated([key, *(record.key for record, _, _ in sources)])
            changes = [_archived(record, source, raw) for record, source, raw in sources]
            limit = await cells.limit(by, agent, cost=0 if attempt else 1)
            verdict = await self.store.merge(
                index_update(cell, key, now, count=0),
                cells.request(cell, agent, None, now, "amp-merge"), changes, limit)
            if verdict.ok:
                return cell
            if verdict.refused is not None:
                raise cells.refusal(verdict.refused, limit)
        raise MempError("write_conflict", "the cells kept changing; retry the merge",
                        {"field": "ids"})

    async def _sources(self, agent: str, ids: list[str]) -> list[Source]:
        """The sources as stored, each checked: there, visible, readable and writable by
        `agent`, active or stale, and of the first one's owner."""
        loaded = await self.cells.index.load(ids, strict=True)
        now = self.cells.clock()
        sources: list[Source] = []
        for at, cell_id in enumerate(ids):
            field = {"field": f"ids[{at}]", "id": cell_id}
            try:
                record, _, entry = self.cells.found(cell_id, loaded.get(cell_id))
            except MempError as error:
                raise MempError(error.code, error.message, field) from None
            cell = decode_cell(entry)
            expires = cell.lifecycle.expires_at
            if expires is not None and parse_time(expires, "expires_at") <= now:
                raise MempError("not_found", f"no memory cell {cell_id!r}", field)
            if not (can_read(cell, agent) and can_write(cell, agent)):
                raise MempError("forbidden", f"the access policy of {cell_id} does not let "
                                "this agent read and write it", field)
            status = cell.lifecycle.status
            if status not in ("active", "stale"):
                raise MempError("write_conflict", f"{cell_id} is {status}: only active or "
                                "stale cells can be merged", {**field, "status": status})
            if sources and _owner(cell) != _owner(sources[0][1]):
                raise MempError("invalid_request", f"{cell_id} has another owner than "
                                f"{ids[0]}: only one owner's cells can be merged", field)
            sources.append((record, cell, loaded[cell_id][1]))
        return sources

    async def _check_ungated(self, keys: list[str]) -> None:
        approvals = self.cells.approvals
        if approvals is None:
            return
        for key in keys:
            if await approvals.requires(self.cells.namespace, key):
                raise MempError("forbidden", "writes to these cells require approval, which a "
                                "merge does not go through", {"field": "ids"})


def _owner(cell: MemoryCell) -> tuple[str, str]:
    return cell.identity.owner_type, cell.identity.owner_id


def _merged(body: MergeBody, agent: str, sources: list[MemoryCell], now: int) -> MemoryCell:
    """The new cell: the sources' owner, the body's text, provenance naming the sources."""
    owner = sources[0].identity
    types = {source.type for source in sources}
    stamp = iso(now)
    return MemoryCell(
        id=new_ulid(now), amp_version=AMP_VERSION,
        type=body.type or (types.pop() if len(types) == 1 else "semantic"),
        content=Content(text=body.text, metadata=body.metadata),
        identity=Identity(owner_id=owner.owner_id, owner_type=owner.owner_type,
                          created_by=agent),
        scoring=msgspec.structs.replace(body.scoring or Scoring(), access_count=0),
        access_policy=body.access_policy or AccessPolicy(),
        provenance=Provenance(source_type="merge", extraction_method="merge",
                              source_ref=",".join(source.id for source in sources)),
        lifecycle=Lifecycle(created_at=stamp, last_updated_at=stamp, status="active"))


def _archived(record: CellRecord, cell: MemoryCell, raw: RawHash) -> StatusChange:
    """A source's move to `archived`, a compare-and-set on the version read."""
    ref = max(reference_ms(cell), record.ref)
    cell.lifecycle.status = "archived"
    cell.lifecycle.stale_since = None
    return StatusChange(id=cell.id, key=record.key, stored=raw, status="archived",
                        value=_encoder.encode(cell), ref=ref, dues=due_times(cell, ref),
                        recheck=False)
