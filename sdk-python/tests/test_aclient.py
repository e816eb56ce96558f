"""The async client has the sync client's surface, against the same real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from memp import (
    AsyncMEMP,
    AsyncQueryResult,
    ConflictError,
    Event,
    Forbidden,
    Grant,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    Unauthorized,
)


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_the_drafts_calls_with_await(aclient_factory: Callable[..., AsyncMEMP], ns: str
                                     ) -> None:
    async def main() -> None:
        async with aclient_factory() as broker:
            agent = await broker.register(name="my-agent", framework="langchain")
            assert broker.agent == agent and agent.namespace == ns
            assert broker.api_key is not None and broker.api_key.startswith("memp_sk_")
            entry = await broker.memory.put("customer/123", {"plan": "pro", "acv": 12000})
            assert entry.agent_id == agent.id and entry.version == 1
            data = await broker.memory.get("customer/123")
            assert data == {"plan": "pro", "acv": 12000}
            results = await broker.memory.query("customer/*")
            assert [e.key for e in results] == ["customer/123"]
            with pytest.raises(Forbidden):
                await broker.keys.list()

    run(main())


def test_every_memory_call(aclient_factory: Callable[..., AsyncMEMP]) -> None:
    async def main() -> None:
        async with aclient_factory() as broker:
            memory = broker.memory
            for n in range(7):
                await memory.put(f"k/{n}", n, ttl_seconds=600)
            query = memory.query("k/*", page_size=3)
            assert isinstance(query, AsyncQueryResult)
            assert [e.value async for e in query] == list(range(7))
            assert [e.value for e in await query] == list(range(7)), "kept for reuse"
            assert (await query.values())["k/6"] == 6
            page = await memory.page("k/*", limit=5)
            assert len(page.entries) == 5 and page.next_cursor

            entry = await memory.get_entry("k/1")
            assert entry.ttl_seconds == 600 and entry.expires_at is not None
            tombstone = await memory.delete("k/1", if_version=1)
            assert tombstone.deleted and tombstone.version == 2
            assert [v.version for v in await memory.history("k/1")] == [2, 1]
            with pytest.raises(NotFound):
                await memory.get("k/1")
            assert await memory.get("k/1", "fallback") == "fallback"

    run(main())


def test_errors_map_to_the_same_exceptions(aclient_factory: Callable[..., AsyncMEMP]
                                           ) -> None:
    async def main() -> None:
        async with aclient_factory() as broker:
            stored = await broker.memory.put("k", "new", if_absent=True)
            with pytest.raises(PreconditionFailed) as failed:
                await broker.memory.put("k", "again", if_absent=True)
            assert failed.value.current_version == 1
            assert stored.timestamp is not None
            with pytest.raises(ConflictError) as conflict:
                await broker.memory.put("k", "old", timestamp=stored.timestamp - 1)
            assert conflict.value.winner == stored and conflict.value.status == 409
            with pytest.raises(InvalidRequest) as bad:
                await broker.memory.put("bad//key", 1)
            assert bad.value.code == "invalid_key"
        async with aclient_factory(api_key="memp_sk_live_unknown") as stranger:
            with pytest.raises(Unauthorized):
                await stranger.memory.get("k")

    run(main())


def test_keys(aclient_factory: Callable[..., AsyncMEMP], ns: str) -> None:
    async def main() -> None:
        async with aclient_factory() as admin:
            created = await admin.keys.create([Grant(ns, ["read"])], name="async reader")
            assert created.key.id in {k.id for k in await admin.keys.list()}
            await admin.keys.revoke(created.key.id)
            assert created.key.id not in {k.id for k in await admin.keys.list()}

    run(main())


def test_subscribe_yields_typed_events(aclient_factory: Callable[..., AsyncMEMP]) -> None:
    async def main() -> list[Event]:
        async with aclient_factory() as broker, broker.subscribe("live/*") as events:
            await broker.memory.put("live/1", {"n": 1})
            await broker.memory.delete("live/1")
            received = []
            async for event in events:
                received.append(event)
                if len(received) == 2:
                    break
            assert events.last_event_id == received[-1].id
            return received

    put, deleted = run(main())
    assert (put.type, put.key, put.value, put.version) == ("put", "live/1", {"n": 1}, 1)
    assert (deleted.type, deleted.version) == ("delete", 2)


def test_closing_the_client_ends_its_subscriptions(aclient_factory: Callable[..., AsyncMEMP]
                                                   ) -> None:
    async def main() -> list[Event]:
        broker = aclient_factory()
        subscription = await broker.subscribe("*").open()
        received: list[Event] = []
        first = asyncio.Event()

        async def consume() -> None:
            async for event in subscription:
                received.append(event)
                first.set()

        reader = asyncio.create_task(consume())
        await broker.memory.put("x", 1)
        await first.wait()
        await broker.aclose()
        await reader  # ends instead of reconnecting
        return received

    assert [e.key for e in run(main())] == ["x"]
