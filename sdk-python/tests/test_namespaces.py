"""Namespace configuration and JSON Schema helpers, sync, async and on the command line, against
a real broker on real Redis: round trips, revisions, conflict strategies, schemas' effects."""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memp import (
    MEMP,
    AsyncMEMP,
    Forbidden,
    Grant,
    InvalidRequest,
    NamespaceConfig,
    NotFound,
    PreconditionFailed,
    PriorityRule,
    SchemaRecord,
    SchemaViolation,
    SchemaViolationWarning,
    Share,
    StoredConfig,
    StrategyRule,
)
from tests.support.brokers import ADMIN_KEY, Broker
from tests.support.commands import Completed, run_memp

CUSTOMER = {"type": "object", "required": ["plan"],
            "properties": {"plan": {"enum": ["free", "pro"]}}}
DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"
README = Path(__file__).resolve().parents[1] / "README.md"


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 30))


# --- namespace configuration ------------------------------------------------------------------


def test_config_round_trip_and_revisions(client: MEMP, ns: str) -> None:
    fresh = client.namespaces.config()
    assert isinstance(fresh, StoredConfig)
    assert (fresh.namespace, fresh.revision, fresh.updated_at) == (ns, 0, None)
    assert fresh.strategy == "last-write-wins" and fresh.rules == [] and fresh.shares == []

    stored = client.namespaces.set_config(
        strategy="merge",
        rules=[StrategyRule("policy/*", "agent-priority"),
               StrategyRule("log/*", "last-write-wins")],
        priorities=[PriorityRule("key_*", 1), PriorityRule("boss", 10)], default_priority=2,
        merge_arrays="append", history_limit=32, default_ttl_seconds=3600,
        shares=[Share("partner-*", ["read", "subscribe"])])
    assert isinstance(stored, StoredConfig) and stored.namespace == ns
    assert stored.revision == 1 and stored.updated_at and stored.updated_by
    assert stored.strategy == "merge" and stored.merge_arrays == "append"
    assert stored.rules == [StrategyRule("policy/*", "agent-priority"),
                            StrategyRule("log/*", "last-write-wins")]
    assert stored.priorities[1] == PriorityRule("boss", 10) and stored.default_priority == 2
    assert (stored.history_limit, stored.default_ttl_seconds) == (32, 3600)
    assert stored.shares == [Share("partner-*", ["read", "subscribe"])]
    assert client.namespaces.config() == stored

    # A stored configuration, changed by keywords, on condition of its revision.
    second = client.namespaces.set_config(stored, history_limit=5, if_revision=stored.revision)
    assert second.revision == 2 and second.history_limit == 5
    assert second.rules == stored.rules and second.strategy == "merge"

    # A stale revision: refused, with the current one, and nothing changed.
    with pytest.raises(PreconditionFailed) as stale:
        client.namespaces.set_config(strategy="last-write-wins", if_revision=stored.revision)
    error = stale.value
    assert (error.status, error.code) == (412, "precondition_failed")
    assert error.current_revision == 2 and error.message
    assert client.namespaces.config() == second

    # A NamespaceConfig replaces everything: what it leaves out takes the defaults.
    replaced = client.namespaces.set_config(NamespaceConfig(strategy="agent-priority"),
                                            if_revision=2)
    assert replaced.revision == 3 and replaced.strategy == "agent-priority"
    assert replaced.rules == [] and replaced.history_limit is None and replaced.shares == []

    # update_config changes only what it names.
    updated = client.namespaces.update_config(history_limit=7)
    assert updated.revision == 4 and updated.history_limit == 7
    assert updated.strategy == "agent-priority"

    with pytest.raises(TypeError, match="stratgy"):
        client.namespaces.set_config(stratgy="merge")  # type: ignore[call-arg]


def test_bad_configs_are_refused_with_the_brokers_code(client: MEMP) -> None:
    with pytest.raises(InvalidRequest) as ttl:
        client.namespaces.set_config(default_ttl_seconds=0)
    assert (ttl.value.status, ttl.value.code) == (400, "invalid_ttl")
    with pytest.raises(InvalidRequest) as pattern:
        client.namespaces.set_config(rules=[StrategyRule("a//b", "merge")])
    assert pattern.value.code == "invalid_pattern"
    with pytest.raises(InvalidRequest) as history:
        client.namespaces.set_config(history_limit=-1)
    assert history.value.code == "invalid_request" and "history_limit" in history.value.message
    with pytest.raises(InvalidRequest) as strategy:
        client.namespaces.set_config(strategy="coin-toss")  # type: ignore[arg-type]
    assert strategy.value.code == "invalid_request"
    with pytest.raises(InvalidRequest):
        client.namespaces.config(namespace="Not A Namespace")
    assert client.namespaces.config().revision == 0, "nothing was stored"


def test_configuring_and_registering_schemas_needs_admin(client: MEMP, ns: str) -> None:
    client.schemas.put("customer", "customer/*", CUSTOMER)
    created = client.keys.create([Grant(ns, ["read", "write", "subscribe"])], name="worker")
    with MEMP(api_key=created.api_key, namespace=ns, base_url=client.config.base_url) as worker:
        with pytest.raises(Forbidden) as caught:
            worker.namespaces.config()
        assert (caught.value.status, caught.value.code) == (403, "forbidden")
        with pytest.raises(Forbidden):
            worker.namespaces.set_config(strategy="merge")
        with pytest.raises(Forbidden):
            worker.schemas.put("mine", "*", True)
        with pytest.raises(Forbidden):
            worker.schemas.delete("customer")
        # reading schemas needs only `read`
        assert [r.id for r in worker.schemas.list()] == ["customer"]
        assert worker.schemas.get("customer").schema == CUSTOMER
    assert client.namespaces.config().revision == 0


def test_a_merge_rule_flags_conflicts_on_writes_with_a_base(client: MEMP) -> None:
    client.namespaces.set_config(rules=[StrategyRule("profile/*", "merge")],
                                 merge_arrays="append")
    base = client.memory.put("profile/ada", {"name": "Ada", "plan": "free", "tags": ["a"]})
    mine = client.memory.put("profile/ada", {"plan": "pro", "tags": ["b"]},
                             base_version=base.version)
    assert mine.conflicts is None
    assert mine.value == {"name": "Ada", "plan": "pro", "tags": ["a", "b"]}, "merged, appended"
    theirs = client.memory.put("profile/ada", {"plan": "team"}, base_version=base.version)
    assert theirs.value["plan"] == "team" and theirs.conflicts is not None
    [conflict] = theirs.conflicts
    assert (conflict.path, conflict.base, conflict.stored, conflict.incoming) == (
        "/plan", "free", "pro", "team")
    assert client.memory.get_entry("profile/ada").conflicts == theirs.conflicts

    # Keys no rule matches keep the namespace's strategy (last-write-wins): replaced, not merged.
    client.memory.put("other", {"a": 1})
    assert client.memory.put("other", {"b": 2}).value == {"b": 2}


# --- JSON Schemas ------------------------------------------------------------------------------


def test_schema_put_get_list_delete(client: MEMP, ns: str) -> None:
    assert client.schemas.list() == []
    record = client.schemas.put("customer", "customer/*", CUSTOMER)
    assert isinstance(record, SchemaRecord)
    assert (record.id, record.namespace, record.pattern) == ("customer", ns, "customer/*")
    assert record.schema == CUSTOMER and not record.enforce and record.draft == DRAFT_2020
    assert record.created_at and record.created_by
    assert client.schemas.get("customer") == record

    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"}
    note = client.schemas.put("note.v1", pattern="note/*", schema=draft7, enforce=True)
    assert note.enforce and note.draft == "http://json-schema.org/draft-07/schema"
    anything = client.schemas.put("any", "*", True)
    assert anything.schema is True
    assert [r.id for r in client.schemas.list()] == ["any", "customer", "note.v1"]

    replaced = client.schemas.put("customer", "customers/*", CUSTOMER, enforce=True)
    assert replaced.pattern == "customers/*" and replaced.enforce
    assert client.schemas.get("customer") == replaced

    client.schemas.delete("customer")
    with pytest.raises(NotFound) as missing:
        client.schemas.get("customer")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    assert "customer" in missing.value.message
    with pytest.raises(NotFound):
        client.schemas.delete("customer")
    assert [r.id for r in client.schemas.list()] == ["any", "note.v1"]


def test_invalid_schemas_are_refused(client: MEMP) -> None:
    with pytest.raises(InvalidRequest) as invalid:
        client.schemas.put("bad", "*", {"type": "no-such-type"})
    assert (invalid.value.status, invalid.value.code) == (400, "invalid_schema")
    with pytest.raises(InvalidRequest) as remote:
        client.schemas.put("remote", "*", {"$ref": "https://example.com/schema.json"})
    assert remote.value.code == "invalid_schema"
    assert remote.value.details["refs"] == ["https://example.com/schema.json"]
    with pytest.raises(InvalidRequest) as draft:
        client.schemas.put("old", "*", {"$schema": "http://json-schema.org/draft-03/schema#"})
    assert draft.value.code == "invalid_schema" and "draft-03" in draft.value.message
    with pytest.raises(InvalidRequest) as bad_id:
        client.schemas.put("Bad Id", "*", True)
    assert bad_id.value.code == "invalid_request"
    with pytest.raises(InvalidRequest) as bad_pattern:
        client.schemas.put("p", "a//b", True)
    assert bad_pattern.value.code == "invalid_pattern"
    assert client.schemas.list() == []


def test_registered_schemas_flag_or_refuse_writes(client: MEMP) -> None:
    client.schemas.put("customer", "customer/*", CUSTOMER)
    client.schemas.put("strict", "strict/*", CUSTOMER, enforce=True)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a conforming value issues no warning
        assert not client.memory.put("customer/1", {"plan": "pro"}).schema_violation
    with pytest.warns(SchemaViolationWarning, match="customer/2 v1 was stored") as caught:
        entry = client.memory.put("customer/2", {"plan": "gold"})
    assert len(caught) == 1 and "customer at /plan" in str(caught[0].message)
    assert entry.schema_violation and entry.schema_errors is not None
    assert [(e.schema_id, e.path) for e in entry.schema_errors] == [("customer", "/plan")]

    with pytest.raises(SchemaViolation) as refused:
        client.memory.put("strict/1", {"nothing": True})
    assert (refused.value.status, refused.value.code) == (422, "schema_violation")
    assert [e.schema_id for e in refused.value.errors] == ["strict"]
    assert client.memory.get("strict/1", None) is None, "nothing was written"

    client.schemas.delete("strict")
    assert not client.memory.put("strict/1", {"nothing": True}).schema_violation


def test_the_readme_example_runs(client: MEMP) -> None:
    text = README.read_text()
    section = text[text.index("## Namespace configuration and JSON Schemas"):]
    example = section[section.index("```python\n") + 10:section.index("```\n")]
    with pytest.warns(SchemaViolationWarning):
        exec(example, {"broker": client})
    config = client.namespaces.config()
    assert config.revision == 2 and config.default_ttl_seconds == 86400
    assert config.rules[0] == StrategyRule("profile/*", "merge") and config.history_limit == 32
    assert client.memory.get_entry("customer/1").schema_violation


# --- the async twin ----------------------------------------------------------------------------


def test_async_config_round_trip_and_merge(aclient_factory: Callable[..., AsyncMEMP], ns: str
                                           ) -> None:
    async def scenario() -> None:
        async with aclient_factory() as broker:
            assert (await broker.namespaces.config()).revision == 0
            stored = await broker.namespaces.set_config(
                strategy="merge", priorities=[PriorityRule("boss", 10)],
                shares=[Share("partner-*", ["read"])])
            assert stored.revision == 1 and stored.namespace == ns
            assert await broker.namespaces.config() == stored
            with pytest.raises(PreconditionFailed) as stale:
                await broker.namespaces.set_config(stored, history_limit=3, if_revision=0)
            assert stale.value.current_revision == 1
            second = await broker.namespaces.set_config(stored, history_limit=3, if_revision=1)
            assert second.revision == 2 and second.priorities == stored.priorities
            updated = await broker.namespaces.update_config(default_priority=4)
            assert (updated.revision, updated.default_priority, updated.history_limit) == (
                3, 4, 3)

            base = await broker.memory.put("doc", {"title": "a", "body": "x"})
            await broker.memory.put("doc", {"title": "b"}, base_version=base.version)
            theirs = await broker.memory.put("doc", {"title": "c"}, base_version=base.version)
            assert theirs.value == {"title": "c", "body": "x"}
            assert theirs.conflicts is not None
            assert [(c.path, c.stored, c.incoming) for c in theirs.conflicts] == [
                ("/title", "b", "c")]

    run(scenario())


def test_async_schemas(aclient_factory: Callable[..., AsyncMEMP], ns: str) -> None:
    async def scenario() -> None:
        async with aclient_factory() as broker:
            record = await broker.schemas.put("customer", "customer/*", CUSTOMER)
            assert record.namespace == ns and record.draft == DRAFT_2020
            assert await broker.schemas.get("customer") == record
            await broker.schemas.put("strict", "strict/*", CUSTOMER, enforce=True)
            assert [r.id for r in await broker.schemas.list()] == ["customer", "strict"]

            with pytest.warns(SchemaViolationWarning, match="customer at /plan"):
                entry = await broker.memory.put("customer/1", {"plan": "gold"})
            assert entry.schema_violation
            with pytest.raises(SchemaViolation) as refused:
                await broker.memory.put("strict/1", {})
            assert refused.value.errors[0].schema_id == "strict"
            with pytest.raises(InvalidRequest) as invalid:
                await broker.schemas.put("bad", "*", {"minimum": "zero"})
            assert invalid.value.code == "invalid_schema"

            await broker.schemas.delete("strict")
            with pytest.raises(NotFound):
                await broker.schemas.get("strict")
            with pytest.raises(NotFound):
                await broker.schemas.delete("strict")
            assert [r.id for r in await broker.schemas.list()] == ["customer"]

    run(scenario())


# --- the command line --------------------------------------------------------------------------

def memp(server: Broker, ns: str, *args: str, stdin: str | None = None) -> Completed:
    env = {**os.environ, "MEMP_BASE_URL": server.url, "MEMP_API_KEY": ADMIN_KEY,
           "MEMP_NAMESPACE": ns}
    return run_memp(env, *args, stdin=stdin)


def test_cli_config_get_and_set(server: Broker, ns: str) -> None:
    got = memp(server, ns, "config", "get")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["revision"] == 0

    done = memp(server, ns, "config", "set", '{"strategy": "merge", "history_limit": 9}')
    assert done.returncode == 0, done.stderr
    stored = json.loads(done.stdout)
    assert (stored["strategy"], stored["history_limit"], stored["revision"]) == ("merge", 9, 1)

    # `config get` output fed back through stdin, edited, on condition of its revision
    document = json.loads(memp(server, ns, "config", "get").stdout)
    document["history_limit"] = 4
    again = memp(server, ns, "config", "set", "--if-revision", "1", stdin=json.dumps(document))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["revision"] == 2

    stale = memp(server, ns, "config", "set", "--if-revision", "1", '{}')
    assert stale.returncode == 1 and "precondition_failed" in stale.stderr
    assert '"current_revision": 2' in stale.stderr
    usage = memp(server, ns, "config", "set", '{"strategy": 5}')
    assert usage.returncode == 2 and "CONFIG" in usage.stderr
    refused = memp(server, ns, "config", "set", '{"default_ttl_seconds": 0}')
    assert refused.returncode == 1 and "invalid_ttl" in refused.stderr


def test_cli_schemas(server: Broker, ns: str, tmp_path: Path) -> None:
    put = memp(server, ns, "schema", "put", "customer", "--pattern", "customer/*",
               json.dumps(CUSTOMER))
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout)["pattern"] == "customer/*"
    strict = memp(server, ns, "schema", "put", "strict", "-", "--pattern", "strict/*",
                  "--enforce", stdin=json.dumps(CUSTOMER))
    assert strict.returncode == 0 and json.loads(strict.stdout)["enforce"] is True

    got = memp(server, ns, "schema", "get", "customer")
    assert got.returncode == 0 and json.loads(got.stdout) == CUSTOMER
    record = json.loads(memp(server, ns, "schema", "get", "customer", "--record").stdout)
    assert record["id"] == "customer" and record["draft"] == DRAFT_2020
    listed = memp(server, ns, "schema", "list")
    assert [json.loads(line)["id"] for line in listed.stdout.splitlines()] == [
        "customer", "strict"]
    table = memp(server, ns, "schema", "list", "--table")
    assert table.stdout.startswith("ID") and "strict/*" in table.stdout

    refused = memp(server, ns, "put", "strict/1", "{}")
    assert refused.returncode == 1 and "schema_violation" in refused.stderr
    schema_file = tmp_path / "bad.json"
    schema_file.write_text('{"type": 1}')
    invalid = memp(server, ns, "schema", "put", "bad", f"@{schema_file}", "--pattern", "*")
    assert invalid.returncode == 1 and "invalid_schema" in invalid.stderr
    not_json = memp(server, ns, "schema", "put", "bad", "--pattern", "*", "[1]")
    assert not_json.returncode == 2

    deleted = memp(server, ns, "schema", "delete", "strict")
    assert deleted.returncode == 0, deleted.stderr
    missing = memp(server, ns, "schema", "get", "strict")
    assert missing.returncode == 1 and "not_found" in missing.stderr
