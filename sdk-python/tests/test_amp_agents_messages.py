"""The SDK's AMP calls (typed cells, typed errors, X-AMP-Agent-ID from the client's agent),
agent listing and the typed message batch, against a real broker."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from memp import (
    MEMP,
    AccessPolicy,
    Agent,
    AsyncMEMP,
    ConflictError,
    DeleteMessage,
    Forbidden,
    GetMessage,
    InvalidRequest,
    MemoryCell,
    NotFound,
    PutMessage,
    QueryMessage,
)
from tests.support.brokers import ADMIN_KEY, Broker


def register(server: Broker, ns: str, name: str) -> MEMP:
    client = MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url)
    client.register(name, "custom")
    return client


def test_cells_create_read_patch_search_and_their_errors(server: Broker, ns: str) -> None:
    with register(server, ns, "writer") as writer, register(server, ns, "other") as other:
        assert writer.agent is not None
        cell = writer.amp.create("The user prefers Python for backend work", owner_id="u-1",
                                 metadata={"topic": "languages"}, importance=0.8,
                                 access_policy=AccessPolicy(readable_by=["team-*"]))
        assert isinstance(cell, MemoryCell)
        assert cell.identity.created_by == writer.agent.id
        assert (cell.type, cell.lifecycle.status, cell.scoring.importance) == \
            ("semantic", "active", 0.8)
        read = writer.amp.get(cell.id)
        assert read.content.text == cell.content.text and read.scoring.access_count == 1
        patched = writer.amp.patch(cell.id, text="The user prefers Python and Go",
                                   confidence=0.7)
        assert (patched.content.text, patched.scoring.confidence) == \
            ("The user prefers Python and Go", 0.7)
        writer.amp.create("Met the user at the conference", owner_id="u-1", type="episodic")
        found = writer.amp.search("python", owner_id="u-1", owner_type="user", mode="keyword",
                                  min_score=1.0)
        assert [hit.cell.id for hit in found.results] == [cell.id]
        assert found.results[0].score > 0 and found.next_cursor is None
        assert found.degraded is None
        with pytest.raises(InvalidRequest) as floor:
            writer.amp.search("python", min_score=1.5)
        assert floor.value.field == "min_score"
        episodic = writer.amp.search(types=["episodic"], owner_id="u-1", owner_type="user",
                                     created_after=datetime.now(UTC) - timedelta(minutes=5))
        assert [hit.cell.type for hit in episodic.results] == ["episodic"]
        assert writer.amp.search(metadata={"topic": "languages"}).results[0].cell.id == cell.id

        with pytest.raises(Forbidden):  # private to its creator (and team-*)
            other.amp.get(cell.id)
        assert other.amp.search("python").results == []
        with pytest.raises(ConflictError) as refused:  # only archived cells are deleted
            writer.amp.delete(cell.id)
        assert refused.value.cell_status == "active"
        with pytest.raises(InvalidRequest) as invalid:
            writer.amp.patch(cell.id, importance=2.0)
        assert invalid.value.field == "scoring.importance"
        with pytest.raises(NotFound):
            writer.amp.get("01ARZ3NDEKTSV4RRFFQ69G5FAV")


def test_the_acting_agent_is_the_clients_agent(server: Broker, ns: str) -> None:
    """A gateway (the admin key here) acts as the agent it holds, or the one a call names."""
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as gateway:
        with pytest.raises(InvalidRequest) as nobody:
            gateway.amp.create("x", owner_id="u-1")
        assert nobody.value.field == "X-AMP-Agent-ID"
        gateway.agent = Agent(id="agent-alpha", name="alpha", framework="custom",
                              namespace=ns, created_at=0, last_seen=0)
        assert gateway.amp.create("x", owner_id="u-1").identity.created_by == "agent-alpha"
        named = gateway.amp.create("y", owner_id="u-1", agent="agent-beta")
        assert named.identity.created_by == "agent-beta"


def test_cells_import_delete_and_async(server: Broker, ns: str) -> None:
    with register(server, ns, "importer") as writer, \
            MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as admin:
        cell = writer.amp.create("to be forgotten", owner_id="u-2", importance=0.1)
        outside = MemoryCell(**{**{f: getattr(cell, f) for f in MemoryCell.__struct_fields__},
                                "id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"})
        result = admin.amp.import_cells([outside, cell], agent="migrator")
        assert result.imported == 1
        assert [(e.index, e.id, e.error.code) for e in result.errors] == \
            [(1, cell.id, "precondition_failed")]
        # Archive it (two lifecycle passes: stale, then 30 days stale), then delete it.
        now = datetime.now(UTC)
        with httpx.Client(base_url=server.url, timeout=15,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as rest:
            for days in (1, 32):
                as_of = (now + timedelta(days=days)).isoformat()
                assert rest.post("/amp/lifecycle/run", json={"as_of": as_of}).status_code == 200
        gone = writer.amp.delete(cell.id)
        assert gone.lifecycle.status == "deleted"

    async def main() -> None:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as client:
            await client.register("async-writer")
            made = await client.amp.create("async memory", owner_id="u-3")
            assert (await client.amp.get(made.id)).id == made.id
            assert (await client.amp.search("async", mode="keyword")).results[0].cell.id == made.id
            with pytest.raises(ConflictError):
                await client.amp.delete(made.id)

    asyncio.run(main())


def test_cells_merge_into_one_and_the_sources_are_archived(server: Broker, ns: str) -> None:
    with register(server, ns, "merger") as writer:
        first = writer.amp.create("Ana likes green tea", owner_id="u-4")
        second = writer.amp.create("Ana drinks tea every morning", owner_id="u-4")
        assert second.near_duplicates is None or isinstance(second.near_duplicates, list)
        merged = writer.amp.merge([first.id, second.id], "Ana likes tea, every morning",
                                  metadata={"topic": "tea"}, importance=0.8)
        assert merged.identity.owner_id == "u-4"
        assert merged.content.metadata == {"topic": "tea"}
        assert merged.scoring.importance == 0.8
        assert merged.provenance.source_ref == f"{first.id},{second.id}"
        assert writer.amp.get(first.id).lifecycle.status == "archived"
        with pytest.raises(ConflictError) as refused:
            writer.amp.merge([second.id, merged.id], "again")
        assert refused.value.details["field"] == "ids[0]"
        with pytest.raises(InvalidRequest):
            writer.amp.merge([merged.id], "alone")

    async def main() -> None:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as client:
            await client.register("async-merger")
            made = [await client.amp.create(f"async note {n}", owner_id="u-5") for n in range(2)]
            joined = await client.amp.merge([cell.id for cell in made], "async notes")
            assert joined.provenance.source_type == "merge"

    asyncio.run(main())


def test_agents_get_list_and_remove(server: Broker, ns: str) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as admin:
        ids = []
        for n in range(3):
            with register(server, ns, f"agent-{n}") as agent:
                assert agent.agent is not None
                ids.append(agent.agent.id)
        first = admin.agents.list(limit=2)
        assert [a.id for a in first.agents] == ids[:2] and first.next_cursor is not None
        rest = admin.agents.list(cursor=first.next_cursor)
        assert [a.id for a in rest.agents] == ids[2:] and rest.next_cursor is None
        assert admin.agents.get(ids[1]).name == "agent-1"
        admin.agents.remove(ids[1])
        with pytest.raises(NotFound):
            admin.agents.get(ids[1])


def test_a_typed_message_batch(server: Broker, ns: str) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as client:
        replies = client.messages.batch([
            PutMessage(key="customer/1", value={"plan": "pro"}),
            PutMessage(key="customer/2", value={"plan": "free"}, ttl_seconds=60),
            GetMessage(key="customer/1"),
            QueryMessage(pattern="customer/*", limit=1),
            GetMessage(key="missing"),
            DeleteMessage(key="customer/2", namespace=ns),
        ])
        assert [r.type for r in replies] == ["ack", "ack", "result", "result", "error", "ack"]
        assert replies[0].entry is not None and replies[0].entry.version == 1
        assert replies[1].entry is not None and replies[1].entry.ttl_seconds == 60
        assert replies[2].entry is not None and replies[2].entry.value == {"plan": "pro"}
        assert [e.key for e in replies[3].entries or []] == ["customer/1"]
        assert replies[3].next_cursor is not None
        assert all(r.reply_to for r in replies)  # every message was given an id
        with pytest.raises(NotFound):
            replies[4].raise_for_error()
        assert replies[5].raise_for_error().entry.deleted  # type: ignore[union-attr]

    async def main() -> None:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as client:
            replies = await client.messages.batch([GetMessage(key="customer/1")])
            assert replies[0].entry is not None and replies[0].entry.value == {"plan": "pro"}

    asyncio.run(main())
