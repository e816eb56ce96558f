"""The lifecycle engine's status changes (CellIndexStore.change_status, amp_status.lua) on both
stores: what a status change records (a new version with its history, change-log and audit
records, the namespace's byte count, the due sets) and what it refuses: a cell written, read or
erased since the engine read it is never overwritten, and nothing is recorded for it."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from broker.amp.cells import (
    CellPatch,
    Content,
    ContentPatch,
    Identity,
    MemoryCell,
    NewCell,
    Scoring,
    iso,
)
from broker.amp.index import due_times
from broker.amp.lifecycle import LifecycleEngine
from broker.amp.service import CellService
from broker.core.models import Grant
from broker.services.auth import Principal
from broker.services.identities import AMP_ENGINE
from broker.storage import Storage, layout
from broker.storage.amp_status import STATUS_CHUNK, StatusChange
from broker.storage.audit import AuditStore
from tests.support.amp import DAY_MS, now_ms

ADMIN = Principal(subject="admin", grants=(Grant("*", ["admin"]),), superuser=True)
STALE_DAYS = 70  # importance 0.6, confidence 1, rate 0.01: stale after 69.3 days
Scenario = Callable[[Storage, CellService], Awaitable[None]]


@pytest.fixture(params=["embedded", "redis"])
def run(request: pytest.FixtureRequest, redis_url: str, ns: str) -> Callable[[Scenario], None]:
    """Run a scenario on a fresh Storage of the store, with a CellService for namespace `ns`."""
    url = None if request.param == "embedded" else redis_url

    def runner(scenario: Scenario) -> None:
        async def main() -> None:
            storage = Storage.open(url, timeout=10.0, history_limit=16,
                                   changelog_maxlen=100_000, idempotency_window_ms=60_000)
            try:
                await scenario(storage, CellService(storage.cells(ns), now_ms))
            finally:
                await storage.close()

        asyncio.run(main())

    return runner


def new_cell(text: str = "a fading memory") -> NewCell:
    return NewCell(type="semantic", content=Content(text=text),
                   identity=Identity(owner_id="u-1", owner_type="user"),
                   scoring=Scoring(importance=0.6, confidence=1.0, decay_rate=0.01))


def client(storage: Storage) -> Any:
    """The store's own client, to look at what it holds."""
    return storage.backend.redis


async def entry(storage: Storage, ns: str, key: str) -> dict[str, str]:
    raw = await client(storage).hgetall(layout.entry(ns, key))
    return {k.decode(): v.decode() for k, v in raw.items()}


async def history(storage: Storage, ns: str, key: str) -> list[dict[str, str]]:
    rows = await client(storage).lrange(layout.history(ns, key), 0, -1)
    return [json.loads(row) for row in rows]


async def audit_records(storage: Storage, ns: str) -> list[dict[str, Any]]:
    """Every audit record, oldest first, after checking the chain: each record's hash matches
    its bytes, names the one before it and counts one more; the head is the last."""
    store = AuditStore(storage.backend)
    chain = await store.chain(ns)
    records = await store.oldest_first(ns, "-", "+", 100_000)
    prev, seq, out = "", 0, []
    for stored in records:
        body = json.loads(stored.body)
        assert hashlib.sha1(stored.body).hexdigest() == stored.hash
        assert (body.get("prev", ""), int(body["seq"])) == (prev, seq + 1)
        prev, seq = stored.hash, seq + 1
        out.append(body)
    assert (chain.head, chain.seq) == (prev, seq)
    return out


def test_a_status_change_is_a_new_version_with_its_history_log_and_audit(
        run: Callable[[Scenario], None], ns: str) -> None:
    count = STATUS_CHUNK + 5  # more than one script call, so the audit chain spans calls

    async def scenario(storage: Storage, cells: CellService) -> None:
        made = [await cells.create(ADMIN, "agent-1", new_cell(f"memory {n}")) for n in range(count)]
        as_of = now_ms() + STALE_DAYS * DAY_MS
        assert (await LifecycleEngine(cells, now_ms).run(as_of))["stale"] == count
        redis = client(storage)
        total = 0
        for cell in made:
            key = f"cells/user/u-1/{cell.id}"
            stored = await entry(storage, ns, key)
            value = json.loads(stored["val"])
            assert (stored["ver"], stored["agent"]) == ("2", AMP_ENGINE)
            assert value["lifecycle"]["status"] == "stale"
            assert value["lifecycle"]["stale_since"] == iso(as_of)
            assert value["content"] == {"text": cell.content.text, "metadata": {}}
            versions = await history(storage, ns, key)
            assert [v["ver"] for v in versions] == ["2", "1"]
            assert versions[0]["val"] == stored["val"]
            assert await redis.zscore(layout.amp_due(ns, "stale"), cell.id) is None
            assert await redis.zscore(layout.amp_due(ns, "archive"), cell.id) == \
                as_of + 30 * DAY_MS
            record = await redis.hmget(layout.amp_cell(ns, cell.id), "status", "ver", "dues")
            assert record == [b"stale", b"2", b"2"]
            total += len(stored["val"])
        usage = await redis.hget(layout.usage(ns), "bytes")
        assert int(usage) == total
        changes = await redis.xrange(layout.changelog(ns), "-", "+")
        stale = [f for _, f in changes if f[b"ver"] == b"2"]
        assert len(stale) == count
        assert all(f[b"type"] == b"put" and b'"status":"stale"' in f[b"val"] for f in stale)
        audits = await audit_records(storage, ns)
        moved = [a for a in audits if a["action"] == "amp-stale"]
        assert len(moved) == count
        first = await entry(storage, ns, f"cells/user/u-1/{made[0].id}")
        assert {k: moved[0][k] for k in ("actor", "version_before", "version_after")} == {
            "actor": AMP_ENGINE, "version_before": "1", "version_after": "2"}
        assert moved[0]["content_hash"] == \
            "sha256:" + hashlib.sha256(first["val"].encode()).hexdigest()

    run(scenario)


async def _decided(cells: CellService, cell_id: str, as_of: int) -> StatusChange:
    """The change to stale the engine would make as of `as_of`, from what it reads now."""
    record, raw = (await cells.index.load([cell_id]))[cell_id]
    cell = msgspec.json.decode(raw[b"val"], type=MemoryCell)
    cell.lifecycle.status = "stale"
    cell.lifecycle.stale_since = iso(as_of)
    return StatusChange(id=cell_id, key=record.key, stored=raw, status="stale",
                        value=msgspec.json.encode(cell), ref=record.ref,
                        dues=due_times(cell, record.ref), recheck=None)


def test_a_patch_after_the_engine_read_the_cell_is_not_lost(
        run: Callable[[Scenario], None], ns: str) -> None:
    async def scenario(storage: Storage, cells: CellService) -> None:
        cell = await cells.create(ADMIN, "agent-1", new_cell("the original text"))
        key = f"cells/user/u-1/{cell.id}"
        as_of = now_ms() + STALE_DAYS * DAY_MS
        change = await _decided(cells, cell.id, as_of)
        await cells.patch(ADMIN, "agent-1", cell.id,
                          CellPatch(content=ContentPatch(text="the patched text")))
        before = (await entry(storage, ns, key), await history(storage, ns, key),
                  await audit_records(storage, ns))
        assert await cells.index.change_status([change], now_ms(), AMP_ENGINE) == [False]
        after = (await entry(storage, ns, key), await history(storage, ns, key),
                 await audit_records(storage, ns))
        assert after == before  # nothing written, recorded or audited
        assert json.loads(after[0]["val"])["lifecycle"]["status"] == "active"
        # The next run decides again, from the patched cell.
        assert (await LifecycleEngine(cells, now_ms).run(as_of))["stale"] == 1
        value = json.loads((await entry(storage, ns, key))["val"])
        assert (value["content"]["text"], value["lifecycle"]["status"]) == (
            "the patched text", "stale")

    run(scenario)


def test_an_erased_cell_is_not_brought_back(run: Callable[[Scenario], None], ns: str) -> None:
    async def scenario(storage: Storage, cells: CellService) -> None:
        cell = await cells.create(ADMIN, "agent-1", new_cell())
        key = f"cells/user/u-1/{cell.id}"
        change = await _decided(cells, cell.id, now_ms() + STALE_DAYS * DAY_MS)
        await storage.entries.erase(ns, [key])
        assert await cells.index.change_status([change], now_ms(), AMP_ENGINE) == [False]
        redis = client(storage)
        assert await redis.exists(layout.entry(ns, key), layout.history(ns, key)) == 0
        assert await redis.zscore(layout.amp_due(ns, "archive"), cell.id) is None

    run(scenario)


def test_a_forged_version_changes_nothing(run: Callable[[Scenario], None], ns: str) -> None:
    # A change naming a version the entry never had, or none: refused, nothing recorded.
    async def scenario(storage: Storage, cells: CellService) -> None:
        cell = await cells.create(ADMIN, "agent-1", new_cell())
        key = f"cells/user/u-1/{cell.id}"
        change = await _decided(cells, cell.id, now_ms() + STALE_DAYS * DAY_MS)
        before = (await entry(storage, ns, key), await audit_records(storage, ns))
        for forged in (b"2", b"0", b"", b"1 ", b"-1"):
            change.stored = {**change.stored, b"ver": forged}
            assert await cells.index.change_status([change], now_ms(), AMP_ENGINE) == [False]
        assert (await entry(storage, ns, key), await audit_records(storage, ns)) == before

    run(scenario)


def test_a_read_after_the_engine_decided_marks_the_cell_for_the_next_run(
        run: Callable[[Scenario], None], ns: str) -> None:
    # A read does not change the version, so the change applies; but the read moved the decay
    # clock since the engine looked, so the cell is marked and the next run brings it back.
    async def scenario(storage: Storage, cells: CellService) -> None:
        made = await cells.create(ADMIN, "agent-1", new_cell())
        created = now_ms()
        change = await _decided(cells, made.id, created + STALE_DAYS * DAY_MS)
        await asyncio.sleep(0.01)  # the read's time is later than the record's
        await cells.read(ADMIN, "agent-1", made.id)
        assert await cells.index.change_status([change], now_ms(), AMP_ENGINE) == [True]
        redis = client(storage)
        assert await redis.sismember(layout.amp_recover(ns), made.id)
        assert (await LifecycleEngine(cells, now_ms).run(now_ms() + 1000))["active"] == 1
        record = await redis.hmget(layout.amp_cell(ns, made.id), "status", "ver")
        assert record == [b"active", b"3"]

    run(scenario)


def test_two_engines_at_once_apply_each_change_once(
        run: Callable[[Scenario], None], ns: str) -> None:
    async def scenario(storage: Storage, cells: CellService) -> None:
        made = [await cells.create(ADMIN, "agent-1", new_cell(f"cell {n}")) for n in range(60)]
        as_of = now_ms() + STALE_DAYS * DAY_MS
        engines = [LifecycleEngine(cells, now_ms, batch=7) for _ in range(3)]
        counts = await asyncio.gather(*(e.run(as_of) for e in engines))
        assert sum(c["stale"] for c in counts) == 60
        for cell in made:
            versions = await history(storage, ns, f"cells/user/u-1/{cell.id}")
            assert [v["ver"] for v in versions] == ["2", "1"]
        assert len([a for a in await audit_records(storage, ns)
                    if a["action"] == "amp-stale"]) == 60

    run(scenario)
