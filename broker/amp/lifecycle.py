"""The AMP lifecycle engine and purge (spec section 3 and 5).

Transitions run off due-time indexes, never a scan of every cell, and each one is a
compare-and-set status change of the cell (a new version, written by amp_status.lua), so engines
on several broker processes never apply one twice."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec

from broker.amp.cells import MemoryCell, iso, parse_time
from broker.amp.index import due_times, index_update, reference_ms, terms_of
from broker.amp.rules import ARCHIVE_AFTER_MS, PURGE_AFTER_MS, STALE_BELOW, decay_score
from broker.amp.service import CellService, loaded_cell, stored_cell
from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.services.audit import AuditService
from broker.services.identities import AMP_ENGINE
from broker.storage.amp import CellRecord, IndexUpdate
from broker.storage.amp_status import StatusChange
from broker.storage.entries import content_hash

log = logging.getLogger("memp.amp")
Decide = Callable[[MemoryCell, CellRecord, int], str | None]
_cell_encoder = msgspec.json.Encoder()


def score_at(cell: MemoryCell, record: CellRecord, as_of: int) -> float:
    scoring = cell.scoring
    reference = max(reference_ms(cell), record.ref)
    return decay_score(scoring.importance, scoring.confidence, scoring.decay_rate,
                       as_of - reference)


def _expire(cell: MemoryCell, record: CellRecord, as_of: int) -> str | None:
    expires = cell.lifecycle.expires_at
    due = expires is not None and parse_time(expires, "expires_at") <= as_of
    return "archived" if due and cell.lifecycle.status in ("active", "stale") else None


def _go_stale(cell: MemoryCell, record: CellRecord, as_of: int) -> str | None:
    active = cell.lifecycle.status == "active"
    return "stale" if active and score_at(cell, record, as_of) < STALE_BELOW else None


def _recover(cell: MemoryCell, record: CellRecord, as_of: int) -> str | None:
    stale = cell.lifecycle.status == "stale"
    return "active" if stale and score_at(cell, record, as_of) >= STALE_BELOW else None


def _archive(cell: MemoryCell, record: CellRecord, as_of: int) -> str | None:
    if cell.lifecycle.status != "stale":
        return None
    since = parse_time(cell.lifecycle.stale_since or cell.lifecycle.created_at or iso(0),
                       "stale_since")
    quiet_since = max(since, reference_ms(cell), record.ref)
    return "archived" if quiet_since + ARCHIVE_AFTER_MS <= as_of else None


class LifecycleEngine:
    """One pass: expiry, active → stale, stale → active, stale → archived."""

    def __init__(self, cells: CellService, clock: Clock, batch: int = 500,
                 in_flight: int = 3, batches_per_scan: int = 20) -> None:
        self.cells = cells
        self.clock = clock
        self.batch = batch
        self.in_flight = in_flight  # batches at once: some decided while others are written
        self.scan = batch * batches_per_scan  # due cells fetched per look at a due index

    async def run(self, as_of: int | None = None) -> dict[str, int]:
        when = self.clock() if as_of is None else as_of
        counts = {"expired": 0, "stale": 0, "active": 0, "archived": 0}
        counts["expired"] = await self._drain("expire", _expire, when)
        counts["stale"] = await self._drain("stale", _go_stale, when)
        counts["active"] = await self._recover(when)
        counts["archived"] = await self._drain("archive", _archive, when)
        return counts

    async def _drain(self, transition: str, decide: Decide, as_of: int) -> int:
        done = 0
        seen: set[str] = set()
        while True:
            due = await self.cells.index.due(transition, as_of, self.scan)
            ids = [i for i in due if i not in seen]
            if not ids:
                return done
            seen.update(ids)
            done += await self._apply_batches(ids, decide, as_of)

    async def _recover(self, as_of: int) -> int:
        done = 0
        seen: set[str] = set()
        while True:
            # Marks are taken off before the cells are looked at, so a read that marks a cell
            # again meanwhile is seen by the next run rather than lost.
            marked = await self.cells.index.take_recovering(self.scan)
            ids = [i for i in marked if i not in seen]
            if not ids:
                return done
            seen.update(ids)
            done += await self._apply_batches(ids, _recover, as_of)

    async def _apply_batches(self, ids: list[str], decide: Decide, as_of: int) -> int:
        """`_apply` on batches of the ids, `in_flight` at a time, so Python and Redis work
        overlap."""
        gate = asyncio.Semaphore(self.in_flight)

        async def apply(batch: list[str]) -> int:
            async with gate:
                return await self._apply(batch, decide, as_of)

        batches = [ids[at:at + self.batch] for at in range(0, len(ids), self.batch)]
        return sum(await asyncio.gather(*map(apply, batches)))

    async def _apply(self, ids: list[str], decide: Decide, as_of: int) -> int:
        """Decide and apply the transitions of one batch in two round trips: the records and
        entries together, then every status change, and the index updates of cells that stay
        as they are."""
        cells = self.cells
        loaded = await cells.index.load(ids)
        now = cells.clock()
        changes: list[StatusChange] = []
        looks: list[IndexUpdate] = []
        for record, raw in loaded.values():
            found = stored_cell(cells.namespace, record, raw, now)
            if found is None:
                continue
            cell, version = found
            ref = max(reference_ms(cell), record.ref)
            target = decide(cell, record, as_of)
            if target is None:
                # The update describes the version loaded: it must not land over a write
                # made since.
                looks.append(index_update(cell, record.key, ref, version=version,
                                          created=False, terms=False))
                continue
            life = cell.lifecycle
            life.status = target  # type: ignore[assignment]
            life.stale_since = iso(as_of) if target == "stale" else None
            changes.append(StatusChange(
                id=cell.id, key=record.key, stored=raw, status=target,
                value=_cell_encoder.encode(cell), ref=ref, dues=due_times(cell, ref),
                recheck=None if target == "stale" else False))
        applied = await cells.index.change_status(changes, now, AMP_ENGINE, looks)
        # A change that lost (another engine, a patch changed the cell) is left for the next
        # run.
        return sum(applied)

    async def run_forever(self, interval: float,
                          observe: Callable[[float, dict[str, int]], None] | None = None
                          ) -> None:
        """A pass every `interval` seconds, each reported to `observe` (its seconds and the
        cells moved to each status); a failure ends the run (the supervisor restarts it)."""
        clock = time.perf_counter
        while True:
            await asyncio.sleep(interval)
            started = clock()
            counts = await self.run()
            if observe is not None:
                observe(clock() - started, counts)
            if any(counts.values()):
                log.info("AMP lifecycle pass: %s", counts)


class Purger:
    """Hard-deletes deleted cells whose 30-day window has passed, only when enabled, leaving
    an erasure receipt for each in the audit log: hashes, never the text."""

    def __init__(self, cells: CellService, clock: Clock, enabled: bool,
                 audit: AuditService) -> None:
        self.cells = cells
        self.clock = clock
        self.enabled = enabled
        self.audit = audit

    async def purge(self, as_of: int | None, ids: list[str] | None,
                    by: dict[str, str] | None = None) -> list[str]:
        if not self.enabled:
            raise MempError("forbidden", "purge is disabled; start the broker with "
                            "AMP_PURGE_RETENTION=1 to allow it")
        now = self.clock()
        if as_of is not None and as_of > now:
            # The window is enforced, not advisory (spec section 5): a purge "as of" a later
            # time would erase tombstones still inside it.
            raise MempError("invalid_request", "purge cannot run as of a time later than now",
                            {"field": "as_of"})
        when = now if as_of is None else as_of
        cells = self.cells
        if ids is None:
            ids = await cells.index.due("purge", when, 10_000)
        loaded = await cells.index.load(ids)
        refused = {}
        texts = {}
        receipts = {}
        for cell_id in ids:
            if cell_id not in loaded:
                refused[cell_id] = "no such cell"
                continue
            record, raw = loaded[cell_id]
            found = loaded_cell(cells.namespace, record, raw, cells.clock())
            entry, cell = found if found is not None else (None, None)
            if cell is None or cell.lifecycle.status != "deleted":
                refused[cell_id] = f"the cell is {record.status}, not deleted"
                continue
            deleted = parse_time(cell.lifecycle.deleted_at or iso(when), "deleted_at")
            if deleted + PURGE_AFTER_MS > when:
                window_ends = iso(deleted + PURGE_AFTER_MS)
                refused[cell_id] = f"inside its retention window until {window_ends}"
                continue
            texts[cell_id] = (record.key, cell.content.text)
            receipts[cell_id] = {
                "cell": cell_id, "version": entry.version if entry else None,
                "content_hash": content_hash(entry.value or b"") if entry else None,
                "text_hash": content_hash(cell.content.text.encode()),
                "deleted_at": cell.lifecycle.deleted_at,
                "rule": "AMP_PURGE_RETENTION: deleted more than 30 days before the purge"}
        if refused:
            raise MempError("precondition_failed", "purge refused; nothing was erased",
                            {"refused": refused})
        if not texts:
            return []
        await cells.index.purge({cell_id: (key, terms_of(text))
                                 for cell_id, (key, text) in texts.items()})
        for cell_id, receipt in sorted(receipts.items()):
            await self.audit.record(cells.namespace, "purge", by or {"actor": "system"},
                                    key=texts[cell_id][0], details=receipt)
        return sorted(texts)
