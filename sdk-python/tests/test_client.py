"""The sync client against a real broker on real Redis: every call, typed results, errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import msgspec
import pytest

import broker.core.models as wire
import broker.schemas.compile as wire_schemas
import broker.services.namespaces as wire_namespaces
from broker.schemas.compile import SchemaErrorDetail
from broker.services.conflicts import Conflict as BrokerConflict
from memp import (
    MEMP,
    Conflict,
    ConflictError,
    Entry,
    Forbidden,
    Grant,
    InvalidRequest,
    NamespaceConfig,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    PriorityRule,
    QueryResult,
    SchemaError,
    SchemaRecord,
    SchemaViolation,
    SchemaViolationWarning,
    Share,
    StoredConfig,
    StrategyRule,
    Unauthorized,
)
from tests.support.brokers import ADMIN_KEY, Broker

# The MEMP draft, "SDK Reference -> Python", line for line.
DRAFT_EXAMPLE = '''\
from memp import MEMP

broker = MEMP(api_key="memp_sk_live_...", namespace="my-app")

broker.register(name="my-agent", framework="langchain")
broker.memory.put("customer/123", {"plan": "pro", "acv": 12000})
data = broker.memory.get("customer/123")
results = broker.memory.query("customer/*")
'''
README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_drafts_example_runs_as_written(server: Broker, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """The example runs verbatim; only the placeholder key becomes a real one, and the base URL
    comes from MEMP_BASE_URL."""
    with MEMP(api_key=ADMIN_KEY, base_url=server.url) as admin:
        created = admin.keys.create([Grant("my-app", ["read", "write", "subscribe"])],
                                    name="draft example")
    monkeypatch.setenv("MEMP_BASE_URL", server.url)
    assert DRAFT_EXAMPLE in README.read_text(), "the SDK README must open with the example"
    scope: dict[str, object] = {}
    exec(DRAFT_EXAMPLE.replace("memp_sk_live_...", created.api_key), scope)

    broker = scope["broker"]
    assert isinstance(broker, MEMP)
    assert broker.agent is not None and broker.agent.name == "my-agent"
    assert broker.agent.framework == "langchain" and broker.agent.namespace == "my-app"
    assert scope["data"] == {"plan": "pro", "acv": 12000}
    results = scope["results"]
    assert isinstance(results, QueryResult)
    entries = list(results)
    assert [e.key for e in entries] == ["customer/123"]
    assert entries[0].agent_id == broker.agent.id, "writes are attributed to the agent"
    broker.close()


def test_register_switches_to_the_agents_own_key(client: MEMP, ns: str) -> None:
    agent = client.register(name="planner", framework="crewai")
    assert client.agent == agent and agent.namespace == ns and agent.framework == "crewai"
    assert client.credentials is not None and client.api_key == client.credentials.api_key
    assert client.api_key.startswith("memp_sk_") and client.credentials.agent_id == agent.id
    entry = client.memory.put("note", "hello")
    assert entry.agent_id == agent.id
    with pytest.raises(Forbidden):  # the agent's key has no admin permission
        client.keys.list()


def test_put_get_and_the_full_entry(client: MEMP, ns: str) -> None:
    first = client.memory.put("customer/123", {"plan": "pro", "acv": 12000})
    assert isinstance(first, Entry)
    assert (first.namespace, first.key, first.version) == (ns, "customer/123", 1)
    assert first.value == {"plan": "pro", "acv": 12000} and first.ttl_seconds is None
    assert first.created_at == first.updated_at and not first.schema_violation

    second = client.memory.put("customer/123", {"plan": "team"}, ttl_seconds=3600,
                               timestamp=first.timestamp + 1 if first.timestamp else None)
    assert second.version == 2 and second.id == first.id
    assert second.ttl_seconds == 3600 and second.expires_at is not None

    assert client.memory.get("customer/123") == {"plan": "team"}
    assert client.memory.get_entry("customer/123") == second
    for value in ["text", 42, 1.5, True, None, [1, {"a": []}]]:
        assert client.memory.put("any", value).value == value
        assert client.memory.get("any") == value


def test_get_of_a_missing_key(client: MEMP) -> None:
    with pytest.raises(NotFound) as caught:
        client.memory.get("nobody/here")
    error = caught.value
    assert (error.code, error.status) == ("not_found", 404)
    assert "nobody/here" in error.message and error.details == {"key": "nobody/here"}
    assert client.memory.get("nobody/here", None) is None
    assert client.memory.get("nobody/here", default={"d": 1}) == {"d": 1}


def test_query_pages_lazily_through_every_match(client: MEMP) -> None:
    for n in range(25):
        client.memory.put(f"customer/{n:03}", {"n": n})
    client.memory.put("other/1", "not matched")

    results = client.memory.query("customer/*", page_size=10)
    assert "0 entries fetched" in repr(results), "nothing is fetched before iterating"
    iterator = iter(results)
    assert next(iterator).key == "customer/000"
    assert "10 entries fetched, partial" in repr(results), "one page at a time"
    keys = [e.key for e in results]
    assert keys == [f"customer/{n:03}" for n in range(25)]
    assert len(results) == 25 and results[24].value == {"n": 24}
    assert [e.key for e in results] == keys, "iterating again gives the same entries"
    assert results.values()["customer/007"] == {"n": 7}

    assert len(client.memory.query("*")) == 26
    assert not client.memory.query("nothing/*") and len(client.memory.query("nothing/*")) == 0
    page = client.memory.page("customer/*", limit=20)
    assert len(page.entries) == 20 and page.next_cursor is not None
    rest = client.memory.page("customer/*", page.next_cursor, 20)
    assert len(rest.entries) == 5 and rest.next_cursor is None


def test_delete_and_history(client: MEMP) -> None:
    client.memory.put("k", "one")
    client.memory.put("k", "two")
    tombstone = client.memory.delete("k")
    assert tombstone.deleted and tombstone.version == 3 and tombstone.value is None
    with pytest.raises(NotFound):
        client.memory.get_entry("k")
    versions = client.memory.history("k")
    assert [(v.version, v.deleted, v.value) for v in versions] == [
        (3, True, None), (2, False, "two"), (1, False, "one")]
    assert [v.version for v in client.memory.history("k", limit=2)] == [3, 2]
    assert client.memory.put("k", "back").version == 4
    with pytest.raises(NotFound):
        client.memory.delete("never/written")


def test_compare_and_set(client: MEMP) -> None:
    first = client.memory.put("cas", 1, if_absent=True)
    with pytest.raises(PreconditionFailed) as caught:
        client.memory.put("cas", 2, if_absent=True)
    assert caught.value.status == 412 and caught.value.code == "precondition_failed"
    assert caught.value.current_version == 1 and caught.value.current == first

    assert client.memory.put("cas", 2, if_version=1).version == 2
    with pytest.raises(PreconditionFailed) as stale:
        client.memory.put("cas", 3, if_version=1)
    assert stale.value.current_version == 2
    with pytest.raises(PreconditionFailed):
        client.memory.delete("cas", if_version=1)
    assert client.memory.delete("cas", if_version=2).deleted


def test_an_older_write_loses_with_the_winner(client: MEMP) -> None:
    stored = client.memory.put("lww", "new")
    assert stored.timestamp is not None
    with pytest.raises(ConflictError) as caught:
        client.memory.put("lww", "old", timestamp=stored.timestamp - 1000)
    error = caught.value
    assert (error.code, error.status) == ("write_conflict", 409)
    assert error.winner == stored and "not applied" in error.message
    assert client.memory.get("lww") == "new"


def test_errors_keep_the_brokers_code_and_message(server: Broker, client: MEMP) -> None:
    with pytest.raises(InvalidRequest) as bad_key:
        client.memory.put("a//b", 1)
    assert bad_key.value.code == "invalid_key" and bad_key.value.status == 400
    with pytest.raises(InvalidRequest) as dots:
        client.memory.put("a/../b", 1)
    assert dots.value.code == "invalid_key"
    with pytest.raises(InvalidRequest) as bad_ttl:
        client.memory.put("k", 1, ttl_seconds=0)
    assert bad_ttl.value.code == "invalid_ttl"
    with pytest.raises(InvalidRequest) as bad_ns:
        client.memory.get("k", namespace="Not A Namespace")
    assert bad_ns.value.code == "invalid_namespace"
    with pytest.raises(PayloadTooLarge):
        client.memory.put("big", "x" * (1024 * 1024 + 1))

    with MEMP(api_key="memp_sk_live_not-a-real-key", namespace="x", base_url=server.url
              ) as stranger, pytest.raises(Unauthorized) as caught:
        stranger.memory.get("k")
    assert caught.value.status == 401 and caught.value.message


def test_keys_with_odd_characters_round_trip(client: MEMP) -> None:
    for key in ["a b/c?d", "h#sh/50%", "ünï/cödé", "x/.hidden", "q&a=1"]:
        assert client.memory.put(key, key).key == key
        assert client.memory.get(key) == key
    assert {e.key for e in client.memory.query("*")} >= {"a b/c?d", "ünï/cödé"}


def test_namespace_per_call_and_from_the_environment(
    server: Broker, client: MEMP, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = ns + "-b"
    client.memory.put("k", "elsewhere", namespace=other)
    assert client.memory.get("k", namespace=other) == "elsewhere"
    assert client.memory.get("k", None) is None

    monkeypatch.setenv("MEMP_API_KEY", ADMIN_KEY)
    monkeypatch.setenv("MEMP_BASE_URL", server.url)
    monkeypatch.setenv("MEMP_NAMESPACE", other)
    with MEMP() as from_env:
        assert from_env.memory.get("k") == "elsewhere"
    monkeypatch.delenv("MEMP_NAMESPACE")
    with MEMP() as no_namespace, pytest.raises(ValueError, match="namespace"):
        no_namespace.memory.get("k")


def test_keys_create_list_revoke(client: MEMP, ns: str) -> None:
    created = client.keys.create([Grant(ns, ["read"])], name="reader")
    assert created.api_key.startswith("memp_sk_") and created.key.name == "reader"
    assert created.key.id in {k.id for k in client.keys.list()}
    client.memory.put("k", 1)
    with MEMP(api_key=created.api_key, namespace=ns, base_url=client.config.base_url) as reader:
        assert reader.memory.get("k") == 1
        with pytest.raises(Forbidden) as caught:
            reader.memory.put("k", 2)
        assert caught.value.code == "forbidden"
        client.keys.revoke(created.key.id)
        assert created.key.id not in {k.id for k in client.keys.list()}
        with pytest.raises(Unauthorized):
            reader.memory.get("k")
    with pytest.raises(NotFound):
        client.keys.revoke(created.key.id)


def test_typed_results_match_the_brokers_wire_format() -> None:
    """The SDK's Structs carry exactly the fields the broker defines for them."""
    assert Entry.__struct_fields__ == wire.Entry.__struct_fields__
    assert set(SchemaError.__struct_fields__) == set(SchemaErrorDetail.__struct_fields__)
    assert {f.name for f in dataclasses.fields(BrokerConflict)} == set(Conflict.__struct_fields__)
    sample = wire.Entry(id="i", agent_id="a", namespace="n", key="k",
                        value=msgspec.Raw(b'{"x": [1]}'), ttl_seconds=None, version=1,
                        created_at=1, updated_at=1, timestamp=1, expires_at=None)
    decoded = msgspec.json.decode(wire.encode(sample), type=Entry)
    assert decoded.value == {"x": [1]} and decoded.version == 1
    assert decoded.schema_errors is None and decoded.conflicts is None

    # Namespace configuration and schemas: the same fields, in the same order, same defaults.
    for ours, theirs in [(NamespaceConfig, wire_namespaces.NamespaceConfig),
                         (StoredConfig, wire_namespaces.StoredConfig),
                         (StrategyRule, wire_namespaces.StrategyRule),
                         (PriorityRule, wire_namespaces.PriorityRule),
                         (Share, wire_namespaces.Share),
                         (SchemaRecord, wire_schemas.SchemaRecord)]:
        assert ours.__struct_fields__ == theirs.__struct_fields__, ours.__name__
    assert msgspec.to_builtins(StoredConfig()) == msgspec.to_builtins(
        wire_namespaces.StoredConfig())
    assert set(wire_schemas.SchemaBody.__struct_fields__) <= set(SchemaRecord.__struct_fields__)
    stored = wire_namespaces.StoredConfig(
        strategy="merge", rules=[wire_namespaces.StrategyRule("p/*", "agent-priority")],
        priorities=[wire_namespaces.PriorityRule("a", 3)], history_limit=4,
        shares=[wire_namespaces.Share("x-*", ["read"])], namespace="n", revision=2,
        updated_at=5, updated_by="admin")
    assert msgspec.json.decode(wire.encode(stored), type=StoredConfig) == StoredConfig(
        strategy="merge", rules=[StrategyRule("p/*", "agent-priority")],
        priorities=[PriorityRule("a", 3)], history_limit=4, shares=[Share("x-*", ["read"])],
        namespace="n", revision=2, updated_at=5, updated_by="admin")
    record = wire_schemas.SchemaRecord(id="s", namespace="n", pattern="*", schema={"type": "x"},
                                       enforce=True, draft="d", created_at=1, created_by="b")
    assert msgspec.to_builtins(msgspec.json.decode(wire.encode(record), type=SchemaRecord)
                               ) == msgspec.to_builtins(record)


def test_schema_violations_surface_as_warnings_and_fields(client: MEMP) -> None:
    schema = {"type": "object", "required": ["plan"],
              "properties": {"plan": {"enum": ["free", "pro"]}}}
    client.schemas.put("customer", "customer/*", schema)
    client.schemas.put("strict", "strict/*", schema, enforce=True)

    assert not client.memory.put("customer/1", {"plan": "pro"}).schema_violation
    with pytest.warns(SchemaViolationWarning, match="customer/2 v1 was stored") as caught:
        entry = client.memory.put("customer/2", {"plan": "gold"})
    assert len(caught) == 1 and "customer at /plan" in str(caught[0].message)
    assert entry.schema_violation and entry.schema_errors is not None
    assert [(e.schema_id, e.path) for e in entry.schema_errors] == [("customer", "/plan")]
    assert client.memory.get_entry("customer/2").schema_errors == entry.schema_errors

    with pytest.raises(SchemaViolation) as refused:
        client.memory.put("strict/1", {"nothing": True})
    assert (refused.value.status, refused.value.code) == (422, "schema_violation")
    assert refused.value.errors and refused.value.errors[0].schema_id == "strict"
    assert client.memory.get("strict/1", None) is None, "nothing was written"


def test_merge_writes_flag_conflicts_against_their_base(client: MEMP) -> None:
    client.namespaces.set_config(strategy="merge")
    base = client.memory.put("profile", {"name": "Ada", "plan": "free", "tags": {"a": 1}})
    mine = client.memory.put("profile", {"plan": "pro"}, base_version=base.version)
    assert mine.conflicts is None and mine.value == {"name": "Ada", "plan": "pro",
                                                      "tags": {"a": 1}}
    theirs = client.memory.put("profile", {"plan": "team"}, base_version=base.version)
    assert theirs.value["plan"] == "team", "the incoming value wins the merge"
    assert theirs.conflicts is not None
    [conflict] = theirs.conflicts
    assert (conflict.path, conflict.base, conflict.stored, conflict.incoming) == (
        "/plan", "free", "pro", "team")
    assert client.memory.get_entry("profile").conflicts == theirs.conflicts


def test_a_callers_own_http_client_is_used(server: Broker, ns: str) -> None:
    seen: list[str] = []
    http = httpx.Client(event_hooks={"request": [lambda r: seen.append(r.url.path)]})
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url, http_client=http) as client:
        client.memory.put("k", 1)
        assert client.memory.get("k") == 1
    assert seen == [f"/v1/namespaces/{ns}/memory/k"] * 2
    assert http.is_closed
