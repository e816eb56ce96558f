"""TTL expiry: entries vanish from reads at expiry, and each expiry is logged exactly once, even
with several broker processes sweeping the same Redis."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import cast

import httpx
import pytest
import redis

from broker.governance.sweeper import ExpirySweeper
from broker.storage import layout
from broker.storage.entries import EntryStore
from broker.storage.records import WriteRequest
from tests.support.brokers import (
    ADMIN_KEY,
    BACKENDS,
    Broker,
    BrokerProcess,
    RedisServer,
    open_storage,
    read_changelog,
    start_broker,
)
from tests.support.clients import sync_client
from tests.support.waiting import wait_until

HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def records_for(log: list[dict[str, str]], key: str) -> list[tuple[str, int]]:
    return [(r["type"], int(r["ver"])) for r in log if r["key"] == key]


@pytest.fixture
def isolated_broker(request: pytest.FixtureRequest, private_redis: RedisServer
                    ) -> Iterator[Broker]:
    """A broker that never sweeps, alone on its store (no other process's sweeper either)."""
    handle = start_broker(request.param, private_redis.url, sweep_interval_seconds=3600)
    yield handle
    handle.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_entry_is_gone_at_expiry_and_expires_once(
    broker_factory: Callable[..., Broker], ns: str, backend: str
) -> None:
    broker = broker_factory(backend, sweep_interval_seconds=0.02)
    data = sync_client(broker)
    with broker.client() as client:
        put = client.put(f"/v1/namespaces/{ns}/memory/short",
                         json={"value": "soon gone", "ttl_seconds": 1})
        assert put.status_code == 201
        expires_at = put.json()["expires_at"]
        assert expires_at == put.json()["updated_at"] + 1000
        client.put(f"/v1/namespaces/{ns}/memory/long", json={"value": "stays"})
        # Poll across the expiry: a read answered before it sees the entry, one sent after
        # it does not, whether or not the sweeper has been by.
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "the entry never expired"
            sent = now_ms()
            got = client.get(f"/v1/namespaces/{ns}/memory/short")
            answered = now_ms()
            if answered < expires_at:
                assert got.status_code == 200
            if sent > expires_at:
                assert got.status_code == 404
                assert got.json()["error"]["code"] == "not_found"
                break
            time.sleep(0.01)
        page = client.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}).json()
        assert [e["key"] for e in page["entries"]] == ["long"]

    def expired() -> bool:
        return ("expire", 2) in records_for(read_changelog(data, ns), "short")

    wait_until(expired, "the entry to expire", timeout=10)
    time.sleep(0.2)  # ten more sweeps: none may log it again
    log = read_changelog(data, ns)
    assert records_for(log, "short") == [("put", 1), ("expire", 2)]
    assert records_for(log, "long") == [("put", 1)]
    expire = next(r for r in log if r["type"] == "expire")
    assert "val" not in expire and expire["id"] == put.json()["id"]
    assert data.zcard(layout.expiries(ns)) == 0
    assert data.zrange(layout.index(ns), 0, -1) == [b"long"]
    data.close()


def test_two_sweeping_processes_expire_5000_keys_once_each(
    broker_processes: Callable[..., list[BrokerProcess]], redis_url: str, ns: str
) -> None:
    total, per_batch = 5000, 100
    brokers = broker_processes(2, MEMP_SWEEP_INTERVAL_SECONDS="0.01")
    keys = [f"session/{i:05d}" for i in range(total)]
    clients = [httpx.Client(base_url=b.url, headers=HEADERS, timeout=30) for b in brokers]
    try:
        for n, start in enumerate(range(0, total, per_batch)):
            batch = [{"memp": "1.0", "type": "memory.put", "id": f"p-{i}", "namespace": ns,
                      "key": keys[i], "value": i, "ttl_seconds": 1}
                     for i in range(start, start + per_batch)]
            reply = clients[n % 2].post("/v1/messages", json=batch)
            assert reply.status_code == 200
            assert [r["type"] for r in reply.json()] == ["ack"] * per_batch, reply.text[:500]
    finally:
        for client in clients:
            client.close()

    data = redis.Redis.from_url(redis_url)
    try:
        def logged() -> int:
            return int(data.xlen(layout.changelog(ns)))

        wait_until(lambda: logged() >= 2 * total, "every write in the log", timeout=60, step=0.1)
        time.sleep(0.2)  # both processes sweep ~20 more times; nothing may be logged again
        log = read_changelog(data, ns)
        found = Counter(r["key"] for r in log if r["type"] == "expire")
        assert sorted(found) == keys
        assert max(found.values()) == 1, "an expiry was logged twice"
        assert Counter(r["type"] for r in log) == {"put": total, "expire": total}
        assert {r["ver"] for r in log if r["type"] == "expire"} == {"2"}
        assert data.zcard(layout.expiries(ns)) == 0
        assert data.zcard(layout.index(ns)) == 0
    finally:
        data.close()


@pytest.mark.parametrize("isolated_broker", BACKENDS, indirect=True)
def test_write_on_expired_unswept_key_logs_the_expiry_first(
    isolated_broker: Broker, ns: str
) -> None:
    data = sync_client(isolated_broker)
    with isolated_broker.client() as client:
        put = client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1, "ttl_seconds": 1})
        gone = client.put(f"/v1/namespaces/{ns}/memory/d", json={"value": 1, "ttl_seconds": 1})
        cas = client.put(f"/v1/namespaces/{ns}/memory/c", json={"value": 1, "ttl_seconds": 1})
        expires_at = max(r.json()["expires_at"] for r in (put, gone, cas))
        time.sleep(max(expires_at - now_ms() + 5, 0) / 1000)
        assert read_changelog(data, ns)[-1]["type"] == "put", "nothing swept (interval 1 h)"

        again = client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 2})
        assert again.status_code == 201, "the expired entry is gone: this creates a new one"
        assert again.json()["version"] == 3
        assert again.json()["id"] != put.json()["id"]
        deleted = client.delete(f"/v1/namespaces/{ns}/memory/d")
        assert deleted.status_code == 404
        stale = client.put(f"/v1/namespaces/{ns}/memory/c", json={"value": 2},
                           headers={"If-Match": '"1"'})
        assert stale.status_code == 412
        assert stale.json()["error"]["details"]["current_version"] == 2
    log = read_changelog(data, ns)
    assert records_for(log, "k") == [("put", 1), ("expire", 2), ("put", 3)]
    expire = next(r for r in log if r["key"] == "k" and r["type"] == "expire")
    assert int(expire["ua"]) == again.json()["updated_at"], "the put itself logged the expiry"
    assert records_for(log, "d") == [("put", 1), ("expire", 2)]
    assert records_for(log, "c") == [("put", 1), ("expire", 2)]
    data.close()


# ---- ExpirySweeper.sweep_once on an EntryStore, with a clock the test controls ----


@contextlib.asynccontextmanager
async def open_store(url: str | None) -> AsyncIterator[EntryStore]:
    async with open_storage(url) as storage:
        yield storage.entries


async def expired_keys(store: EntryStore, ns: str) -> list[str]:
    """Keys of the namespace's `expire` records, in log order."""
    records = cast(list[tuple[bytes, dict[bytes, bytes]]],
                   await store.redis.xrange(layout.changelog(ns), "-", "+"))
    return [f[b"key"].decode() for _, f in records if f[b"type"] == b"expire"]


def sweeper(store: EntryStore, now: int, batch: int) -> ExpirySweeper:
    return ExpirySweeper(store, lambda: now, interval=3600, batch=batch)


async def put_ttl(store: EntryStore, ns: str, key: str, now: int, ttl: int | None) -> None:
    outcome = await store.put(ns, key, WriteRequest(
        agent_id="tester", now=now, timestamp=now, timestamp_from_client=False,
        value=b'"v"', entry_id=f"id-{key}", ttl_seconds=ttl))
    assert outcome.status == "ok"


def test_concurrent_sweep_once_calls_expire_each_entry_once(store_url: str | None,
                                                            ns: str) -> None:
    async def scenario(store: EntryStore) -> None:
        t0 = 1_700_000_000_000
        due = [f"due/{i:04d}" for i in range(500)]
        for key in due:
            await put_ttl(store, ns, key, t0, 1)
        await put_ttl(store, ns, "later", t0, 3600)
        await put_ttl(store, ns, "forever", t0, None)
        assert await sweeper(store, t0 + 999, 40).sweep_once() == 0, "nothing is due yet"
        # Six sweepers at once, batches smaller than the backlog, all past the expiry.
        counts = await asyncio.gather(*(sweeper(store, t0 + 1000, 40).sweep_once()
                                        for _ in range(6)))
        assert sum(counts) == len(due)
        assert await sweeper(store, t0 + 5000, 40).sweep_once() == 0
        expired = Counter(await expired_keys(store, ns))
        assert sorted(expired) == due and set(expired.values()) == {1}
        assert await store.get(ns, "later", t0 + 5000) is not None
        assert await store.get(ns, "forever", t0 + 5000) is not None
        assert await store.redis.zrange(layout.expiries(ns), 0, -1) == [b"later"]
        history = await store.history(ns, "due/0000", 4)
        assert [(e.version, e.deleted) for e in history] == [(2, True), (1, False)]

    async def main() -> None:
        async with open_store(store_url) as store:
            await scenario(store)

    asyncio.run(main())


def test_sweep_skips_entries_rewritten_before_the_sweep(store_url: str | None, ns: str) -> None:
    async def scenario(store: EntryStore) -> None:
        t0 = 1_700_000_000_000
        for key in ("renewed", "persisted", "deleted"):
            await put_ttl(store, ns, key, t0, 1)
        await put_ttl(store, ns, "renewed", t0 + 500, 10)
        await put_ttl(store, ns, "persisted", t0 + 500, None)
        await store.delete(ns, "deleted", WriteRequest(
            agent_id="tester", now=t0 + 500, timestamp=t0 + 500, timestamp_from_client=False))
        assert await sweeper(store, t0 + 2000, 10).sweep_once() == 0
        assert await expired_keys(store, ns) == []
        assert await store.redis.zrange(layout.expiries(ns), 0, -1) == [b"renewed"]
        assert await sweeper(store, t0 + 10_500, 10).sweep_once() == 1

    async def main() -> None:
        async with open_store(store_url) as store:
            await scenario(store)

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_busy_sweeper_does_not_hold_up_shutdown(
    backend: str, redis_url: str, ns: str
) -> None:
    # Sweeping back to back keeps the sweeper inside Redis calls, where a cancel can be lost.
    for _ in range(2):
        broker = start_broker(backend, redis_url, sweep_interval_seconds=0.001)
        with broker.client() as client:
            client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1, "ttl_seconds": 60})
        time.sleep(0.2)
        broker.stop()
        assert not broker.thread.is_alive(), "the broker did not finish shutting down"
