"""The AMP API under /amp (broker/amp/service.py, routes.py) over real HTTP on both stores:
create, read, patch, bulk import; cells as MEMP entries that MEMP subscribers see change; reads
that count; access control with X-AMP-Agent-ID, wildcards, public cells, the owner and creator
bypass, agent-bound tokens and impersonation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.amp.cells import ULID_RE
from broker.storage import layout
from tests.support.amp import (
    DAY_MS,
    Amp,
    Subscription,
    amp_broker,
    amp_processes,
    cell_key,
    error_of,
    iso,
    ms_of,
    now_ms,
    run_threads,
    sync_redis,
)
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, BrokerProcess


@pytest.fixture(params=BACKENDS)
def amp(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
        ns: str) -> Iterator[Amp]:
    with amp_broker(broker_factory, request.param, ns) as client:
        yield client


def ulid_ms(ulid: str) -> int:
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    value = 0
    for char in ulid[:10]:
        value = value * 32 + alphabet.index(char)
    return value


# ---- create and the MEMP mapping ----


def test_create_assigns_id_version_lifecycle_and_creator(amp: Amp) -> None:
    before = now_ms()
    cell = amp.create("The user prefers Python for backend development", owner="u-7",
                      agent="agent-writer", provenance={"source_type": "chat"})
    after = now_ms()
    assert ULID_RE.fullmatch(cell["id"])
    assert before <= ulid_ms(cell["id"]) <= after
    assert cell["amp_version"] == "0.1.0"
    life = cell["lifecycle"]
    assert life["status"] == "active"
    assert before <= ms_of(life["created_at"]) <= after
    assert life["last_updated_at"] == life["created_at"]
    assert life["last_accessed_at"] is None
    assert cell["identity"]["created_by"] == "agent-writer"
    assert cell["scoring"]["access_count"] == 0
    assert cell["provenance"]["source_type"] == "chat"

    entry = amp.entry_response(cell).json()
    assert entry["key"] == f"cells/user/u-7/{cell['id']}"
    assert entry["version"] == 1
    assert entry["agent_id"] == "agent-writer"
    assert entry["value"] == cell


def test_ids_are_unique_and_sort_in_creation_order(amp: Amp) -> None:
    ids = [amp.create(f"cell {i}")["id"] for i in range(20)]
    assert len(set(ids)) == 20
    assert [ulid_ms(i) for i in ids] == sorted(ulid_ms(i) for i in ids)


def test_one_owners_cells_share_a_memp_key_prefix(amp: Amp) -> None:
    mine = {amp.create("a", owner="alice")["id"], amp.create("b", owner="alice")["id"]}
    amp.create("c", owner="bob")
    amp.create("d", owner="alice", owner_type="organization")
    keys = amp.owner_keys("alice")
    assert {k.rsplit("/", 1)[1] for k in keys} == mine
    assert len(amp.owner_keys("alice", "organization")) == 1


# ---- reads ----


def test_a_read_counts_and_shows_the_current_figures(amp: Amp) -> None:
    cell = amp.create("counted")
    first = amp.read(cell["id"])
    second = amp.read(cell["id"])
    assert first["scoring"]["access_count"] == 1
    assert second["scoring"]["access_count"] == 2
    assert first["lifecycle"]["last_accessed_at"] is not None
    assert ms_of(second["lifecycle"]["last_accessed_at"]) >= ms_of(
        first["lifecycle"]["last_accessed_at"]) >= ms_of(cell["lifecycle"]["created_at"])
    searched = amp.search(owner_id="u-1")["results"][0]["cell"]
    assert searched["scoring"]["access_count"] == 2  # search shows the figures...
    assert amp.read(cell["id"])["scoring"]["access_count"] == 3  # ...and is no access
    # A read is no write: no new MEMP version, no event for subscribers.
    assert amp.entry_response(cell).json()["version"] == 1


def test_a_refused_read_does_not_count(amp: Amp) -> None:
    cell = amp.create("private", agent="creator")
    assert amp.get(cell["id"], agent="stranger").status_code == 403
    assert amp.read(cell["id"], agent="creator")["scoring"]["access_count"] == 1


def test_reads_are_counted_after_a_policy_change_and_for_records_without_readers(
        amp: Amp, redis_url: str) -> None:
    cell = amp.create("shared later", agent="creator")
    assert amp.get(cell["id"], agent="reader-7").status_code == 403
    patched = amp.patch(cell["id"], {"access_policy": {"readable_by": ["reader-*"]}},
                        agent="creator")
    assert patched.status_code == 200, patched.text
    assert amp.read(cell["id"], agent="reader-7")["scoring"]["access_count"] == 1
    # A record written before records held their readers: the broker counts the read itself.
    client = sync_redis(amp, redis_url)
    try:
        assert client.hdel(layout.amp_cell(amp.namespace, cell["id"]), "readers") == 1
        assert amp.read(cell["id"], agent="reader-7")["scoring"]["access_count"] == 2
        assert amp.get(cell["id"], agent="stranger").status_code == 403
        assert amp.read(cell["id"], agent="creator")["scoring"]["access_count"] == 3
    finally:
        client.close()


def test_a_read_before_the_latest_write_is_indexed_follows_the_cell(amp: Amp,
                                                                    redis_url: str) -> None:
    cell = amp.create("shared, then not", agent="creator",
                      access_policy={"readable_by": ["reader-*"]})
    patched = amp.patch(cell["id"], {"access_policy": {"readable_by": []}}, agent="creator")
    assert patched.status_code == 200, patched.text
    # As if the patch's index update had not landed yet: the record still holds version 1's
    # readers while the entry is at version 2.
    client = sync_redis(amp, redis_url)
    try:
        client.hset(layout.amp_cell(amp.namespace, cell["id"]),
                    mapping={"readers": "creator reader-*", "ver": "1"})
    finally:
        client.close()
    assert amp.get(cell["id"], agent="reader-7").status_code == 403
    assert amp.read(cell["id"], agent="creator")["scoring"]["access_count"] == 1


def test_writes_and_reads_work_after_redis_forgets_its_scripts(amp: Amp,
                                                                redis_url: str) -> None:
    client = sync_redis(amp, redis_url)
    try:
        client.script_flush()
        cell = amp.create("written after a script flush")
        client.script_flush()
        assert amp.read(cell["id"])["scoring"]["access_count"] == 1
    finally:
        client.close()
    # The write and its index update both ran: the cell is stored and searchable.
    assert amp.stored(cell)["content"]["text"] == "written after a script flush"
    assert amp.search_ids(query="flush") == [cell["id"]]


# ---- patch ----


def test_patch_changes_what_it_names_as_a_versioned_memp_write(amp: Amp) -> None:
    cell = amp.create("first text", scoring={"importance": 0.4, "confidence": 0.8})
    amp.read(cell["id"])
    expires = iso(now_ms() + 10 * DAY_MS)
    response = amp.patch(cell["id"], {
        "content": {"text": "second text", "metadata": {"topic": "tea"}},
        "scoring": {"importance": 0.9},
        "access_policy": {"readable_by": ["reader-*"], "public": True},
        "expires_at": expires,
    })
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["content"] == {"text": "second text", "metadata": {"topic": "tea"}}
    assert patched["scoring"]["importance"] == 0.9
    assert patched["scoring"]["confidence"] == 0.8  # not named, not changed
    assert patched["scoring"]["access_count"] == 1
    assert patched["access_policy"] == {"readable_by": ["reader-*"], "writable_by": [],
                                        "public": True}
    assert patched["lifecycle"]["expires_at"] == expires
    assert patched["lifecycle"]["created_at"] == cell["lifecycle"]["created_at"]
    assert ms_of(patched["lifecycle"]["last_updated_at"]) >= ms_of(
        cell["lifecycle"]["last_updated_at"])
    assert patched["identity"] == cell["identity"]
    assert patched["id"] == cell["id"]

    history = amp.history(cell)
    assert [v["version"] for v in history] == [1, 2]
    assert history[0]["value"]["content"]["text"] == "first text"
    assert history[1]["value"]["content"]["text"] == "second text"
    assert amp.read(cell["id"])["content"]["text"] == "second text"


def test_concurrent_patches_lose_no_update(amp: Amp) -> None:
    cell = amp.create("text 0", scoring={"importance": 0.1})
    failures: list[str] = []

    def patch_many(make: Callable[[int], dict[str, Any]]) -> None:
        with amp.as_token(ADMIN_KEY, "agent-1") as client:
            for i in range(1, 11):
                response = client.patch(cell["id"], make(i))
                if response.status_code != 200:
                    failures.append(response.text)

    threads = [threading.Thread(target=patch_many, args=(make,)) for make in (
        lambda i: {"content": {"text": f"text {i}"}},
        lambda i: {"scoring": {"importance": i / 10}},
        lambda i: {"access_policy": {"readable_by": [f"reader-{i}"]}},
    )]
    run_threads(threads)
    assert failures == []
    final = amp.stored(cell)
    assert final["content"]["text"] == "text 10"
    assert final["scoring"]["importance"] == 1.0
    assert final["access_policy"]["readable_by"] == ["reader-10"]
    assert amp.entry_response(cell).json()["version"] == 31


def test_patch_through_lifecycle_sets_the_expiry(amp: Amp) -> None:
    cell = amp.create("expiring")
    expires = iso(now_ms() + DAY_MS)
    response = amp.patch(cell["id"], {"lifecycle": {"expires_at": expires}})
    assert response.status_code == 200, response.text
    assert amp.stored(cell)["lifecycle"]["expires_at"] == expires


def test_a_memp_subscriber_sees_creates_and_patches(amp: Amp) -> None:
    stream = Subscription(amp.url, {"namespace": amp.namespace,
                                    "pattern": "cells/user/carol/*"}).wait_open()
    try:
        other = amp.create("someone else's", owner="dave")
        cell = amp.create("carol likes jazz", owner="carol")
        assert amp.patch(cell["id"], {"content": {"text": "carol likes blues"}}
                         ).status_code == 200
        key = cell_key(cell)
        _, created = stream.wait_for(
            lambda name, data: name == "put" and data["key"] == key and data["version"] == 1,
            "the create")
        assert created["value"]["content"]["text"] == "carol likes jazz"
        assert created["value"]["lifecycle"]["status"] == "active"
        _, patched = stream.wait_for(
            lambda name, data: name == "put" and data["key"] == key and data["version"] == 2,
            "the patch")
        assert patched["value"]["content"]["text"] == "carol likes blues"
        amp.run(ms_of(cell["lifecycle"]["created_at"]) + 200 * DAY_MS)
        _, stale = stream.wait_for(
            lambda name, data: name == "put" and data["key"] == key and data["version"] == 3,
            "the lifecycle engine's change")
        assert stale["value"]["lifecycle"]["status"] == "stale"
        assert all(data.get("key") != cell_key(other) for _, data in stream.events)
    finally:
        stream.close()


# ---- access control ----


def test_readable_by_wildcards(amp: Amp) -> None:
    cell = amp.create("team notes", agent="creator",
                      access_policy={"readable_by": ["agent-team-*"]})
    for reader in ("agent-team-1", "agent-team-dev"):
        assert amp.get(cell["id"], agent=reader).status_code == 200
    for stranger in ("agent-other-1", "xagent-team-1", "agent-team"):
        response = amp.get(cell["id"], agent=stranger)
        assert response.status_code == 403, (stranger, response.text)
        assert error_of(response)["code"] == "forbidden"
    # Reading is not writing.
    assert amp.patch(cell["id"], {"content": {"text": "x"}},
                     agent="agent-team-1").status_code == 403
    assert amp.delete(cell["id"], agent="agent-team-1").status_code == 403
    assert amp.stored(cell)["content"]["text"] == "team notes"


def test_writable_by_wildcards(amp: Amp) -> None:
    cell = amp.create("runbook", agent="creator", access_policy={"writable_by": ["ops-*"]})
    assert amp.get(cell["id"], agent="ops-7").status_code == 200  # writers may read
    assert amp.patch(cell["id"], {"content": {"text": "runbook v2"}},
                     agent="ops-7").status_code == 200
    refused = amp.patch(cell["id"], {"content": {"text": "vandalised"}}, agent="dev-7")
    assert refused.status_code == 403
    assert amp.stored(cell)["content"]["text"] == "runbook v2"
    assert amp.entry_response(cell).json()["agent_id"] == "ops-7"


def test_public_cells_are_readable_by_anyone_and_writable_by_no_one_else(amp: Amp) -> None:
    cell = amp.create("public fact", agent="creator", access_policy={"public": True})
    assert amp.get(cell["id"], agent="anyone-at-all").status_code == 200
    assert amp.patch(cell["id"], {"content": {"text": "x"}},
                     agent="anyone-at-all").status_code == 403


def test_an_agent_owner_bypasses_the_policy(amp: Amp) -> None:
    cell = amp.create("about agent-owner", owner="agent-owner", owner_type="agent",
                      agent="creator", access_policy={"readable_by": ["nobody"]})
    assert amp.get(cell["id"], agent="agent-owner").status_code == 200
    assert amp.patch(cell["id"], {"scoring": {"importance": 0.8}},
                     agent="agent-owner").status_code == 200


@pytest.mark.parametrize("owner_type", ["user", "organization"])
def test_an_owner_that_is_not_an_agent_gets_no_bypass(amp: Amp, owner_type: str) -> None:
    cell = amp.create("about agent-owner", owner="agent-owner", owner_type=owner_type,
                      agent="creator")
    assert amp.get(cell["id"], agent="agent-owner").status_code == 403
    assert amp.patch(cell["id"], {"scoring": {"importance": 0.8}},
                     agent="agent-owner").status_code == 403


def test_the_creator_bypasses_the_policy(amp: Amp) -> None:
    cell = amp.create("mine", agent="creator",
                      access_policy={"readable_by": ["someone"], "writable_by": ["someone"]})
    assert amp.get(cell["id"], agent="creator").status_code == 200
    assert amp.patch(cell["id"], {"content": {"text": "still mine"}},
                     agent="creator").status_code == 200
    assert amp.get(cell["id"], agent="someone-else").status_code == 403


def test_search_returns_only_cells_the_agent_may_read(amp: Amp) -> None:
    shared = amp.create("shared note", agent="creator",
                        access_policy={"readable_by": ["reader-*"]})
    public = amp.create("public note", agent="creator", access_policy={"public": True})
    writable = amp.create("writable note", agent="creator",
                          access_policy={"writable_by": ["reader-1"]})
    owned = amp.create("owned note", owner="reader-1", owner_type="agent", agent="creator")
    own = amp.create("own note", agent="reader-1")
    amp.create("private note", agent="creator")
    amp.create("other team", agent="creator", access_policy={"readable_by": ["writer-*"]})
    amp.create("user named like the reader", owner="reader-1", agent="creator")
    expected = {shared["id"], public["id"], writable["id"], owned["id"], own["id"]}
    assert set(amp.search_ids(agent="reader-1", limit=100)) == expected
    assert set(amp.search_ids(agent="reader-1", query="note", limit=100)) == expected
    assert set(amp.search_ids(agent="reader-1", owner_id="reader-1")) == {owned["id"]}
    assert set(amp.search_ids(agent="nobody", limit=100)) == {public["id"]}


def test_an_agent_bound_token_acts_as_its_agent(amp: Amp) -> None:
    agent_id, key = amp.register("alpha")
    with amp.as_token(key) as alpha:
        cell = alpha.create("written by alpha")
        assert cell["identity"]["created_by"] == agent_id
        assert amp.entry_response(cell).json()["agent_id"] == agent_id
        same = alpha.create("header agrees", agent=agent_id)
        assert same["identity"]["created_by"] == agent_id
        assert alpha.read(cell["id"])["id"] == cell["id"]


def test_a_header_that_disagrees_with_the_token_is_refused(amp: Amp) -> None:
    _, key = amp.register("alpha")
    victim = amp.create("the creator's secret", agent="creator")
    with amp.as_token(key) as alpha:
        before = amp.owner_keys("u-1")
        response = alpha.post_cell({"type": "semantic", "content": {"text": "spoofed"},
                                    "identity": {"owner_id": "u-1", "owner_type": "user"}},
                                   agent="creator")
        assert response.status_code == 403, response.text
        assert error_of(response)["code"] == "forbidden"
        assert amp.owner_keys("u-1") == before
        assert alpha.get(victim["id"], agent="creator").status_code == 403
        assert alpha.get(victim["id"]).status_code == 403  # as itself, not allowed either
        assert alpha.patch(victim["id"], {"content": {"text": "x"}},
                           agent="creator").status_code == 403
        assert alpha.search_response(agent="creator").status_code == 403
    assert amp.stored(victim)["content"]["text"] == "the creator's secret"


def test_one_registered_agent_cannot_read_anothers_cells(amp: Amp) -> None:
    alpha_id, alpha_key = amp.register("alpha")
    beta_id, beta_key = amp.register("beta")
    with amp.as_token(alpha_key) as alpha, amp.as_token(beta_key) as beta:
        cell = alpha.create("alpha's private memory")
        assert beta.get(cell["id"]).status_code == 403
        assert beta.get(cell["id"], agent=alpha_id).status_code == 403
        assert cell["id"] not in beta.search_ids(limit=100)
        shared = alpha.create("for beta", access_policy={"readable_by": [beta_id]})
        assert beta.read(shared["id"])["id"] == shared["id"]


def test_an_impersonating_token_may_act_for_other_agents(amp: Amp) -> None:
    gateway_key = amp.new_key(["amp", "impersonate"])
    with amp.as_token(gateway_key) as gateway:
        cell = gateway.create("via the gateway", agent="agent-x")
        assert cell["identity"]["created_by"] == "agent-x"
        assert gateway.get(cell["id"], agent="agent-x").status_code == 200
        assert gateway.get(cell["id"], agent="agent-y").status_code == 403  # the policy holds
        missing = gateway.post_cell({"type": "semantic", "content": {"text": "x"},
                                     "identity": {"owner_id": "u", "owner_type": "user"}},
                                    agent="")
        assert missing.status_code == 400  # not bound to an agent: it must name one


def test_a_token_without_impersonation_cannot_name_an_agent(amp: Amp) -> None:
    plain_key = amp.new_key(["amp"])
    with amp.as_token(plain_key) as plain:
        response = plain.post_cell({"type": "semantic", "content": {"text": "x"},
                                    "identity": {"owner_id": "u", "owner_type": "user"}},
                                   agent="agent-x")
        assert response.status_code == 403, response.text
    bound_key = amp.new_key(["amp"], agent_id="agent-b")
    with amp.as_token(bound_key) as bound:
        assert bound.create("as itself")["identity"]["created_by"] == "agent-b"
        refused = bound.post_cell({"type": "semantic", "content": {"text": "x"},
                                   "identity": {"owner_id": "u", "owner_type": "user"}},
                                  agent="agent-c")
        assert refused.status_code == 403, refused.text


def test_amp_routes_need_the_amp_permission_and_memp_permissions_do_not_give_it(
        amp: Amp) -> None:
    cell = amp.create("x", agent="agent-r", access_policy={"public": True})
    memp_key = amp.new_key(["read", "write", "subscribe"], agent_id="agent-r")
    body = {"type": "semantic", "content": {"text": "x"},
            "identity": {"owner_id": "u", "owner_type": "user"}}
    with amp.as_token(memp_key) as memp_only:
        assert memp_only.get(cell["id"]).status_code == 403
        assert memp_only.search_response().status_code == 403
        assert memp_only.post_cell(body).status_code == 403
        assert memp_only.patch(cell["id"], {"content": {"text": "y"}}).status_code == 403
    amp_key = amp.new_key(["amp"], agent_id="agent-r")
    with amp.as_token(amp_key) as reader:
        assert reader.get(cell["id"]).status_code == 200
        assert reader.search_response().status_code == 200
        assert reader.post_cell(body).status_code == 201
        for path in ("/amp/lifecycle/run", "/amp/purge", "/amp/import"):
            assert reader.http.post(path, json={}).status_code == 403, path
    response = amp.http.post("/v1/keys", json={
        "name": "elsewhere", "agent_id": "agent-r",
        "grants": [{"namespace": "somewhere-else", "permissions": ["amp", "read", "write"]}]})
    with amp.as_token(response.json()["api_key"]) as outsider:
        assert outsider.get(cell["id"]).status_code == 403
        assert outsider.search_response().status_code == 403
    with amp.as_token("memp_sk_live_not-a-real-key") as nobody:
        assert nobody.get(cell["id"]).status_code == 401
    assert amp.stored(cell)["content"]["text"] == "x"


def test_agent_tokens_cannot_run_admin_passes(amp: Amp) -> None:
    _, key = amp.register("alpha")
    with amp.as_token(key) as alpha:
        for path in ("/amp/lifecycle/run", "/amp/purge", "/amp/import"):
            response = alpha.http.post(path, json={"cells": []} if "import" in path else {})
            assert response.status_code == 403, (path, response.text)


# ---- bulk import ----


def imported_cell(cell_id: str, **changes: Any) -> dict[str, Any]:
    cell: dict[str, Any] = {
        "id": cell_id, "amp_version": "0.1.0", "type": "procedural",
        "content": {"text": "deploy: run the unit tests, then build the container",
                    "metadata": {"origin": "legacy"}},
        "identity": {"owner_id": "team-9", "owner_type": "organization",
                     "created_by": "legacy-agent", "session_id": "old-session"},
        "scoring": {"importance": 0.8, "confidence": 0.9, "decay_rate": 0.02,
                    "access_count": 12},
        "lifecycle": {"created_at": "2025-03-01T10:00:00.000Z",
                      "last_updated_at": "2025-03-02T10:00:00.000Z",
                      "last_accessed_at": "2025-03-03T10:00:00.000Z", "status": "active"},
        "access_policy": {"readable_by": ["agent-*"], "writable_by": [], "public": False},
        "provenance": {"source_type": "migration", "source_ref": "legacy-db/row/77",
                       "extraction_method": "manual"},
    }
    for key, value in changes.items():
        cell[key] = value
    return cell


def test_import_keeps_ids_timestamps_creators_and_provenance(amp: Amp) -> None:
    original = imported_cell("01HQ3Z8X9Y0000000000000001")
    plain = imported_cell("01HQ3Z8X9Y0000000000000002",
                          identity={"owner_id": "team-9", "owner_type": "organization"},
                          lifecycle={"created_at": "2025-03-01T12:00:00+02:00"})
    response = amp.import_cells([original, plain], agent="migrator")
    assert response.status_code == 200, response.text
    assert response.json() == {"imported": 2, "errors": []}

    stored = amp.stored(original)
    for section in ("content", "provenance", "access_policy", "identity", "type", "id"):
        assert stored[section] == original[section], section
    assert stored["lifecycle"]["created_at"] == original["lifecycle"]["created_at"]
    assert stored["lifecycle"]["last_updated_at"] == original["lifecycle"]["last_updated_at"]
    read = amp.read(original["id"], agent="agent-1")
    assert read["scoring"]["access_count"] == 13  # the imported count, plus this read
    assert read["identity"]["created_by"] == "legacy-agent"

    plain_stored = amp.stored(plain)
    assert plain_stored["identity"]["created_by"] == "migrator"
    assert ms_of(plain_stored["lifecycle"]["created_at"]) == ms_of("2025-03-01T10:00:00Z")
    assert amp.owner_keys("team-9", "organization") == sorted(
        [cell_key(original), cell_key(plain)])


def test_import_reports_errors_per_cell_and_keeps_the_rest(amp: Amp) -> None:
    existing = imported_cell("01HQ3Z8X9Y0000000000000010")
    assert amp.import_cells([existing]).json()["imported"] == 1
    batch = [
        imported_cell("01HQ3Z8X9Y0000000000000011"),
        imported_cell("not-a-ulid"),
        imported_cell("01HQ3Z8X9Y0000000000000010"),  # already there
        imported_cell("01HQ3Z8X9Y0000000000000012", lifecycle={"status": "active"}),
        imported_cell("01HQ3Z8X9Y0000000000000013", amp_version="9.9.9"),
        imported_cell("01HQ3Z8X9Y0000000000000014",
                      lifecycle={"created_at": "2025-01-01T00:00:00Z", "status": "deleted"}),
        imported_cell("01HQ3Z8X9Y0000000000000015",
                      lifecycle={"created_at": "the first of March"}),
        imported_cell("01HQ3Z8X9Y0000000000000016"),
    ]
    response = amp.import_cells(batch)
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["imported"] == 2
    errors = {e["index"]: e for e in report["errors"]}
    assert set(errors) == {1, 2, 3, 4, 5, 6}
    assert errors[1]["error"]["details"]["field"] == "id"
    assert errors[2]["error"]["code"] == "precondition_failed"
    assert errors[3]["error"]["details"]["field"] == "lifecycle.created_at"
    assert errors[4]["error"]["details"]["field"] == "amp_version"
    assert errors[5]["error"]["details"]["field"] == "lifecycle.deleted_at"
    assert errors[6]["error"]["details"]["field"] == "lifecycle.created_at"
    assert all(errors[i]["id"] == batch[i]["id"] for i in errors)
    keys = amp.owner_keys("team-9", "organization")
    assert {k.rsplit("/", 1)[1] for k in keys} == {
        "01HQ3Z8X9Y0000000000000010", "01HQ3Z8X9Y0000000000000011",
        "01HQ3Z8X9Y0000000000000016"}
    # The existing cell was not overwritten.
    assert amp.entry_response(existing).json()["version"] == 1


def test_import_of_one_id_twice_in_a_batch_keeps_the_first(amp: Amp) -> None:
    first = imported_cell("01HQ3Z8X9Y0000000000000020")
    second = imported_cell("01HQ3Z8X9Y0000000000000020", content={"text": "the second copy"})
    report = amp.import_cells([first, second]).json()
    assert report["imported"] == 1
    assert [(e["index"], e["error"]["code"]) for e in report["errors"]] == [
        (1, "precondition_failed")]
    assert amp.stored(first)["content"]["text"] == first["content"]["text"]


def test_imports_of_one_batch_on_two_processes_store_each_cell_once(
        broker_processes: Callable[..., list[BrokerProcess]], ns: str) -> None:
    first, second = amp_processes(broker_processes, ns)
    batch = [imported_cell(f"01HQ3Z8X9Y00000000000{n:05d}") for n in range(200)]
    reports: list[dict[str, Any]] = []
    lock = threading.Lock()

    def send(url: str) -> None:
        with Amp(url, ns) as client:
            response = client.import_cells(batch)
            assert response.status_code == 200, response.text
            with lock:
                reports.append(response.json())

    threads = [threading.Thread(target=send, args=(p.url,)) for p in (first, second)]
    run_threads(threads)
    assert sum(r["imported"] for r in reports) == len(batch)
    refused = [e for r in reports for e in r["errors"]]
    assert len(refused) == len(batch)
    assert {e["error"]["code"] for e in refused} == {"precondition_failed"}
    with Amp(first.url, ns) as client:
        assert {client.entry_response(c).json()["version"] for c in batch} == {1}
        assert len(client.search_ids(query="container", limit=100)) == 100
