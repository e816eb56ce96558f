"""The AMP lifecycle engine and purge (broker/amp/lifecycle.py) over real HTTP on both stores.

Every transition and refusal of the state machine (spec section 3), driven by
`POST /amp/lifecycle/run {"as_of"}` or by a broker whose one clock the test sets; the erasure
rules (spec section 5): purge only with AMP_PURGE_RETENTION=1, never inside the 30-day window,
and afterwards no trace of the cell's text anywhere in the store; and engines on two broker
processes applying each transition once."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import redis

from broker.amp.cells import MemoryCell
from broker.amp.index import index_update
from broker.amp.service import CellService, cell_key
from broker.runtime.settings import Settings, SettingsError
from broker.storage import Storage, layout
from broker.storage.amp import COMMIT_CHUNK
from broker.storage.amp_status import TRANSITIONS
from tests.support.amp import (
    DAY_MS,
    HOUR_MS,
    WAIT,
    Amp,
    Subscription,
    TestClock,
    amp_broker,
    amp_processes,
    clocked_broker,
    error_of,
    iso,
    ms_of,
    now_ms,
    run_threads,
    sync_redis,
    traces,
    wait_posted,
)
from tests.support.brokers import BACKENDS, Broker, BrokerProcess

STALE_AFTER_DAYS = 69.3147  # importance 0.6, confidence 1, rate 0.01: 0.6 e^(-0.01 d) = 0.3


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def amp(backend: str, broker_factory: Callable[..., Broker], ns: str) -> Iterator[Amp]:
    with amp_broker(broker_factory, backend, ns) as client:
        yield client


@pytest.fixture
def purging(backend: str, broker_factory: Callable[..., Broker], ns: str) -> Iterator[Amp]:
    """A broker started with AMP_PURGE_RETENTION=1."""
    with amp_broker(broker_factory, backend, ns, amp_purge_retention=True) as client:
        yield client


@pytest.fixture
def clock() -> TestClock:
    return TestClock()


@pytest.fixture
def clocked(backend: str, redis_url: str, ns: str, clock: TestClock) -> Iterator[Amp]:
    """A broker reading the test's clock, started with AMP_PURGE_RETENTION=1."""
    with clocked_broker(backend, redis_url, ns, clock, amp_purge_retention=True) as client:
        yield client


def created(cell: dict[str, Any]) -> int:
    return ms_of(cell["lifecycle"]["created_at"])


def days(n: float) -> int:
    return int(n * DAY_MS)


def decaying(amp: Amp, text: str = "a fading memory", **fields: Any) -> dict[str, Any]:
    """A cell that goes stale STALE_AFTER_DAYS after it was created."""
    return amp.create(text, scoring={"importance": 0.6, "confidence": 1.0, "decay_rate": 0.01},
                      **fields)


def archived_cell(amp: Amp, text: str = "an old memory", **fields: Any) -> dict[str, Any]:
    cell = decaying(amp, text, **fields)
    amp.run(created(cell) + days(70))
    amp.run(created(cell) + days(101))
    assert amp.status(cell) == "archived"
    return cell


def old_import(amp: Amp, cell_id: str, *, age_days: float, importance: float = 0.6,
               text: str = "imported from the old system", **lifecycle: Any) -> dict[str, Any]:
    """Import a cell created `age_days` ago (so it has decayed for real, on the real clock)."""
    cell = {
        "id": cell_id, "type": "semantic", "content": {"text": text},
        "identity": {"owner_id": "u-1", "owner_type": "user", "created_by": "agent-1"},
        "scoring": {"importance": importance, "confidence": 1.0, "decay_rate": 0.01},
        "lifecycle": {"created_at": iso(now_ms() - days(age_days)), "status": "active",
                      **lifecycle},
    }
    response = amp.import_cells([cell])
    assert response.json() == {"imported": 1, "errors": []}, response.text
    return cell


def new_id() -> str:
    """A ULID for imported cells (time part fixed, random part from a UUID)."""
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = uuid.uuid4().int >> 48
    return "01HQ3Z8X9Y" + "".join(alphabet[(value >> (5 * i)) & 31] for i in reversed(range(16)))


# ---- active → stale ----


def test_active_goes_stale_once_the_score_is_below_point_three(amp: Amp) -> None:
    cell = decaying(amp)
    start = created(cell)
    assert amp.run(start + days(STALE_AFTER_DAYS - 0.01))["stale"] == 0
    assert amp.status(cell) == "active"
    counts = amp.run(start + days(STALE_AFTER_DAYS + 0.01))
    assert counts["stale"] == 1
    stored = amp.stored(cell)
    assert stored["lifecycle"]["status"] == "stale"
    assert stored["lifecycle"]["stale_since"] == iso(start + days(STALE_AFTER_DAYS + 0.01))
    history = amp.history(cell)
    assert [v["version"] for v in history] == [1, 2]
    assert history[1]["agent_id"] == "amp-lifecycle"
    # Running again changes nothing.
    assert amp.run(start + days(STALE_AFTER_DAYS + 0.02)) == {
        "expired": 0, "stale": 0, "active": 0, "archived": 0}
    assert len(amp.history(cell)) == 2


def test_a_pass_applies_every_transition_after_redis_forgets_its_scripts(
        amp: Amp, redis_url: str) -> None:
    # More cells than one script call commits, so the writes go as a pipeline of calls.
    count = COMMIT_CHUNK + 10
    cells = [decaying(amp, f"cell {n}") for n in range(count)]
    client = sync_redis(amp, redis_url)
    try:
        client.script_flush()
        assert amp.run(max(created(c) for c in cells) + days(70))["stale"] == count
    finally:
        client.close()
    assert [amp.status(c) for c in cells] == ["stale"] * count
    assert all(amp.statuses(c) == ["active", "stale"] for c in cells)


def test_a_cell_born_below_the_threshold_goes_stale_on_the_next_run(amp: Amp) -> None:
    cell = amp.create("barely worth keeping", scoring={"importance": 0.5, "confidence": 0.5})
    assert amp.status(cell) == "active"
    amp.run()
    assert amp.status(cell) == "stale"


def test_a_patch_that_lowers_the_score_makes_it_stale_on_the_next_run(amp: Amp) -> None:
    cell = amp.create("overrated", scoring={"importance": 0.9})
    amp.run()
    assert amp.status(cell) == "active"
    assert amp.patch(cell["id"], {"scoring": {"confidence": 0.2}}).status_code == 200
    assert amp.status(cell) == "active"
    amp.run()
    assert amp.status(cell) == "stale"


def test_a_cell_that_does_not_decay_stays_active(amp: Amp) -> None:
    cell = amp.create("an axiom", scoring={"importance": 0.9, "decay_rate": 0.0})
    amp.run(created(cell) + days(50 * 365))
    assert amp.status(cell) == "active"


def test_an_imported_cell_decays_from_its_original_timestamps(amp: Amp) -> None:
    fresh = old_import(amp, new_id(), age_days=60)   # 0.6 e^-0.6 = 0.33
    faded = old_import(amp, new_id(), age_days=80)   # 0.6 e^-0.8 = 0.27
    amp.run()
    assert amp.status(fresh) == "active"
    assert amp.status(faded) == "stale"


def test_the_engine_also_runs_by_itself_on_its_interval(
        backend: str, broker_factory: Callable[..., Broker], ns: str) -> None:
    with amp_broker(broker_factory, backend, ns,
                    amp_lifecycle_interval_seconds=0.2) as amp:
        cell = amp.create("barely worth keeping", scoring={"importance": 0.1})
        deadline = time.monotonic() + WAIT
        while amp.status(cell) != "stale":
            assert time.monotonic() < deadline, "the periodic engine never made the cell stale"
            time.sleep(0.05)


# ---- stale → active ----


def test_a_read_makes_a_stale_cell_active_on_the_next_run_not_before(amp: Amp) -> None:
    cell = old_import(amp, new_id(), age_days=100)  # 0.6 e^-1 = 0.22
    amp.run()
    assert amp.status(cell) == "stale"
    amp.run()
    assert amp.status(cell) == "stale"  # nothing happened: still below 0.3

    read = amp.read(cell["id"])
    assert read["lifecycle"]["status"] == "stale"
    assert amp.status(cell) == "stale"
    assert amp.read(cell["id"])["lifecycle"]["status"] == "stale"
    hits = amp.search(include_stale=True)["results"]
    assert [(h["cell"]["id"], h["cell"]["lifecycle"]["status"]) for h in hits] == [
        (cell["id"], "stale")]
    assert amp.search()["results"] == []

    assert amp.run()["active"] == 1
    assert amp.status(cell) == "active"
    assert amp.statuses(cell) == ["active", "stale", "active"]
    assert [h["cell"]["id"] for h in amp.search()["results"]] == [cell["id"]]


def test_a_read_with_the_as_of_clock_then_the_next_run(amp: Amp) -> None:
    cell = decaying(amp)
    amp.run(created(cell) + days(70))
    assert amp.status(cell) == "stale"
    assert amp.read(cell["id"])["lifecycle"]["status"] == "stale"
    assert amp.status(cell) == "stale"
    amp.run()  # the next run, on the broker's clock, which the read reset the decay to
    assert amp.status(cell) == "active"


def test_a_read_that_leaves_the_score_below_point_three_keeps_it_stale(amp: Amp) -> None:
    cell = amp.create("weak", scoring={"importance": 0.2})
    amp.run()
    assert amp.status(cell) == "stale"
    amp.read(cell["id"])
    amp.run()
    assert amp.status(cell) == "stale"


def test_a_scoring_patch_that_lifts_the_score_reactivates_on_the_next_run(amp: Amp) -> None:
    cell = amp.create("undervalued", scoring={"importance": 0.2})
    amp.run()
    assert amp.status(cell) == "stale"

    text_only = amp.patch(cell["id"], {"content": {"text": "undervalued, reworded"}})
    assert text_only.status_code == 200, text_only.text
    amp.run()
    assert amp.status(cell) == "stale"  # the clock restarted, but 0.2 is still below 0.3

    raised = amp.patch(cell["id"], {"scoring": {"importance": 0.9}})
    assert raised.status_code == 200, raised.text
    assert raised.json()["lifecycle"]["status"] == "stale"
    assert amp.status(cell) == "stale"
    assert amp.run()["active"] == 1
    assert amp.status(cell) == "active"
    assert amp.statuses(cell) == ["active", "stale", "active"]


def test_a_recovered_cell_decays_again_from_its_new_clock(clocked: Amp, clock: TestClock
                                                          ) -> None:
    cell = decaying(clocked)
    clock.advance(days(70))
    clocked.run()
    assert clocked.status(cell) == "stale"
    clocked.read(cell["id"])
    clocked.run()
    assert clocked.status(cell) == "active"
    clock.advance(days(69))
    clocked.run()
    assert clocked.status(cell) == "active"
    clock.advance(days(1))
    clocked.run()
    assert clocked.status(cell) == "stale"


# ---- stale → archived ----


def test_thirty_days_stale_archives(amp: Amp) -> None:
    cell = decaying(amp)
    stale_at = created(cell) + days(70)
    amp.run(stale_at)
    amp.run(stale_at + days(30) - 1)
    assert amp.status(cell) == "stale"
    assert amp.run(stale_at + days(30))["archived"] == 1
    assert amp.status(cell) == "archived"
    assert amp.statuses(cell) == ["active", "stale", "archived"]


def test_a_read_in_the_stale_month_restarts_the_thirty_days(clocked: Amp, clock: TestClock
                                                            ) -> None:
    cell = clocked.create("weak but consulted", scoring={"importance": 0.2})
    clocked.run()
    assert clocked.status(cell) == "stale"
    clock.advance(days(20))
    clocked.read(cell["id"])
    clock.advance(days(20))
    clocked.run()
    assert clocked.status(cell) == "stale"  # 40 days stale, but only 20 without access
    clock.advance(days(10) - 1)
    clocked.run()
    assert clocked.status(cell) == "stale"
    clock.advance(1)
    clocked.run()
    assert clocked.status(cell) == "archived"


def test_a_patch_in_the_stale_month_restarts_the_thirty_days(clocked: Amp, clock: TestClock
                                                             ) -> None:
    cell = clocked.create("weak but edited", scoring={"importance": 0.2})
    clocked.run()
    clock.advance(days(25))
    assert clocked.patch(cell["id"], {"content": {"text": "weak, edited"}}).status_code == 200
    clock.advance(days(25))
    clocked.run()
    assert clocked.status(cell) == "stale"
    clock.advance(days(5))
    clocked.run()
    assert clocked.status(cell) == "archived"


# ---- archived: no way back ----


def test_archived_cells_cannot_be_patched_or_brought_back(amp: Amp) -> None:
    cell = archived_cell(amp)
    before = amp.history(cell)
    response = amp.patch(cell["id"], {"scoring": {"importance": 1.0}})
    assert response.status_code == 409, response.text
    error = error_of(response)
    assert error["code"] == "write_conflict"
    assert error["details"]["status"] == "archived"
    assert "archived" in error["message"]
    revive = amp.patch(cell["id"], {"lifecycle": {"status": "active"}})
    assert revive.status_code in (400, 409), revive.text
    amp.read(cell["id"])  # archived cells can be read, which changes nothing
    amp.run()
    amp.run(created(cell) + days(3650))
    assert amp.history(cell) == before
    assert amp.read(cell["id"])["lifecycle"]["status"] == "archived"


def test_lifecycle_status_can_never_be_patched(amp: Amp) -> None:
    cell = amp.create("active")
    for status in ("active", "stale", "archived", "deleted"):
        response = amp.patch(cell["id"], {"lifecycle": {"status": status}})
        assert response.status_code == 400, response.text
        assert error_of(response)["details"]["field"] == "lifecycle.status"
    stale = amp.create("stale", scoring={"importance": 0.1})
    amp.run()
    assert amp.patch(stale["id"], {"lifecycle": {"status": "active"}}).status_code == 400
    assert amp.status(stale) == "stale"
    assert len(amp.history(cell)) == 1


# ---- delete ----


def test_delete_is_refused_on_active_and_stale_cells_naming_the_status(amp: Amp) -> None:
    active = amp.create("still useful")
    stale = amp.create("fading", scoring={"importance": 0.1})
    amp.run()
    for cell, status in ((active, "active"), (stale, "stale")):
        response = amp.delete(cell["id"])
        assert response.status_code == 409, response.text
        error = error_of(response)
        assert error["code"] == "write_conflict"
        assert error["details"]["status"] == status
        assert status in error["message"]
        assert amp.status(cell) == status
    assert len(amp.history(active)) == 1


def test_delete_of_an_archived_cell_makes_it_deleted_which_is_final(amp: Amp) -> None:
    cell = archived_cell(amp, "the user once lived in lisbon", owner="u-del")
    response = amp.delete(cell["id"])
    assert response.status_code == 200, response.text
    deleted = response.json()
    assert deleted["lifecycle"]["status"] == "deleted"
    assert deleted["lifecycle"]["deleted_at"] is not None
    assert amp.status(cell) == "deleted"  # the tombstone is kept

    assert amp.get(cell["id"]).status_code == 404
    assert amp.patch(cell["id"], {"content": {"text": "x"}}).status_code == 404
    assert amp.patch(cell["id"], {"lifecycle": {"status": "active"}}).status_code in (400, 404)
    assert amp.delete(cell["id"]).status_code == 404
    for body in ({}, {"include_stale": True}, {"status": ["archived"]},
                 {"status": ["active", "stale", "archived"]}, {"query": "lisbon"},
                 {"query": "lisbon", "status": ["archived"]}, {"owner_id": "u-del"},
                 {"owner_id": "u-del", "status": ["archived"]},
                 {"owner_id": "u-del", "query": "lisbon", "status": ["archived"]}):
        assert amp.search_ids(**body) == [], body
    amp.run(created(cell) + days(10_000))
    assert amp.status(cell) == "deleted"
    assert amp.get(cell["id"]).status_code == 404


def test_delete_needs_write_access(amp: Amp) -> None:
    cell = archived_cell(amp, agent="creator", access_policy={"readable_by": ["reader"]})
    assert amp.delete(cell["id"], agent="reader").status_code == 403
    assert amp.status(cell) == "archived"
    assert amp.delete(cell["id"], agent="creator").status_code == 200


# ---- expiry ----


def test_expiry_archives_on_the_next_run(amp: Amp) -> None:
    expires = now_ms() + days(5)
    cell = amp.create("temporary", expires_at=iso(expires))
    amp.run(expires - 1)
    assert amp.status(cell) == "active"
    assert amp.run(expires)["expired"] == 1
    assert amp.status(cell) == "archived"


def test_expiry_archives_a_stale_cell_too(amp: Amp) -> None:
    cell = decaying(amp, expires_at=iso(now_ms() + days(80)))
    amp.run(created(cell) + days(70))
    assert amp.status(cell) == "stale"
    amp.run(created(cell) + days(81))
    assert amp.status(cell) == "archived"


def test_a_patched_expiry_is_the_one_honoured(amp: Amp) -> None:
    cell = amp.create("temporary", expires_at=iso(now_ms() + days(5)))
    later = now_ms() + days(10)
    assert amp.patch(cell["id"], {"expires_at": iso(later)}).status_code == 200
    amp.run(later - HOUR_MS)
    assert amp.status(cell) == "active"
    amp.run(later)
    assert amp.status(cell) == "archived"


def test_an_expired_cell_is_hidden_from_reads_and_search(clocked: Amp, clock: TestClock
                                                         ) -> None:
    cell = clocked.create("until lunch", owner="u-exp", expires_at=iso(clock.now + HOUR_MS))
    assert clocked.get(cell["id"]).status_code == 200
    assert clocked.search_ids(owner_id="u-exp") == [cell["id"]]
    clock.advance(HOUR_MS)
    assert clocked.get(cell["id"]).status_code == 404
    assert clocked.search_ids(owner_id="u-exp") == []
    assert clocked.search_ids(query="lunch") == []
    assert clocked.search_ids(include_stale=True) == []
    clocked.run()
    assert clocked.status(cell) == "archived"
    assert clocked.get(cell["id"]).status_code == 404
    assert clocked.search_ids(status=["archived"]) == []


def test_an_expired_cell_cannot_be_revived_but_can_still_be_erased(
        clocked: Amp, clock: TestClock) -> None:
    cell = clocked.create("until lunch", expires_at=iso(clock.now + HOUR_MS))
    clock.advance(HOUR_MS)
    later = iso(clock.now + 10 * DAY_MS)
    assert clocked.patch(cell["id"], {"expires_at": later}).status_code == 404
    assert clocked.patch(cell["id"], {"content": {"text": "x"}}).status_code == 404
    assert clocked.stored(cell)["lifecycle"]["expires_at"] == cell["lifecycle"]["expires_at"]
    assert clocked.delete(cell["id"]).status_code == 409  # still active until the next run
    clocked.run()
    assert clocked.delete(cell["id"]).status_code == 200
    clock.advance(days(30))
    assert clocked.purge().json() == {"purged": [cell["id"]]}
    assert clocked.entry_response(cell).status_code == 404


def test_an_imported_expired_cell_is_hidden_and_archived(amp: Amp) -> None:
    cell = old_import(amp, new_id(), age_days=3, expires_at=iso(now_ms() - HOUR_MS))
    assert amp.get(cell["id"]).status_code == 404
    assert amp.search_ids(query="imported") == []
    assert amp.run()["expired"] == 1
    assert amp.status(cell) == "archived"


# ---- the due indexes ----


def due_sets(amp: Amp, redis_url: str, cell: dict[str, Any]) -> set[str]:
    """The lifecycle engine's due sets that hold the cell."""
    client = sync_redis(amp, redis_url)
    try:
        return {t for t in TRANSITIONS
                if client.zscore(layout.amp_due(amp.namespace, t), cell["id"]) is not None}
    finally:
        client.close()


def test_a_cell_is_in_exactly_the_due_sets_of_its_status(amp: Amp, redis_url: str) -> None:
    cell = decaying(amp, expires_at=iso(now_ms() + days(200)))
    assert due_sets(amp, redis_url, cell) == {"stale", "expire"}
    amp.run(created(cell) + days(70))
    assert due_sets(amp, redis_url, cell) == {"archive", "expire"}
    amp.run(created(cell) + days(101))
    assert amp.status(cell) == "archived"
    assert due_sets(amp, redis_url, cell) == set()
    assert amp.delete(cell["id"]).status_code == 200
    assert due_sets(amp, redis_url, cell) == {"purge"}


def test_a_record_that_does_not_list_its_due_sets_is_taken_out_of_every_one(
        amp: Amp, redis_url: str) -> None:
    # Records written before they listed their due sets: the update looks in all of them.
    cell = decaying(amp, expires_at=iso(now_ms() + days(200)))
    client = sync_redis(amp, redis_url)
    try:
        assert client.hdel(layout.amp_cell(amp.namespace, cell["id"]), "dues") == 1
    finally:
        client.close()
    amp.run(created(cell) + days(70))
    assert amp.status(cell) == "stale"
    assert due_sets(amp, redis_url, cell) == {"archive", "expire"}


def test_an_index_update_without_a_write_never_lands_over_a_newer_write(
        broker_factory: Callable[..., Broker], redis_url: str, ns: str) -> None:
    # The engine looked at version 1 and found nothing to do; a patch wrote version 2 before
    # the engine's index update arrived. That update describes version 1 and must not land.
    with amp_broker(broker_factory, "redis", ns) as amp:
        cell = decaying(amp)
        seen = msgspec.convert(cell, MemoryCell)
        assert amp.patch(cell["id"], {"scoring": {"importance": 0.9}}).status_code == 200
        due = layout.amp_due(ns, "stale")
        client = redis.Redis.from_url(redis_url)
        try:
            before = client.zscore(due, cell["id"])

            async def look(version: int) -> None:
                storage = Storage.open(redis_url, timeout=5.0, history_limit=16,
                                       changelog_maxlen=100_000, idempotency_window_ms=60_000)
                try:
                    cells = CellService(storage.cells(ns), now_ms)
                    await cells.commit([(index_update(seen, cell_key(seen), created(cell),
                                                      version=version, created=False,
                                                      terms=False), None)])
                finally:
                    await storage.close()

            asyncio.run(look(1))
            assert client.zscore(due, cell["id"]) == before
            # The same update for the version the entry holds does land.
            asyncio.run(look(2))
            landed = client.zscore(due, cell["id"])
            assert landed is not None
            assert abs(landed - (created(cell) + days(STALE_AFTER_DAYS))) < 60_000
        finally:
            client.close()


# ---- purge ----


def test_purge_is_opt_in_with_amp_purge_retention() -> None:
    """Off unless asked for; a value that is not a yes or a no stops the start rather than
    leaving purges silently off (or on). tests/runtime/test_settings.py has the MEMP_ name too."""
    for value in ("1", "true", "yes"):
        assert Settings.from_env(environ={"AMP_PURGE_RETENTION": value}).amp_purge_retention
    for value in ("0", "false", "no", ""):
        assert not Settings.from_env(environ={"AMP_PURGE_RETENTION": value}).amp_purge_retention
    assert not Settings.from_env(environ={}).amp_purge_retention
    with pytest.raises(SettingsError, match="AMP_PURGE_RETENTION must be one of"):
        Settings.from_env(environ={"AMP_PURGE_RETENTION": "enabled"})


def test_purge_is_refused_without_amp_purge_retention(amp: Amp) -> None:
    cell = old_import(amp, new_id(), age_days=90, status="deleted",
                      deleted_at=iso(now_ms() - days(60)))
    for body in ({}, {"ids": [cell["id"]]}):
        response = amp.http.post("/amp/purge", json=body)
        assert response.status_code == 403, response.text
        assert "AMP_PURGE_RETENTION" in error_of(response)["message"]
    assert amp.status(cell) == "deleted"
    assert len(amp.history(cell)) == 1


def test_purge_is_refused_inside_the_window_and_erases_nothing(purging: Amp,
                                                                redis_url: str) -> None:
    marker = f"marker{uuid.uuid4().hex}"
    recent = archived_cell(purging, f"recently deleted {marker}")
    assert purging.delete(recent["id"]).status_code == 200
    old = old_import(purging, new_id(), age_days=90, text=f"long deleted {marker}",
                     status="deleted", deleted_at=iso(now_ms() - days(31)))
    active = purging.create(f"active {marker}")
    client = sync_redis(purging, redis_url)
    wait_posted(client, purging.namespace)
    before = traces(client, marker)
    assert before

    response = purging.purge([recent["id"]])
    assert response.status_code == 412, response.text
    error = error_of(response)
    assert error["code"] == "precondition_failed"
    assert "window" in error["details"]["refused"][recent["id"]]
    for ids in ([old["id"], recent["id"]], [active["id"]], [old["id"], active["id"]],
                ["01HQ3Z8X9Y0000000000000099"]):
        assert purging.purge(ids).status_code == 412, ids
    # A purge "as of" a later time would reach inside the window: refused.
    late = purging.purge([recent["id"]], as_of=now_ms() + days(31))
    assert late.status_code == 400, late.text
    assert error_of(late)["details"]["field"] == "as_of"
    assert traces(client, marker) == before
    assert purging.status(recent) == "deleted"
    assert purging.status(old) == "deleted"

    # A purge of everything due takes only what is past its window.
    assert purging.purge().json() == {"purged": [old["id"]]}
    assert purging.status(recent) == "deleted"
    assert purging.entry_response(old).status_code == 404


def test_purge_after_the_window_leaves_no_trace(clocked: Amp, clock: TestClock,
                                                redis_url: str) -> None:
    marker = f"marker{uuid.uuid4().hex}"
    keeper = clocked.create("the user likes green tea", owner="u-gdpr")
    cell = clocked.create(f"the user's passport number is {marker}", owner="u-gdpr",
                          provenance={"source_ref": f"chat/{marker}"})
    cell_id = cell["id"]
    clocked.read(cell_id)
    assert clocked.patch(cell_id, {"content": {"text": f"passport {marker} renewed",
                                               "metadata": {"note": marker}}}
                         ).status_code == 200
    clock.advance(days(200))
    clocked.run()
    clock.advance(days(31))
    clocked.run()
    assert clocked.status(cell) == "archived"
    client = sync_redis(clocked, redis_url)
    wait_posted(client, clocked.namespace)
    assert any(":amp:term:" in t for t in traces(client, marker))  # the search index
    assert clocked.delete(cell_id).status_code == 200
    wait_posted(client, clocked.namespace)

    found = traces(client, marker)
    assert any(":e:" in t for t in found), found   # the entry
    assert any(":h:" in t for t in found), found   # its history
    assert any(":log" in t for t in found), found  # the change log

    clock.advance(days(29))
    assert clocked.purge([cell_id]).status_code == 412
    assert traces(client, marker) == found
    clock.advance(days(1))
    response = clocked.purge()
    assert response.status_code == 200, response.text
    assert response.json() == {"purged": [cell_id]}

    assert traces(client, marker) == []
    assert client.exists(f"memp:{{{clocked.namespace}}}:amp:cell:{cell_id}") == 0
    # An erasure receipt: what, when, by whom, under which rule; hashes, never the text.
    audit = clocked.http.get(f"/v1/namespaces/{clocked.namespace}/audit").json()["records"]
    receipt = next(r for r in audit if r["action"] == "purge")
    assert receipt["details"]["cell"] == cell_id and receipt["actor"] == "admin"
    assert receipt["details"]["text_hash"].startswith("sha256:")
    assert "AMP_PURGE_RETENTION" in receipt["details"]["rule"]
    assert marker not in str(audit) and "passport" not in str(audit)
    assert {"amp-create", "amp-patch", "amp-archived", "amp-delete"} <= {
        r["action"] for r in audit}
    assert clocked.http.get(f"/v1/namespaces/{clocked.namespace}/audit/verify").json()["ok"]
    # Through the APIs: gone from AMP and MEMP, its history and its change-log events.
    assert clocked.get(cell_id).status_code == 404
    assert clocked.entry_response(cell).status_code == 404
    assert clocked.history(cell) == []
    assert clocked.search_ids(query="passport", status=["active", "stale", "archived"]) == []
    assert clocked.purge([cell_id]).status_code == 412  # nothing left to purge
    replay = Subscription(clocked.url, {"namespace": clocked.namespace, "pattern": "*"},
                          last_event_id=f"{clocked.namespace}:0-0").wait_open()
    try:
        replay.wait_for(lambda name, data: name == "put"
                        and data["key"].endswith(keeper["id"]), "the other cell's create")
        assert all(marker not in str(data) and cell_id not in str(data)
                   for _, data in replay.events)
    finally:
        replay.close()
    # The owner's other cell is untouched.
    assert clocked.read(keeper["id"])["content"]["text"] == "the user likes green tea"


def test_purge_of_an_imported_tombstone_past_its_window(purging: Amp, redis_url: str) -> None:
    marker = f"marker{uuid.uuid4().hex}"
    cell = old_import(purging, new_id(), age_days=400, text=f"old secret {marker}",
                      status="deleted", deleted_at=iso(now_ms() - days(30) - HOUR_MS))
    client = sync_redis(purging, redis_url)
    assert traces(client, marker)
    assert purging.get(cell["id"]).status_code == 404
    response = purging.purge([cell["id"]])
    assert response.status_code == 200, response.text
    assert response.json() == {"purged": [cell["id"]]}
    assert traces(client, marker) == []
    assert purging.history(cell) == []


# ---- several broker processes ----


def test_engines_on_two_processes_apply_each_transition_once(
        broker_processes: Callable[..., list[BrokerProcess]], ns: str) -> None:
    first, second = amp_processes(broker_processes, ns)
    with Amp(first.url, ns) as one, Amp(second.url, ns) as two:
        cells = [decaying(one if i % 2 else two, f"cell {i}") for i in range(60)]
        start = max(created(c) for c in cells)
        totals: dict[str, int] = {"stale": 0, "archived": 0}
        lock = threading.Lock()

        def runs(client: Amp, as_of: int) -> None:
            for _ in range(3):
                counts = client.run(as_of)
                with lock:
                    for name in totals:
                        totals[name] += counts[name]

        for as_of in (start + days(70), start + days(101)):
            threads = [threading.Thread(target=runs, args=(c, as_of)) for c in (one, two)]
            run_threads(threads)
        assert totals == {"stale": 60, "archived": 60}
        for cell in cells:
            history = one.history(cell)
            statuses = [v["value"]["lifecycle"]["status"] for v in history]
            assert statuses == ["active", "stale", "archived"], (cell["id"], statuses)
            assert [v["version"] for v in history] == [1, 2, 3]


def test_reads_on_two_processes_each_count_once(
        broker_processes: Callable[..., list[BrokerProcess]], ns: str) -> None:
    first, second = amp_processes(broker_processes, ns)
    with Amp(first.url, ns) as one, Amp(second.url, ns) as two:
        cell = one.create("read from everywhere at once")
        counts: list[int] = []
        lock = threading.Lock()

        def reads(client: Amp) -> None:
            with Amp(client.url, ns) as own:  # a connection per thread: reads overlap
                for _ in range(25):
                    count = own.read(cell["id"])["scoring"]["access_count"]
                    with lock:
                        counts.append(count)

        threads = [threading.Thread(target=reads, args=(c,)) for c in (one, two) * 4]
        run_threads(threads)
        # Reads that shared a round trip still got counts of their own: 1..200, once each.
        assert sorted(counts) == list(range(1, 201))
        assert two.search(owner_id="u-1")["results"][0]["cell"]["scoring"]["access_count"] == 200


def test_patches_on_two_processes_leave_the_index_matching_the_cell(
        broker_processes: Callable[..., list[BrokerProcess]], redis_url: str, ns: str) -> None:
    first, second = amp_processes(broker_processes, ns)
    with Amp(first.url, ns) as one, Amp(second.url, ns) as two:
        cell = one.create("original wording")
        applied: list[str] = []
        lock = threading.Lock()

        def patches(client: Amp, word: str) -> None:
            with Amp(client.url, ns) as own:
                for n in range(15):
                    response = own.patch(cell["id"], {"content": {"text": f"{word}{n} text"}})
                    # Under this much contention a patch may give up after its retries.
                    assert response.status_code in (200, 409), response.text
                    if response.status_code == 200:
                        with lock:
                            applied.append(f"{word}{n}")

        threads = [threading.Thread(target=patches, args=(c, w))
                   for c, w in ((one, "alpha"), (two, "beta"), (one, "gamma"), (two, "delta"))]
        run_threads(threads)
        final = one.read(cell["id"])["content"]["text"]
        assert [v["version"] for v in one.history(cell)][-1] == 1 + len(applied)
        assert final.split()[0] in applied
    # Each word's term set holds the cell exactly while the cell's text has the word.
    client = redis.Redis.from_url(redis_url)
    try:
        wait_posted(client, ns)
        for word in ["original", "wording", *applied]:
            held = client.sismember(layout.amp_term(ns, word), cell["id"])
            assert bool(held) == (word in final.split()), word
        assert client.sismember(layout.amp_term(ns, "text"), cell["id"])
    finally:
        client.close()


def test_patches_racing_engines_on_two_processes_are_never_lost(
        broker_processes: Callable[..., list[BrokerProcess]], ns: str) -> None:
    # Each cell is patched over and over through one process while engines on both processes
    # turn cells stale: every patch that answered 200 is in the history, the last one is the
    # stored text, and each cell went stale exactly once.
    first, second = amp_processes(broker_processes, ns)
    with Amp(first.url, ns) as one, Amp(second.url, ns) as two:
        cells = [decaying(one, f"cell {i} v0") for i in range(8)]
        as_of = max(created(c) for c in cells) + days(70)
        applied: dict[str, list[str]] = {c["id"]: [] for c in cells}
        moved = [0]
        lock = threading.Lock()

        def patches(cell: dict[str, Any]) -> None:
            with Amp(first.url, ns) as own:
                for n in range(1, 9):
                    text = f"{cell['id']} v{n}"
                    response = own.patch(cell["id"], {"content": {"text": text}})
                    assert response.status_code in (200, 409), response.text
                    if response.status_code == 200:
                        applied[cell["id"]].append(text)

        def engine(client: Amp) -> None:
            with Amp(client.url, ns) as own:
                for _ in range(6):
                    counts = own.run(as_of)
                    with lock:
                        moved[0] += counts["stale"]

        threads = [threading.Thread(target=patches, args=(c,)) for c in cells]
        threads += [threading.Thread(target=engine, args=(c,)) for c in (one, two)]
        run_threads(threads)
        moved[0] += one.run(as_of)["stale"]  # a cell whose change lost to its last patch
        for cell in cells:
            history = one.history(cell)
            texts = [v["value"]["content"]["text"] for v in history]
            assert [t for t in applied[cell["id"]] if t not in texts] == []
            assert one.stored(cell)["content"]["text"] == (applied[cell["id"]] or
                                                           [f"cell {cells.index(cell)} v0"])[-1]
            assert one.statuses(cell) == ["active", "stale"], one.statuses(cell)
            assert [v["version"] for v in history] == list(range(1, len(history) + 1))
        assert moved[0] == len(cells)
