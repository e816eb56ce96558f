"""AMP operations on cells: create, read, patch, delete, import. Every cell is a MEMP entry in
the AMP namespace at `cells/<owner_type>/<owner_id>/<id>`, written through the MEMP store, so each
change is versioned and reaches MEMP subscribers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from broker.amp.access import AccessCounter
from broker.amp.cells import (
    AMP_VERSION,
    ULID_RE,
    CellPatch,
    Lifecycle,
    MemoryCell,
    NewCell,
    check_policy,
    decode_stored_cell,
    iso,
    new_ulid,
    parse_time,
)
from broker.amp.index import index_update, reference_ms
from broker.amp.rules import can_read, can_write
from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.models import Entry, Proposal
from broker.core.nesting import TooDeep
from broker.services.approval import Proposed
from broker.services.auth import Principal
from broker.services.limits import FairShare
from broker.services.namespaces import NamespaceRegistry
from broker.storage.amp import CellIndexStore, CellRecord, IndexUpdate
from broker.storage.fairshare import Gate, open_gate
from broker.storage.records import (
    CorruptRecord,
    RawHash,
    WriteOutcome,
    WriteRequest,
    live_entry,
    live_value,
    skipped,
)

# A retry happens only when another write to the cell landed in between, so this bounds how
# many concurrent writers a patch outlasts before answering 409 write_conflict.
_CAS_ATTEMPTS = 32


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


def parse_cell(value: bytes, namespace: str, key: str) -> MemoryCell:
    """A stored cell's content; CorruptRecord when it is not one (written past the bridge: a
    hand edit, a restore) or nests too deep to look inside."""
    try:
        return decode_stored_cell(value)
    except (msgspec.MsgspecError, TooDeep) as exc:
        where = f"entry {namespace}/{key}"
        raise CorruptRecord(f"{where}: not an AMP cell: {exc}", where) from None


def decode_cell(entry: Entry) -> MemoryCell:
    if entry.value is None:
        raise MempError("not_found", f"no memory cell at {entry.key!r}")
    return parse_cell(entry.value, entry.namespace, entry.key)


def loaded_cell(namespace: str, record: CellRecord, raw: RawHash, now: int
                ) -> tuple[Entry, MemoryCell] | None:
    """A loaded cell's entry and content; None when it has no live entry or cannot be read
    (logged: one such cell never stops a search, a lifecycle pass or a purge)."""
    try:
        entry = live_entry(namespace, record.key, raw, now)
        return None if entry is None else (entry, decode_cell(entry))
    except CorruptRecord as exc:
        skipped(exc)
        return None


def stored_cell(namespace: str, record: CellRecord, raw: RawHash, now: int
                ) -> tuple[MemoryCell, int] | None:
    """A loaded cell and its version, decoded straight from the stored value (no Entry);
    None when it has no live entry or cannot be read (logged: one such cell never stops a
    pass)."""
    try:
        stored = live_value(record.key, raw, now)
        if stored is None:
            return None
        value, version = stored
        return parse_cell(value, namespace, record.key), version
    except CorruptRecord as exc:
        skipped(exc)
    return None


def loaded_content(namespace: str, record: CellRecord, raw: RawHash, now: int
                   ) -> MemoryCell | None:
    """A loaded cell's content alone, without building its MEMP entry (search looks at
    hundreds at a time); None as for `stored_cell`."""
    found = stored_cell(namespace, record, raw, now)
    return None if found is None else found[0]


class CellGate(Protocol):
    """Where a create or patch goes when the namespace's rules require approval for the cell's
    key (broker/governance/gate.py)."""

    async def requires(self, namespace: str, key: str) -> bool:
        ...

    async def propose_cell(self, agent: str, namespace: str, key: str, cell: MemoryCell,
                           current: Entry | None, action: str, patch: CellPatch | None,
                           limit: Gate) -> Proposal:
        ...


class CellService:
    """Creates and changes cells under AMP's rules, on top of the MEMP store. A caller's
    writes are held to the AMP namespace's limits and the acting agent's own rates
    (docs/limits.md); the lifecycle engine's transitions (`commit`) are not."""

    def __init__(self, index: CellIndexStore, clock: Clock,
                 fair_share: FairShare | None = None,
                 namespaces: NamespaceRegistry | None = None,
                 approvals: CellGate | None = None) -> None:
        self.index = index
        self.namespace = index.namespace
        self.clock = clock
        self.access = AccessCounter(index)
        self.fair_share = fair_share
        self.namespaces = namespaces
        self.approvals = approvals  # where gated creates and patches go

    async def limit(self, by: Principal, agent: str, *, quotas: bool = True, cost: int = 1
                    ) -> Gate:
        """What `agent`'s write (made by `by`) is held to: the AMP namespace's rates and
        quotas (`quotas` False: rates only) and the agent's own rates. A bucket known to be
        closed refuses at once."""
        if self.fair_share is None or self.namespaces is None:
            return open_gate(self.namespace)
        limits = (await self.namespaces.state(self.namespace)).config.limits
        gate = self.fair_share.gate(by, self.namespace, "w", limits, cost, agent, quotas)
        self.fair_share.check_closed(gate, self.clock())
        return gate

    async def check_read(self, by: Principal, agent: str) -> None:
        """Take a read's tokens (a cell read or a search) from `agent`'s and the AMP
        namespace's read buckets, when a read rate applies: one script call."""
        if self.fair_share is None or self.namespaces is None:
            return
        limits = (await self.namespaces.state(self.namespace)).config.limits
        now = self.clock()
        gate = self.fair_share.read_gate(by, self.namespace, limits, now, agent)
        if gate is not None:
            refused = await self.fair_share.store.admit(gate)
            if refused is not None:
                raise self.fair_share.refuse_read(gate, refused, now)

    async def _write(self, change: tuple[IndexUpdate, WriteRequest], gate: Gate) -> bool:
        """Commit one cell's write held to `gate`: whether it landed (False: it lost its
        compare-and-set); a refusal by the gate raises, nothing written."""
        verdict = (await self.index.commit_held([change], gate))[0]
        if isinstance(verdict, WriteOutcome):
            raise self.refusal(verdict, gate)
        return verdict

    def refusal(self, outcome: WriteOutcome, gate: Gate) -> MempError:
        error = self.fair_share.refusal(outcome, gate, self.clock()) if self.fair_share \
            else None
        return error or MempError("internal", f"a cell write was refused: {outcome.status}")

    async def _gated(self, agent: str, key: str, cell: MemoryCell, current: Entry | None,
                     action: str, limit: Gate, patch: CellPatch | None = None) -> None:
        """Raise Proposed (202) when the cell's key requires approval: nothing is written,
        and the proposal takes the write's tokens."""
        if self.approvals is not None and await self.approvals.requires(self.namespace, key):
            raise Proposed(await self.approvals.propose_cell(agent, self.namespace, key, cell,
                                                             current, action, patch, limit))

    async def approval(self, key: str, value: bytes, base_version: int,
                       patch: CellPatch | None, now: int, rebase: bool
                       ) -> tuple[bytes, IndexUpdate]:
        """The cell an approved proposal writes (a patch re-applied to the current cell when
        the proposal is rebased onto a later version) and its index update."""
        cell = msgspec.json.decode(value, type=MemoryCell)
        if base_version == 0:
            return value, index_update(cell, key, reference_ms(cell), count=0)
        record, current, entry = await self.load(cell.id)
        if current.lifecycle.status == "archived":
            raise MempError("write_conflict", "the cell is archived: archived cells cannot "
                            "change", {"status": "archived", "key": key})
        if entry.version != base_version:
            raise MempError("write_conflict", "the cell changed since the proposal was made",
                            {"key": key, "current_version": entry.version})
        if rebase and patch is not None:
            _apply(current, patch, now)
            cell, value = current, msgspec.json.encode(current)
        return value, index_update(cell, record.key, max(reference_ms(cell), record.ref),
                                   recheck=current.lifecycle.status == "stale")

    @staticmethod
    def request(cell: MemoryCell, agent: str, version: int | None, now: int, action: str
                ) -> WriteRequest:
        """A versioned write of the cell: compare-and-set on `version`, None for a new cell
        (only a new entry takes the entry id given); `action` names it in the audit log."""
        return WriteRequest(
            agent_id=agent, now=now, timestamp=now, timestamp_from_client=False,
            value=msgspec.json.encode(cell), entry_id="" if version else str(uuid.uuid4()),
            if_version=version, if_absent=version is None, mode="merge", internal_cas=True,
            actor=agent, action=action,
        )

    async def commit(self, changes: list[tuple[IndexUpdate, WriteRequest | None]]) -> list[bool]:
        """Write cells and update their indexes, in one round trip. A change without a request
        only updates the indexes. Returns, per change, whether it was applied: False where a
        write lost its compare-and-set (the cell changed meanwhile)."""
        return await self.index.commit(changes)

    async def load(self, cell_id: str) -> tuple[CellRecord, MemoryCell, Entry]:
        """A cell that is not deleted, with its index record and MEMP entry."""
        return self.found(cell_id, (await self.index.load([check_id(cell_id)], strict=True)
                                     ).get(cell_id))

    def found(self, cell_id: str, found: tuple[CellRecord, RawHash] | None
               ) -> tuple[CellRecord, MemoryCell, Entry]:
        if found is None or found[0].status == "deleted":
            raise _not_found(cell_id)
        record, raw = found
        entry = live_entry(self.namespace, record.key, raw, self.clock())
        if entry is None:
            raise _not_found(cell_id)
        cell = decode_cell(entry)
        cell.scoring.access_count = record.count
        if record.accessed is not None:
            cell.lifecycle.last_accessed_at = iso(record.accessed)
        return record, cell, entry

    async def create(self, by: Principal, agent: str, body: NewCell,
                     beside: Callable[[MemoryCell], Awaitable[object]] | None = None
                     ) -> MemoryCell:
        """Write a new cell. `beside(cell)`, when given, starts in the same turn as the write,
        after it, so that a call it sends first thing leaves with the write in one round trip
        (storage/pipe.py) and runs after it; it must not raise (near duplicates)."""
        check_policy(body.access_policy)
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
        stamp = iso(now)
        cell = MemoryCell(
            id=new_ulid(now), amp_version=AMP_VERSION, type=body.type, content=body.content,
            identity=identity, scoring=scoring, access_policy=body.access_policy,
            provenance=body.provenance,
            lifecycle=Lifecycle(created_at=stamp, last_updated_at=stamp,
                                expires_at=iso(expires) if expires else None, status="active"),
        )
        limit = await self.limit(by, agent)
        await self._gated(agent, cell_key(cell), cell, None, "amp-create", limit)
        update = index_update(cell, cell_key(cell), now, count=0)
        written = self.request(cell, agent, None, now, "amp-create")
        write = self._write((update, written), limit)
        if beside is None:
            landed = await write
        else:
            # `beside` starts in the next turn, when the write (run here) has queued its call.
            alongside = asyncio.ensure_future(beside(cell))
            try:
                landed = await write
            finally:
                await alongside
        if not landed:
            raise MempError("write_conflict", "a cell with this id already exists; retry")
        return cell

    async def read(self, by: Principal, agent: str, cell_id: str) -> MemoryCell:
        """A read counts: access_count, last_accessed_at, and the decay clock restarts. The
        cell is fetched and, when its record lets the agent read, counted in one call; the
        rules below still decide, and count the read themselves if that call did not. A read
        over its rate is refused before anything is read or counted."""
        check_id(cell_id)
        await self.check_read(by, agent)
        now = self.clock()
        found = await self.index.read(cell_id, agent, now)
        _, cell, _ = self.found(cell_id, found[:2] if found else None)
        _check_visible(cell, now)
        if not can_read(cell, agent):
            raise MempError("forbidden", "the cell's access policy does not let this agent read")
        count = found[2] if found else -1
        if count < 0:
            count = await self.access.count(cell_id, now)
        if count < 0:
            raise _not_found(cell_id)
        cell.scoring.access_count = count
        cell.lifecycle.last_accessed_at = iso(now)
        return cell

    async def patch(self, by: Principal, agent: str, cell_id: str, patch: CellPatch
                    ) -> MemoryCell:
        """A patch takes its tokens once: a retry after a lost compare-and-set is the same
        write."""
        check_policy(patch.access_policy)
        for attempt in range(_CAS_ATTEMPTS):
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
            _apply(cell, patch, now)
            limit = await self.limit(by, agent, cost=0 if attempt else 1)
            await self._gated(agent, record.key, cell, entry, "amp-patch", limit, patch)
            update = index_update(cell, record.key, max(reference_ms(cell), record.ref),
                                 recheck=status == "stale")
            written = self.request(cell, agent, entry.version, now, "amp-patch")
            if await self._write((update, written), limit):
                return cell
        raise MempError("write_conflict", "the cell kept changing; retry the patch")

    async def delete(self, by: Principal, agent: str, cell_id: str) -> MemoryCell:
        """Soft delete: only an archived cell may become `deleted`, which is final. Held to
        the rates, never to the quotas (as a MEMP delete)."""
        for attempt in range(_CAS_ATTEMPTS):
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
            update = index_update(cell, record.key, max(reference_ms(cell), record.ref))
            written = self.request(cell, agent, entry.version, now, "amp-delete")
            limit = await self.limit(by, agent, quotas=False, cost=0 if attempt else 1)
            if await self._write((update, written), limit):
                return cell
        raise MempError("write_conflict", "the cell kept changing; retry the delete")

    async def import_cells(self, by: Principal, agent: str, cells: list[MemoryCell]
                           ) -> list[MempError | None]:
        """Store cells from another system as they were: ids, timestamps, creators, provenance.
        Returns, per cell, why it was refused, or None when it was stored. The batch is checked
        and stored together (one look for existing ids, one round trip of writes); each cell is
        still its own compare-and-set, so a cell imported meanwhile is refused, not replaced,
        and each takes its own write token and room, so a batch crossing a limit stores the
        cells before it and refuses the rest. A cell whose access policy is over its bound
        refuses the whole batch (400), as a malformed body does."""
        for position, cell in enumerate(cells):
            check_policy(cell.access_policy, f"cells[{position}].")
        outcome: list[MempError | None] = [None] * len(cells)
        wanted: dict[str, int] = {}
        for position, cell in enumerate(cells):
            try:
                _check_import(agent, cell)
            except MempError as error:
                outcome[position] = error
                continue
            if cell.id in wanted:
                outcome[position] = _exists(cell.id)
            else:
                wanted[cell.id] = position
        found = await self.index.load(wanted)
        for cell_id in found:
            outcome[wanted.pop(cell_id)] = _exists(cell_id)
        now = self.clock()
        changes: list[tuple[IndexUpdate, WriteRequest | None]] = [
            (index_update(cells[at], cell_key(cells[at]), reference_ms(cells[at]),
                         count=cells[at].scoring.access_count),
             self.request(cells[at], agent, None, now, "amp-import")) for at in wanted.values()]
        limit = await self.limit(by, agent)
        verdicts = await self.index.commit_held(changes, limit)
        for at, stored in zip(wanted.values(), verdicts, strict=True):
            if isinstance(stored, WriteOutcome):
                outcome[at] = self.refusal(stored, limit)
            elif not stored:
                outcome[at] = _exists(cells[at].id)
        return outcome


def _check_import(agent: str, cell: MemoryCell) -> None:
    """Check a cell to import and put its timestamps in the stored form; its creator is the
    importing agent when it names none."""
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


def _exists(cell_id: str) -> MempError:
    return MempError("precondition_failed", f"cell {cell_id} already exists", {"id": cell_id})


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
