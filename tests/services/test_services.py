"""The fast layer: services tested in-process against the embedded store, with no sockets and
no threads (the app is built by `create_app` and its lifespan run in the test's own event loop;
REST calls go through httpx's ASGI transport). The contract suite over real HTTP and real Redis
stays the authority; this layer makes a service's rules quick to check, with a clock the test
moves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette

from broker.amp.cells import NewCell
from broker.app import create_app
from broker.core.errors import MempError
from broker.runtime.settings import Settings
from broker.services.auth import Principal
from broker.services.memory import PutOptions
from broker.services.namespaces import NamespaceConfig

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

ADMIN = "services-admin-key-0123456789"
NS = "svc"
T0 = 1_800_000_000_000


class Clock:
    """The broker's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@contextlib.asynccontextmanager
async def running(clock: Clock, **overrides: Any) -> AsyncIterator[Starlette]:
    """A broker app on a fresh embedded store, its lifespan running in this event loop; its
    background loops never run during a test."""
    settings = Settings.from_env(environ={}, admin_key=ADMIN, sweep_interval_seconds=3600,
                                 amp_lifecycle_interval_seconds=3600, **overrides)
    app = create_app(settings, clock=clock)
    async with app.router.lifespan_context(app):
        yield app


def run(scenario: Callable[[Starlette, Clock], Awaitable[None]], **overrides: Any) -> None:
    async def main() -> None:
        clock = Clock()
        async with running(clock, **overrides) as app:
            await scenario(app, clock)

    asyncio.run(main())


async def admin(app: Starlette) -> Principal:
    principal: Principal = await app.state.services.auth.authenticate(f"Bearer {ADMIN}")
    return principal


async def agent(app: Starlette, name: str, namespace: str = NS) -> Principal:
    registration = await app.state.services.agents.register(await admin(app), namespace, name,
                                                            "custom")
    principal: Principal = await app.state.services.auth.authenticate(
        f"Bearer {registration.credentials.api_key}")
    return principal


def raw(value: Any) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(value))


def value_of(entry: Any) -> Any:
    return msgspec.json.decode(entry.value) if entry.value is not None else None


async def put(app: Starlette, who: Principal, key: str, value: Any, **options: Any) -> Any:
    entry, _ = await app.state.services.memory.put(who, NS, key, raw(value), PutOptions(**options))
    return entry


# ---- memory ----


def test_versions_rise_through_puts_and_deletes() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        memory = app.state.services.memory
        assert (await put(app, me, "k", 1)).version == 1
        clock.now += 5
        assert (await put(app, me, "k", 2)).version == 2
        tomb = await memory.delete(me, NS, "k")
        assert (tomb.version, tomb.deleted) == (3, True)
        assert (await put(app, me, "k", 3)).version == 4
        versions = await memory.history(me, NS, "k")
        assert [v.version for v in versions] == [4, 3, 2, 1]

    run(scenario)


def test_an_entry_is_gone_at_its_expiry() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        await put(app, me, "short", "v", ttl_seconds=2)
        clock.now += 1_999
        assert value_of(await app.state.services.memory.get(me, NS, "short")) == "v"
        clock.now += 1
        with pytest.raises(MempError) as gone:
            await app.state.services.memory.get(me, NS, "short")
        assert gone.value.code == "not_found"
        assert await app.state.services.sweeper.sweep_once() == 1
        history = await app.state.services.memory.history(me, NS, "short")
        assert [(v.version, v.deleted) for v in history] == [(2, True), (1, False)]

    run(scenario)


def test_query_pages_in_key_order() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        for n in range(7):
            await put(app, me, f"q/{n}", n)
        await put(app, me, "other", 0)
        seen, cursor = [], None
        while True:
            page = await app.state.services.memory.query(me, NS, "q/*", cursor, 3)
            seen += [e.key for e in page.entries]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [f"q/{n}" for n in range(7)]

    run(scenario)


def test_last_write_wins_refuses_an_older_client_timestamp() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        await put(app, me, "lww", "new", timestamp=T0 - 10)
        with pytest.raises(MempError) as lost:
            await put(app, me, "lww", "old", timestamp=T0 - 20)
        assert lost.value.code == "write_conflict"
        assert value_of(lost.value.details["winner"]) == "new"

    run(scenario)


def test_agent_priority_keeps_the_higher_writer() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        chief, intern = await agent(app, "chief"), await agent(app, "intern")
        config = msgspec.convert({"strategy": "agent-priority", "priorities": [
            {"agent": chief.writer_id, "priority": 10}]}, type=NamespaceConfig)
        await app.state.services.namespaces.save_config(NS, config, by="test", now=T0,
                                               if_revision=None)
        await put(app, chief, "plan", "chief's")
        with pytest.raises(MempError) as lost:
            await put(app, intern, "plan", "intern's")
        assert lost.value.code == "write_conflict"
        assert value_of(await app.state.services.memory.get(chief, NS, "plan")) == "chief's"

    run(scenario)


def test_merge_flags_what_both_sides_changed_since_the_base() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        config = msgspec.convert({"strategy": "merge"}, type=NamespaceConfig)
        await app.state.services.namespaces.save_config(NS, config, by="test", now=T0,
                                               if_revision=None)
        await put(app, me, "doc", {"a": 1, "b": 1})
        await put(app, me, "doc", {"a": 2})
        merged = await put(app, me, "doc", {"a": 3, "c": 1}, base_version=1)
        assert value_of(merged) == {"a": 3, "b": 1, "c": 1}
        conflicts = msgspec.json.decode(merged.conflicts)
        assert [(c["path"], c["base"], c["stored"], c["incoming"]) for c in conflicts] == [
            ("/a", 1, 2, 3)]

    run(scenario)


def test_a_message_id_replays_its_request_and_refuses_another() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        first = await put(app, me, "idem", {"n": 1}, message_id="m-1")
        again = await put(app, me, "idem", {"n": 1}, message_id="m-1")
        assert (again.version, again.id) == (first.version, first.id)
        with pytest.raises(MempError) as reused:
            await put(app, me, "idem", {"n": 2}, message_id="m-1")
        assert reused.value.code == "idempotency_key_reused"
        assert value_of(await app.state.services.memory.get(me, NS, "idem")) == {"n": 1}

    run(scenario)


def test_values_are_stored_canonical() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        entry, _ = await app.state.services.memory.put(
            me, NS, "canon", msgspec.Raw(b'{ "a" :\r\n 1, "a": 2 }'), PutOptions())
        stored = await app.state.services.memory.get(me, NS, "canon")
        assert bytes(entry.value) == bytes(stored.value) == b'{"a":2}'

    run(scenario)


def test_a_token_without_the_grant_changes_nothing() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me, outsider = await admin(app), await agent(app, "outsider", "elsewhere")
        await put(app, me, "kept", "v")
        for attempt in (put(app, outsider, "kept", "x"),
                        app.state.services.memory.delete(outsider, NS, "kept"),
                        app.state.services.memory.get(outsider, NS, "kept")):
            with pytest.raises(MempError) as refused:
                await attempt
            assert refused.value.code == "forbidden"
        assert value_of(await app.state.services.memory.get(me, NS, "kept")) == "v"

    run(scenario)


# ---- the AMP namespace through MEMP ----


def test_memp_paths_show_a_cell_only_to_its_readers_and_never_write_it() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        alice, mallory = await agent(app, "alice", "amp"), await agent(app, "mallory", "amp")
        body = msgspec.convert({"type": "semantic", "content": {"text": "alice's secret"},
                                "identity": {"owner_id": alice.writer_id,
                                             "owner_type": "agent"}}, type=NewCell)
        cell = await app.state.services.amp_cells.create(alice, alice.writer_id, body)
        key = f"cells/agent/{alice.writer_id}/{cell.id}"
        memory = app.state.services.memory
        assert value_of(await memory.get(alice, "amp", key))["id"] == cell.id
        with pytest.raises(MempError) as hidden:
            await memory.get(mallory, "amp", key)
        assert hidden.value.code == "not_found"
        assert (await memory.query(mallory, "amp", "cells/*")).entries == []
        with pytest.raises(MempError) as refused:
            await memory.put(alice, "amp", key, raw({"forged": True}), PutOptions())
        assert refused.value.code == "forbidden" and refused.value.details["use"] == "/amp"

    run(scenario)


# ---- agents and keys ----


def test_removing_an_agent_revokes_its_key() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        me = await admin(app)
        registration = await app.state.services.agents.register(me, NS, "doomed", "custom")
        token = f"Bearer {registration.credentials.api_key}"
        assert (await app.state.services.auth.authenticate(token)).agent_id == registration.agent.id
        await app.state.services.agents.remove(me, NS, registration.agent.id)
        app.state.services.auth.forget()
        with pytest.raises(MempError) as revoked:
            await app.state.services.auth.authenticate(token)
        assert revoked.value.code == "unauthorized"

    run(scenario)


# ---- REST in-process ----


def test_rest_calls_through_the_asgi_transport() -> None:
    async def scenario(app: Starlette, clock: Clock) -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://broker",
                                     headers={"Authorization": f"Bearer {ADMIN}"}) as client:
            created = await client.put(f"/v1/namespaces/{NS}/memory/rest/k",
                                       json={"value": {"plan": "pro"}})
            assert created.status_code == 201 and created.headers["etag"] == '"1"'
            read = await client.get(f"/v1/namespaces/{NS}/memory/rest/k")
            assert read.json()["value"] == {"plan": "pro"}
            bad = await client.put(f"/v1/namespaces/{NS}/memory/rest/k", content=b"{",
                                   headers={"Content-Type": "application/json"})
            assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_json")
            reply = await client.post("/v1/messages", json={
                "memp": "1.0", "type": "memory.get", "namespace": NS, "key": "rest/k"})
            assert reply.json()["entry"]["version"] == 1

    run(scenario)
