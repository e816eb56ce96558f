"""Merging cells (`POST /amp/memories/merge`): one new cell of the sources' owner, provenance
naming them, the sources archived as by any status change; bad input and a merge that lost
answer 4xx with nothing written; two brokers merging overlapping sets at once."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.amp import NO_BACKGROUND_RUNS, Amp, error_of, run_threads, started_amp
from tests.support.brokers import BACKENDS, start_broker
from tests.support.clients import create_key
from tests.support.depth import arrays

AGENT = {"X-AMP-Agent-ID": "agent-1"}


@pytest.fixture(scope="module", params=BACKENDS)
def amp(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Amp]:
    """One broker per store; tests keep to owners of their own."""
    with started_amp(request.param, redis_url) as client:
        yield client


def merge(amp: Amp, body: Any, headers: dict[str, str] = AGENT) -> httpx.Response:
    if isinstance(body, bytes):
        return amp.http.post("/amp/memories/merge", content=body,
                             headers={**headers, "Content-Type": "application/json"})
    return amp.http.post("/amp/memories/merge", json=body, headers=headers)


def owned(amp: Amp, count: int = 3, **fields: Any) -> tuple[str, list[dict[str, Any]]]:
    owner = f"u-{uuid.uuid4().hex[:8]}"
    return owner, [amp.create(f"Ana likes tea, note {n}", owner=owner, **fields)
                   for n in range(count)]


def test_a_merge_makes_one_cell_of_the_owner_and_archives_the_sources(amp: Amp) -> None:
    owner, sources = owned(amp)
    ids = [cell["id"] for cell in sources]
    response = merge(amp, {"ids": ids, "text": "Ana likes tea", "metadata": {"topic": "tea"},
                           "scoring": {"importance": 0.9}})
    assert response.status_code == 201, response.text
    merged = response.json()
    assert merged["identity"] == {"owner_id": owner, "owner_type": "user",
                                  "created_by": "agent-1", "session_id": None}
    assert merged["content"] == {"text": "Ana likes tea", "metadata": {"topic": "tea"}}
    assert merged["provenance"] == {"source_type": "merge", "source_ref": ",".join(ids),
                                    "extraction_method": "merge"}
    assert merged["type"] == "semantic"
    assert merged["scoring"]["importance"] == 0.9
    assert merged["lifecycle"]["status"] == "active"
    assert amp.stored(merged) == merged  # the reply is the cell as stored
    for cell in sources:
        assert amp.statuses(cell) == ["active", "archived"]
        stored = amp.stored(cell)
        assert stored["content"] == cell["content"]
        assert stored["lifecycle"]["status"] == "archived"
    # Archived cells leave the default search; the merged one is found.
    assert amp.search_ids(owner_id=owner) == [merged["id"]]
    assert sorted(amp.search_ids(owner_id=owner, status=["archived"])) == sorted(ids)


def test_the_sources_archival_is_in_the_audit_log_as_the_agents(amp: Amp) -> None:
    _, sources = owned(amp, 2)
    assert merge(amp, {"ids": [c["id"] for c in sources], "text": "t"}).status_code == 201
    response = amp.http.get(f"/v1/namespaces/{amp.namespace}/audit", params={"limit": 50})
    assert response.status_code == 200, response.text
    records = response.json()["records"]
    archived = {r["key"] for r in records if r.get("action") == "amp-archived"
                and r.get("actor") == "agent-1"}
    assert {f"cells/user/{c['identity']['owner_id']}/{c['id']}" for c in sources} <= archived


@pytest.mark.parametrize(("body", "status", "field"), [
    pytest.param(lambda ids, _: {"ids": ids[:1], "text": "x"}, 400, "ids", id="one-id"),
    pytest.param(lambda ids, _: {"ids": [], "text": "x"}, 400, "ids", id="no-ids"),
    pytest.param(lambda ids, _: {"ids": [ids[0]] * 51, "text": "x"}, 400, "ids",
                 id="over-cap"),
    pytest.param(lambda ids, _: {"ids": [ids[0], ids[1], ids[0]], "text": "x"}, 400,
                 "ids[2]", id="duplicate"),
    pytest.param(lambda ids, _: {"ids": [ids[0], "01ARZ3NDEKTSV4RRFFQ69G5FAV"], "text": "x"},
                 404, "ids[1]", id="unknown-id"),
    pytest.param(lambda ids, _: {"ids": [ids[0], "*" * 128], "text": "x"}, 400, "ids[1]",
                 id="128-stars"),
    pytest.param(lambda ids, _: {"ids": [ids[0], ids[1] + "\x00\x1b"], "text": "x"}, 400,
                 "ids[1]", id="control-chars"),
    pytest.param(lambda ids, other: {"ids": [ids[0], other], "text": "x"}, 400, "ids[1]",
                 id="other-owner"),
    pytest.param(lambda ids, _: {"ids": ids, "text": "x" * (64 * 1024 + 1)}, 400, "text",
                 id="text-too-long"),
    pytest.param(lambda ids, _: {"ids": ids, "text": ""}, 400, "text", id="empty-text"),
    pytest.param(lambda ids, _: {"ids": ids}, 400, "text", id="no-text"),
    pytest.param(lambda ids, _: {"ids": ids, "text": "x", "owner_id": "u-2"}, 400,
                 "owner_id", id="unknown-field"),
    pytest.param(lambda ids, _: {"ids": ids, "text": "x", "scoring": {"importance": 1e308}},
                 400, "scoring.importance", id="huge-number"),
    pytest.param(lambda ids, _: {"ids": ids, "text": "x", "type": "dream"}, 400, "type",
                 id="unknown-type"),
])
def test_bad_input_is_refused_naming_the_field_and_nothing_is_written(
        amp: Amp, body: Any, status: int, field: str) -> None:
    owner, sources = owned(amp)
    _, (other,) = owned(amp, 1)
    before = [amp.history(cell) for cell in [*sources, other]]
    response = merge(amp, body([c["id"] for c in sources], other["id"]))
    assert response.status_code == status, response.text
    assert error_of(response)["details"].get("field") == field, response.text
    assert [amp.history(cell) for cell in [*sources, other]] == before
    assert len(amp.owner_keys(owner)) == 3


def test_a_body_nested_1000_deep_or_not_json_is_refused(amp: Amp) -> None:
    owner, sources = owned(amp, 2)
    ids = ",".join(f'"{c["id"]}"' for c in sources)
    for body in (b'{"ids": [' + ids.encode() + b'], "text": "x", "metadata": {"a": '
                 + arrays(1000) + b"}}", b'{"ids": [', b"\xff\xfe"):
        response = merge(amp, body)
        assert response.status_code == 400, response.text
    assert all(amp.statuses(cell) == ["active"] for cell in sources)
    assert len(amp.owner_keys(owner)) == 2


def test_a_body_over_the_amp_body_limit_is_413(amp: Amp) -> None:
    owner, sources = owned(amp, 2)
    response = merge(amp, {"ids": [c["id"] for c in sources], "text": "x",
                           "metadata": {"blob": "x" * (300 * 1024)}})
    assert response.status_code == 413, response.text
    assert all(amp.statuses(cell) == ["active"] for cell in sources)
    assert len(amp.owner_keys(owner)) == 2


def test_archived_or_deleted_sources_are_refused(amp: Amp) -> None:
    _, sources = owned(amp, 3)
    ids = [c["id"] for c in sources]
    assert merge(amp, {"ids": ids[:2], "text": "first"}).status_code == 201
    again = merge(amp, {"ids": [ids[2], ids[1]], "text": "second"})
    assert again.status_code == 409, again.text
    assert error_of(again)["details"] == {"field": "ids[1]", "id": ids[1],
                                          "status": "archived"}
    assert amp.delete(ids[0]).status_code == 200
    gone = merge(amp, {"ids": [ids[2], ids[0]], "text": "third"})
    assert gone.status_code == 404, gone.text
    assert error_of(gone)["details"]["field"] == "ids[1]"
    assert amp.statuses(sources[2]) == ["active"]


def test_cells_the_agent_may_not_write_are_refused(amp: Amp) -> None:
    owner, sources = owned(amp, 2)
    shared = amp.create("Ana likes coffee", owner=owner, agent="agent-2",
                        access_policy={"readable_by": ["agent-1"]})
    hidden = amp.create("Ana likes cocoa", owner=owner, agent="agent-2")
    for cell in (shared, hidden):
        response = merge(amp, {"ids": [sources[0]["id"], cell["id"]], "text": "x"})
        assert response.status_code == 403, response.text
        assert error_of(response)["details"]["field"] == "ids[1]"
    assert all(amp.statuses(cell) == ["active"] for cell in [*sources, shared, hidden])
    assert len(amp.owner_keys(owner)) == 4


def test_a_key_without_amp_of_another_tenant_or_revoked_is_refused(amp: Amp) -> None:
    owner, sources = owned(amp, 2)
    admin = amp.http
    foreign, _ = create_key(admin, ("other-tenant", ["read", "write", "amp"]))
    reader, _ = create_key(admin, (amp.namespace, ["read", "write"]))
    revoked, revoked_id = create_key(admin, (amp.namespace, ["amp", "impersonate"]))
    assert admin.delete(f"/v1/keys/{revoked_id}").status_code in (200, 204)
    for token, status in ((foreign, 403), (reader, 403), (revoked, 401)):
        with amp.as_token(token) as caller:
            response = merge(caller, {"ids": [c["id"] for c in sources], "text": "x"})
            assert response.status_code == status, response.text
    assert all(amp.statuses(cell) == ["active"] for cell in sources)
    assert len(amp.owner_keys(owner)) == 2


def test_two_brokers_merging_overlapping_sets_at_once_archive_each_source_once(
        redis_url: str) -> None:
    if "redis" not in BACKENDS:
        pytest.skip("two brokers share one Redis")
    namespace = f"m-{uuid.uuid4().hex[:10]}"
    first, second = (start_broker("redis", redis_url, amp_namespace=namespace,
                                  amp_lifecycle_interval_seconds=NO_BACKGROUND_RUNS)
                     for _ in range(2))
    amp, other = Amp(first.url, namespace, app=first.app), Amp(second.url, namespace,
                                                               app=second.app)
    try:
        for _ in range(10):
            owner, sources = owned(amp, 3)
            ids = [c["id"] for c in sources]
            replies: list[httpx.Response] = []
            start = threading.Barrier(2)

            def run(client: Amp, chosen: list[str], start: threading.Barrier = start,
                    replies: list[httpx.Response] = replies) -> None:
                start.wait()
                replies.append(merge(client, {"ids": chosen, "text": "merged"}))

            run_threads([threading.Thread(target=run, args=(amp, ids[:2])),
                         threading.Thread(target=run, args=(other, ids[1:]))])
            assert sorted(r.status_code for r in replies) == [201, 409], \
                [r.text for r in replies]
            won = next(r.json() for r in replies if r.status_code == 201)
            lost = next(r for r in replies if r.status_code == 409)
            assert error_of(lost)["details"]["status"] == "archived"
            merged_from = won["provenance"]["source_ref"].split(",")
            for cell in sources:
                assert amp.statuses(cell) == (["active", "archived"]
                                              if cell["id"] in merged_from else ["active"])
            assert len(amp.owner_keys(owner)) == 4
    finally:
        amp.close()
        other.close()
        first.stop()
        second.stop()
