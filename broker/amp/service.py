"""AMP operations on cells: create, read, patch, delete, import. Every cell is a MEMP entry in
the AMP namespace at `cells/<owner_type>/<owner_id>/<id>`, written through the MEMP store, so each
change is versioned and reaches MEMP subscribers."""

from __future__ import annotations

import uuid

import msgspec

from broker import layout
from broker.amp.cells import (
    AMP_VERSION,
    ULID_RE,
    CellPatch,
    Lifecycle,
    MemoryCell,
    NewCell,
    iso,
    new_ulid,
    parse_time,
)
from broker.amp.index import CellIndex, CellRecord
from broker.amp.rules import can_read, can_write
from broker.clock import Clock
from broker.errors import MempError
from broker.models import Entry
from broker.store import Store, WriteRequest

_CAS_ATTEMPTS = 10


def cell_key(cell: MemoryCell) -> str:
    """The MEMP key of a cell: one owner's cells share the prefix `cells/<type>/<owner>/`."""
    return f"cells/{cell.identity.owner_type}/{cell.identity.owner_id}/{cell.id}"


def check_id(cell_id: str) -> str:
    if not ULID_RE.fullmatch(cell_id):
        raise MempError("invalid_request", "id must be a ULID (26 Crockford base32 characters)",
                        {"field": "id"})
    return cell_id


def _not_found(cell_id: str) -> MempError:
    return MempError("not_found", f"no memory cell {cell_id!r}")


def decode_cell(entry: Entry) -> MemoryCell:
    if entry.value is None:
        raise MempError("not_found", f"no memory cell at {entry.key!r}")
    return msgspec.json.decode(entry.value, type=MemoryCell)


class CellService:
    """Creates and changes cells under AMP's rules, on top of the MEMP store."""

    def __init__(self, store: Store, namespace: str, clock: Clock) -> None:
        self.store = store
        self.namespace = namespace
        self.clock = clock
        self.index = CellIndex(store.redis, namespace)

    @staticmethod
    def _request(cell: MemoryCell, agent: str, version: int | None, now: int) -> WriteRequest:
        return WriteRequest(
            agent_id=agent, now=now, timestamp=now, timestamp_from_client=False,
            value=msgspec.json.encode(cell), entry_id=str(uuid.uuid4()),
            if_version=version, if_absent=version is None, mode="merge", internal_cas=True,
        )

    async def write(self, cell: MemoryCell, agent: str, *, version: int | None,
                    now: int) -> Entry | None:
        """Store the cell as a new MEMP version; None when `version` is no longer current."""
        outcome = await self.store.put(self.namespace, cell_key(cell),
                                       self._request(cell, agent, version, now))
        if outcome.status == "precondition_failed":
            return None
        return outcome.entry(self.namespace, cell_key(cell))

    async def write_many(self, cells: list[tuple[MemoryCell, int]], agent: str, now: int
                         ) -> list[bool]:
        """`write` for several cells, each at its version, in one round trip; True where the
        cell was written, False where its version was no longer current."""
        outcomes = await self.store.put_many(self.namespace, [
            (cell_key(cell), self._request(cell, agent, version, now))
            for cell, version in cells])
        return [o.status != "precondition_failed" for o in outcomes]

    async def load(self, cell_id: str) -> tuple[CellRecord, MemoryCell, Entry]:
        """A cell that is not deleted, with its index record and MEMP entry."""
        record = await self.index.record(check_id(cell_id))
        if record is None or record.status == "deleted":
            raise _not_found(cell_id)
        entry = await self.store.get(self.namespace, record.key, self.clock())
        if entry is None:
            raise _not_found(cell_id)
        cell = decode_cell(entry)
        cell.scoring.access_count = record.count
        if record.accessed is not None:
            cell.lifecycle.last_accessed_at = iso(record.accessed)
        return record, cell, entry

    async def create(self, agent: str, body: NewCell) -> MemoryCell:
        if body.identity.created_by not in (None, agent):
            raise MempError("forbidden", "identity.created_by must be the acting agent",
                            {"field": "identity.created_by"})
        now = self.clock()
        expires = parse_time(body.expires_at, "expires_at") if body.expires_at else None
        if expires is not None and expires <= now:
            raise MempError("invalid_request", "expires_at must be in the future",
                            {"field": "expires_at"})
        identity = msgspec.structs.replace(body.identity, created_by=agent)
        scoring = msgspec.structs.replace(body.scoring, access_count=0)
        cell = MemoryCell(
            id=new_ulid(now), amp_version=AMP_VERSION, type=body.type, content=body.content,
            identity=identity, scoring=scoring, access_policy=body.access_policy,
            provenance=body.provenance,
            lifecycle=Lifecycle(created_at=iso(now), last_updated_at=iso(now),
                                expires_at=iso(expires) if expires else None, status="active"),
        )
        await self.write(cell, agent, version=None, now=now)
        async with self.store.redis.pipeline(transaction=False) as pipe:
            self.index.save(pipe, cell, cell_key(cell), count=0)
            await pipe.execute()
        return cell

    async def read(self, agent: str, cell_id: str) -> MemoryCell:
        """A read counts: access_count, last_accessed_at, and the decay clock restarts."""
        record, cell, _ = await self.load(cell_id)
        now = self.clock()
        _check_visible(cell, now)
        if not can_read(cell, agent):
            raise MempError("forbidden", "the cell's access policy does not let this agent read")
        cell.scoring.access_count = record.count + 1
        cell.lifecycle.last_accessed_at = iso(now)
        async with self.store.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.record_key(cell_id), "count", 1)
            pipe.hset(self.record_key(cell_id), mapping={"accessed": now, "ref": now})
            if cell.lifecycle.status == "active":
                self.index.schedule(pipe, cell, now)
            elif cell.lifecycle.status == "stale":
                self.index.schedule(pipe, cell, now)
                self.index.recheck(pipe, cell_id)
            await pipe.execute()
        return cell

    def record_key(self, cell_id: str) -> str:
        return layout.amp_cell(self.namespace, cell_id)

    async def patch(self, agent: str, cell_id: str, patch: CellPatch) -> MemoryCell:
        for _ in range(_CAS_ATTEMPTS):
            record, cell, entry = await self.load(cell_id)
            now = self.clock()
            _check_visible(cell, now)  # an expired cell is hidden, from writes as from reads
            if not can_write(cell, agent):
                raise MempError("forbidden", "the cell's access policy does not let this agent "
                                "write")
            status = cell.lifecycle.status
            if status == "archived":
                raise MempError("write_conflict", "the cell is archived: archived cells cannot "
                                "change or return to active; create a new cell instead",
                                {"status": status})
            if patch.lifecycle is not None and patch.lifecycle.status is not None:
                raise MempError("invalid_request", "lifecycle.status is managed by the "
                                "lifecycle engine and cannot be patched",
                                {"field": "lifecycle.status", "status": status})
            old_text = cell.content.text
            _apply(cell, patch, now)
            if await self.write(cell, agent, version=entry.version, now=now) is None:
                continue
            async with self.store.redis.pipeline(transaction=True) as pipe:
                self.index.save(pipe, cell, record.key, old_text=old_text)
                if status == "stale":
                    self.index.recheck(pipe, cell.id)
                await pipe.execute()
            return cell
        raise MempError("write_conflict", "the cell kept changing; retry the patch")

    async def delete(self, agent: str, cell_id: str) -> MemoryCell:
        """Soft delete: only an archived cell may become `deleted`, which is final."""
        for _ in range(_CAS_ATTEMPTS):
            record, cell, entry = await self.load(cell_id)
            if not can_write(cell, agent):
                raise MempError("forbidden", "the cell's access policy does not let this agent "
                                "delete")
            status = cell.lifecycle.status
            if status != "archived":
                raise MempError("write_conflict", f"the cell is {status}: only archived cells "
                                "can be deleted", {"status": status})
            now = self.clock()
            cell.lifecycle.status = "deleted"
            cell.lifecycle.deleted_at = iso(now)
            if await self.write(cell, agent, version=entry.version, now=now) is None:
                continue
            async with self.store.redis.pipeline(transaction=True) as pipe:
                self.index.save(pipe, cell, record.key)
                await pipe.execute()
            return cell
        raise MempError("write_conflict", "the cell kept changing; retry the delete")

    async def import_cell(self, agent: str, cell: MemoryCell) -> None:
        """Store a cell from another system as it was: id, timestamps, creator, provenance."""
        check_id(cell.id)
        if cell.amp_version != AMP_VERSION:
            raise MempError("invalid_request", f"amp_version must be {AMP_VERSION}",
                            {"field": "amp_version"})
        life = cell.lifecycle
        for name in ("created_at", "last_accessed_at", "last_updated_at", "expires_at",
                     "stale_since", "deleted_at"):
            value = getattr(life, name)
            if value is not None:
                setattr(life, name, iso(parse_time(value, f"lifecycle.{name}")))
        if life.created_at is None:
            raise MempError("invalid_request", "lifecycle.created_at is required on import",
                            {"field": "lifecycle.created_at"})
        if life.status == "deleted" and life.deleted_at is None:
            raise MempError("invalid_request", "a deleted cell needs lifecycle.deleted_at",
                            {"field": "lifecycle.deleted_at"})
        if cell.identity.created_by is None:
            cell.identity.created_by = agent
        if await self.index.record(cell.id) is not None:
            raise MempError("precondition_failed", f"cell {cell.id} already exists",
                            {"id": cell.id})
        if await self.write(cell, agent, version=None, now=self.clock()) is None:
            raise MempError("precondition_failed", f"cell {cell.id} already exists",
                            {"id": cell.id})
        async with self.store.redis.pipeline(transaction=False) as pipe:
            self.index.save(pipe, cell, cell_key(cell), count=cell.scoring.access_count)
            await pipe.execute()


def _check_visible(cell: MemoryCell, now: int) -> None:
    expires = cell.lifecycle.expires_at
    if expires is not None and parse_time(expires, "expires_at") <= now:
        raise _not_found(cell.id)


def _apply(cell: MemoryCell, patch: CellPatch, now: int) -> None:
    if patch.content is not None:
        if patch.content.text is not None:
            cell.content.text = patch.content.text
        if patch.content.metadata is not None:
            cell.content.metadata = patch.content.metadata
    if patch.scoring is not None:
        for name in ("importance", "confidence", "decay_rate"):
            value = getattr(patch.scoring, name)
            if value is not None:
                setattr(cell.scoring, name, value)
    if patch.access_policy is not None:
        cell.access_policy = patch.access_policy
    expires = patch.expires_at or (patch.lifecycle.expires_at if patch.lifecycle else None)
    if expires is not None:
        expires_ms = parse_time(expires, "expires_at")
        if expires_ms <= now:
            raise MempError("invalid_request", "expires_at must be in the future",
                            {"field": "expires_at"})
        cell.lifecycle.expires_at = iso(expires_ms)
    cell.lifecycle.last_updated_at = iso(now)
