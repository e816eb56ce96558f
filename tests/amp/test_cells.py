"""The MemoryCell wire format (broker/amp/cells.py) as the AMP API enforces it, on both stores:
every field of every body validated strictly — wrong types, scores outside [0, 1], unknown memory
and owner types, bad ULIDs, bad timestamps, unknown fields — answered 400 with `details.field`
naming the field, and nothing stored."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from broker.amp.cells import MAX_POLICY_GLOBS, new_ulid
from broker.storage import layout
from tests.support.amp import DAY_MS, Amp, cell_key, created, error_of, iso, now_ms
from tests.support.brokers import BACKENDS, data_client, start_broker

NAMESPACE = "amp-cells"


@pytest.fixture(scope="module", params=BACKENDS)
def amp(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Amp]:
    """One broker per store for the module: these tests only send what must be refused."""
    broker = start_broker(request.param, redis_url, amp_namespace=NAMESPACE,
                          amp_lifecycle_interval_seconds=3600.0)
    client = Amp(broker.url, NAMESPACE, app=broker.app)
    yield client
    client.close()
    broker.stop()


def good_cell() -> dict[str, Any]:
    return {
        "type": "episodic",
        "content": {"text": "The user complained about a timeout in connection-4",
                    "metadata": {"channel": "chat", "severity": 2}},
        "identity": {"owner_id": "user-42", "owner_type": "user", "session_id": "s-1"},
        "scoring": {"importance": 0.7, "confidence": 0.9, "decay_rate": 0.01},
        "access_policy": {"readable_by": ["agent-team-*"], "writable_by": ["agent-2"],
                          "public": False},
        "provenance": {"source_type": "conversation", "source_ref": "conv/123",
                       "extraction_method": "llm"},
        "expires_at": iso(now_ms() + 30 * DAY_MS),
    }


def with_change(path: str, value: Any) -> dict[str, Any]:
    """good_cell() with `path` (dotted) set to `value`, or removed when value is REMOVE."""
    body = copy.deepcopy(good_cell())
    *parents, last = path.split(".")
    target = body
    for part in parents:
        target = target[part]
    if value is REMOVE:
        del target[last]
    else:
        target[last] = value
    return body


REMOVE = object()
HUGE = "<1e400>"  # sent as the JSON number 1e400, which decodes to infinity
LONG = "x" * 129

BAD_CELLS = [
    pytest.param("type", 5, "type", id="type-wrong-type"),
    pytest.param("type", "opinion", "type", id="type-unknown"),
    pytest.param("type", REMOVE, "type", id="type-missing"),
    pytest.param("content", "just text", "content", id="content-not-object"),
    pytest.param("content", REMOVE, "content", id="content-missing"),
    pytest.param("content.text", 5, "content.text", id="text-wrong-type"),
    pytest.param("content.text", None, "content.text", id="text-null"),
    pytest.param("content.text", REMOVE, "content.text", id="text-missing"),
    pytest.param("content.text", "x" * (64 * 1024 + 1), "content.text", id="text-too-long"),
    pytest.param("content.metadata", ["a"], "content.metadata", id="metadata-list"),
    pytest.param("content.metadata", "a", "content.metadata", id="metadata-string"),
    pytest.param("content.summary", "x", "content.summary", id="content-unknown-field"),
    pytest.param("identity", REMOVE, "identity", id="identity-missing"),
    pytest.param("identity.owner_id", 42, "identity.owner_id", id="owner-id-wrong-type"),
    pytest.param("identity.owner_id", "", "identity.owner_id", id="owner-id-empty"),
    pytest.param("identity.owner_id", "user 42", "identity.owner_id", id="owner-id-space"),
    pytest.param("identity.owner_id", "u/42", "identity.owner_id", id="owner-id-slash"),
    pytest.param("identity.owner_id", "..", "identity.owner_id", id="owner-id-dotdot"),
    pytest.param("identity.owner_id", "u-42\n", "identity.owner_id", id="owner-id-newline"),
    pytest.param("identity.owner_id", LONG, "identity.owner_id", id="owner-id-too-long"),
    pytest.param("identity.owner_id", REMOVE, "identity.owner_id", id="owner-id-missing"),
    pytest.param("identity.owner_type", "robot", "identity.owner_type", id="owner-type-unknown"),
    pytest.param("identity.owner_type", 1, "identity.owner_type", id="owner-type-wrong-type"),
    pytest.param("identity.owner_type", REMOVE, "identity.owner_type", id="owner-type-missing"),
    pytest.param("identity.created_by", 7, "identity.created_by", id="created-by-wrong-type"),
    pytest.param("identity.session_id", "s 1", "identity.session_id", id="session-id-space"),
    pytest.param("identity.session_id", [], "identity.session_id", id="session-id-list"),
    pytest.param("identity.tenant", "x", "identity.tenant", id="identity-unknown-field"),
    pytest.param("scoring.importance", 1.5, "scoring.importance", id="importance-above-1"),
    pytest.param("scoring.importance", -0.1, "scoring.importance", id="importance-below-0"),
    pytest.param("scoring.importance", HUGE, "scoring.importance", id="importance-1e400"),
    pytest.param("scoring.importance", "high", "scoring.importance", id="importance-string"),
    pytest.param("scoring.importance", True, "scoring.importance", id="importance-bool"),
    pytest.param("scoring.confidence", 2, "scoring.confidence", id="confidence-above-1"),
    pytest.param("scoring.confidence", -1, "scoring.confidence", id="confidence-below-0"),
    pytest.param("scoring.confidence", None, "scoring.confidence", id="confidence-null"),
    pytest.param("scoring.decay_rate", -0.01, "scoring.decay_rate", id="decay-rate-negative"),
    pytest.param("scoring.decay_rate", "fast", "scoring.decay_rate", id="decay-rate-string"),
    pytest.param("scoring.access_count", -1, "scoring.access_count", id="access-count-negative"),
    pytest.param("scoring.relevance", 0.5, "scoring.relevance", id="scoring-unknown-field"),
    pytest.param("access_policy.readable_by", "agent-1", "access_policy.readable_by",
                 id="readable-by-string"),
    pytest.param("access_policy.readable_by", [5], "access_policy.readable_by[0]",
                 id="readable-by-number"),
    pytest.param("access_policy.readable_by", ["bad agent"], "access_policy.readable_by[0]",
                 id="readable-by-space"),
    pytest.param("access_policy.writable_by", [""], "access_policy.writable_by[0]",
                 id="writable-by-empty"),
    pytest.param("access_policy.writable_by", {"a": 1}, "access_policy.writable_by",
                 id="writable-by-object"),
    pytest.param("access_policy.public", "yes", "access_policy.public", id="public-string"),
    pytest.param("access_policy.owners", [], "access_policy.owners", id="policy-unknown-field"),
    pytest.param("provenance.source_type", 5, "provenance.source_type", id="source-type-int"),
    pytest.param("provenance.source_ref", "x" * 2049, "provenance.source_ref",
                 id="source-ref-too-long"),
    pytest.param("provenance.extraction_method", [], "provenance.extraction_method",
                 id="extraction-method-list"),
    pytest.param("provenance.model", "x", "provenance.model", id="provenance-unknown-field"),
    pytest.param("expires_at", "next tuesday", "expires_at", id="expires-at-not-a-time"),
    pytest.param("expires_at", "2026-13-01T00:00:00Z", "expires_at", id="expires-at-month-13"),
    pytest.param("expires_at", 1_900_000_000_000, "expires_at", id="expires-at-number"),
    pytest.param("expires_at", "2001-01-01T00:00:00Z", "expires_at", id="expires-at-past"),
    pytest.param("id", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "id", id="id-is-the-servers"),
    pytest.param("amp_version", "0.1.0", "amp_version", id="amp-version-is-the-servers"),
    pytest.param("lifecycle", {"status": "active"}, "lifecycle", id="lifecycle-is-the-servers"),
    pytest.param("tags", ["x"], "tags", id="unknown-top-level-field"),
]


def all_keys(amp: Amp) -> list[str]:
    response = amp.http.get(f"/v1/namespaces/{amp.namespace}/memory", params={"pattern": "*"})
    assert response.status_code == 200, response.text
    return [e["key"] for e in response.json()["entries"]]


def test_the_good_cell_is_accepted_as_written(amp: Amp) -> None:
    """The baseline the refusals below differ from by one field."""
    body = good_cell()
    stored = created(amp.post_cell(body))
    for section in ("content", "access_policy", "provenance"):
        assert stored[section] == body[section]
    assert stored["identity"] == {**body["identity"], "created_by": "agent-1"}
    assert stored["scoring"] == {**body["scoring"], "access_count": 0}
    assert stored["lifecycle"]["expires_at"] == body["expires_at"]
    assert amp.stored(stored) == stored


def test_a_minimal_cell_gets_the_spec_defaults(amp: Amp) -> None:
    cell = amp.create("minimal", owner="minimal-owner")
    assert cell["content"]["metadata"] == {}
    assert cell["scoring"] == {"importance": 0.5, "confidence": 1.0, "decay_rate": 0.01,
                               "access_count": 0}
    assert cell["access_policy"] == {"readable_by": [], "writable_by": [], "public": False}
    assert cell["identity"]["session_id"] is None
    assert cell["lifecycle"]["expires_at"] is None


@pytest.mark.parametrize(("path", "value", "field"), BAD_CELLS)
def test_create_refuses_a_bad_field(amp: Amp, path: str, value: Any, field: str) -> None:
    before = all_keys(amp)
    raw = json.dumps(with_change(path, value)).replace(f'"{HUGE}"', "1e400")
    response = amp.http.post("/amp/memories", content=raw.encode(),
                             headers={"Content-Type": "application/json",
                                      "X-AMP-Agent-ID": "agent-1"})
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["code"] == "invalid_request"
    assert error["details"]["field"] == field, error
    assert all_keys(amp) == before


@pytest.mark.parametrize(("body", "code"), [
    pytest.param(b"{", "invalid_json", id="truncated"),
    pytest.param(b"", "invalid_json", id="empty"),
    pytest.param(b'{"type": NaN}', "invalid_json", id="nan"),
    pytest.param(b"[1, 2]", "invalid_request", id="array"),
    pytest.param(b'"cell"', "invalid_request", id="string"),
    pytest.param(b"\xff\xfe", "invalid_json", id="not-utf8"),
])
def test_create_refuses_a_body_that_is_not_a_cell(amp: Amp, body: bytes, code: str) -> None:
    before = all_keys(amp)
    response = amp.http.post("/amp/memories", content=body,
                             headers={"Content-Type": "application/json",
                                      "X-AMP-Agent-ID": "agent-1"})
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == code
    assert all_keys(amp) == before


def test_create_refuses_a_body_that_is_not_json(amp: Amp) -> None:
    response = amp.http.post("/amp/memories", content=b"type=semantic",
                             headers={"Content-Type": "application/x-www-form-urlencoded",
                                      "X-AMP-Agent-ID": "agent-1"})
    assert response.status_code == 415, response.text


def test_created_by_cannot_name_another_agent(amp: Amp) -> None:
    before = all_keys(amp)
    response = amp.post_cell(with_change("identity.created_by", "agent-2"), agent="agent-1")
    assert response.status_code == 403, response.text
    assert error_of(response)["details"]["field"] == "identity.created_by"
    assert all_keys(amp) == before


@pytest.mark.parametrize("agent", [
    pytest.param("agent one", id="space"),
    pytest.param("agent/1", id="slash"),
    pytest.param("a" * 129, id="too-long"),
    pytest.param("agent-*", id="wildcard"),
])
def test_an_acting_agent_id_that_is_no_agent_id_is_refused(amp: Amp, agent: str) -> None:
    before = all_keys(amp)
    response = amp.post_cell(good_cell(), agent=agent)
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == "X-AMP-Agent-ID"
    assert all_keys(amp) == before
    search = amp.search_response(agent=agent)
    assert search.status_code == 400, search.text


def test_the_admin_key_must_say_which_agent_acts(amp: Amp) -> None:
    response = amp.http.post("/amp/memories", json=good_cell())
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == "X-AMP-Agent-ID"


BAD_IDS = [
    pytest.param("not-a-ulid", id="words"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FA", id="25-chars"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FAVX", id="27-chars"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FAU", id="letter-U"),
    pytest.param("81ARZ3NDEKTSV4RRFFQ69G5FAV", id="overflow"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5F%20", id="escaped-space"),
    pytest.param("search", id="search-word"),
]


@pytest.mark.parametrize("cell_id", BAD_IDS)
@pytest.mark.parametrize("method", ["GET", "PATCH", "DELETE"])
def test_a_bad_ulid_in_the_path_is_refused(amp: Amp, method: str, cell_id: str) -> None:
    body = {"content": {"text": "x"}} if method == "PATCH" else None
    response = amp.http.request(method, f"/amp/memories/{cell_id}", json=body,
                                headers={"X-AMP-Agent-ID": "agent-1"})
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == "id"


@pytest.mark.parametrize("method", ["GET", "PATCH", "DELETE"])
def test_a_well_formed_unknown_id_is_not_found(amp: Amp, method: str) -> None:
    body = {"content": {"text": "x"}} if method == "PATCH" else None
    response = amp.http.request(method, "/amp/memories/01ARZ3NDEKTSV4RRFFQ69G5FAV", json=body,
                                headers={"X-AMP-Agent-ID": "agent-1"})
    assert response.status_code == 404, response.text
    assert error_of(response)["code"] == "not_found"


BAD_PATCHES = [
    pytest.param({"content": {"text": 5}}, "content.text", id="text-wrong-type"),
    pytest.param({"content": {"metadata": "x"}}, "content.metadata", id="metadata-string"),
    pytest.param({"content": {"html": "x"}}, "content.html", id="content-unknown-field"),
    pytest.param({"content": "x"}, "content", id="content-not-object"),
    pytest.param({"scoring": {"importance": 1.01}}, "scoring.importance", id="importance-high"),
    pytest.param({"scoring": {"confidence": -0.5}}, "scoring.confidence", id="confidence-low"),
    pytest.param({"scoring": {"decay_rate": "x"}}, "scoring.decay_rate", id="decay-rate-str"),
    pytest.param({"scoring": {"access_count": 99}}, "scoring.access_count",
                 id="access-count-is-the-servers"),
    pytest.param({"access_policy": {"readable_by": ["a b"]}}, "access_policy.readable_by[0]",
                 id="readable-by-space"),
    pytest.param({"access_policy": {"public": 1}}, "access_policy.public", id="public-int"),
    pytest.param({"expires_at": "soon"}, "expires_at", id="expires-at-not-a-time"),
    pytest.param({"expires_at": "2000-01-01T00:00:00Z"}, "expires_at", id="expires-at-past"),
    pytest.param({"lifecycle": {"expires_at": "soon"}}, "expires_at",
                 id="lifecycle-expires-at-not-a-time"),
    pytest.param({"lifecycle": {"status": "active"}}, "lifecycle.status",
                 id="status-cannot-be-patched"),
    pytest.param({"lifecycle": {"status": "archived"}}, "lifecycle.status",
                 id="status-archived-cannot-be-patched"),
    pytest.param({"lifecycle": {"status": "zombie"}}, "lifecycle.status", id="status-unknown"),
    pytest.param({"lifecycle": {"created_at": "2020-01-01T00:00:00Z"}}, "lifecycle.created_at",
                 id="created-at-is-the-servers"),
    pytest.param({"identity": {"owner_id": "u-2"}}, "identity", id="identity-is-fixed"),
    pytest.param({"type": "procedural"}, "type", id="type-is-fixed"),
    pytest.param({"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}, "id", id="id-is-fixed"),
]


@pytest.mark.parametrize(("patch", "field"), BAD_PATCHES)
def test_patch_refuses_a_bad_field_and_changes_nothing(amp: Amp, patch: dict[str, Any],
                                                       field: str) -> None:
    cell = amp.create("the cell being patched", owner="patch-target")
    before = amp.history(cell)
    response = amp.patch(cell["id"], patch)
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == field, error_of(response)
    assert amp.history(cell) == before


BAD_SEARCHES = [
    pytest.param({"query": 5}, "query", id="query-number"),
    pytest.param({"query": "?!"}, "query", id="query-without-words"),
    pytest.param({"owner_id": "a b"}, "owner_id", id="owner-id-space"),
    pytest.param({"owner_type": "robot"}, "owner_type", id="owner-type-unknown"),
    pytest.param({"types": "semantic"}, "types", id="types-string"),
    pytest.param({"types": ["opinion"]}, "types[0]", id="types-unknown"),
    pytest.param({"status": ["zombie"]}, "status[0]", id="status-unknown"),
    pytest.param({"status": ["deleted"]}, "status", id="status-deleted-never"),
    pytest.param({"include_stale": "yes"}, "include_stale", id="include-stale-string"),
    pytest.param({"metadata": ["a"]}, "metadata", id="metadata-list"),
    pytest.param({"created_after": "yesterday"}, "created_after", id="created-after-bad"),
    pytest.param({"created_before": 12}, "created_before", id="created-before-number"),
    pytest.param({"limit": 0}, "limit", id="limit-zero"),
    pytest.param({"limit": 101}, "limit", id="limit-too-big"),
    pytest.param({"limit": "ten"}, "limit", id="limit-string"),
    pytest.param({"cursor": "abc"}, "cursor", id="cursor-not-ours"),
    pytest.param({"cursor": 5}, "cursor", id="cursor-number"),
    pytest.param({"sort": "new"}, "sort", id="unknown-field"),
]


@pytest.mark.parametrize(("body", "field"), BAD_SEARCHES)
def test_search_refuses_a_bad_field(amp: Amp, body: dict[str, Any], field: str) -> None:
    response = amp.search_response(**body)
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == field, error_of(response)


@pytest.mark.parametrize("path", ["/amp/lifecycle/run", "/amp/purge"])
@pytest.mark.parametrize(("body", "field"), [
    pytest.param({"as_of": "when pigs fly"}, "as_of", id="as-of-not-a-time"),
    pytest.param({"as_of": 1_900_000_000_000}, "as_of", id="as-of-number"),
    pytest.param({"ids": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}, "ids", id="ids-string"),
    pytest.param({"force": True}, "force", id="unknown-field"),
])
def test_admin_runs_refuse_a_bad_field(amp: Amp, path: str, body: dict[str, Any],
                                       field: str) -> None:
    response = amp.http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == field, error_of(response)


@pytest.mark.parametrize(("body", "field"), [
    pytest.param({"cells": {}}, "cells", id="cells-object"),
    pytest.param({}, "cells", id="cells-missing"),
    pytest.param({"cells": [{"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "type": "semantic",
                             "content": {"text": "x"},
                             "identity": {"owner_id": "u", "owner_type": "user"},
                             "scoring": {"importance": 7}}]},
                 "cells[0].scoring.importance", id="cell-score-out-of-range"),
    pytest.param({"cells": [{"id": "01ARZ3NDEKTSV4RRFFQ69G5FAV", "type": "semantic",
                             "content": {"text": "x"},
                             "identity": {"owner_id": "u", "owner_type": "user"},
                             "lifecycle": {"status": "forgotten"}}]},
                 "cells[0].lifecycle.status", id="cell-status-unknown"),
])
def test_import_refuses_a_malformed_body_and_stores_nothing(amp: Amp, body: dict[str, Any],
                                                           field: str) -> None:
    before = all_keys(amp)
    response = amp.http.post("/amp/import", json=body)
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["field"] == field, error_of(response)
    assert all_keys(amp) == before


def test_import_refuses_a_body_that_is_not_json(amp: Amp) -> None:
    response = amp.http.post("/amp/import", content=b'{"cells": [',
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert error_of(response)["code"] == "invalid_json"


# ---- access policy lists: at most MAX_POLICY_GLOBS globs each in what requests send ----

def globs(count: int) -> list[str]:
    return [f"team-{n}-*" for n in range(count)]


def to_import(text: str, policy: dict[str, Any]) -> dict[str, Any]:
    return {"id": new_ulid(), "type": "semantic", "content": {"text": text},
            "identity": {"owner_id": "importer", "owner_type": "user"},
            "lifecycle": {"created_at": iso(now_ms())}, "access_policy": policy}


def merge_response(amp: Amp, ids: list[str], policy: dict[str, Any]) -> Any:
    return amp.http.post("/amp/memories/merge", json={
        "ids": ids, "text": "merged", "access_policy": policy},
        headers={"X-AMP-Agent-ID": "agent-1"})


@pytest.mark.parametrize("name", ["readable_by", "writable_by"])
def test_a_policy_over_the_glob_bound_is_refused_on_every_way_in(amp: Amp, name: str) -> None:
    over = {name: globs(MAX_POLICY_GLOBS + 1)}
    field = f"access_policy.{name}"
    owner = f"bound-{name}"
    sources = [amp.create(f"source {n}", owner=owner) for n in range(2)]
    before = all_keys(amp)
    history = [amp.history(cell) for cell in sources]
    refusals = {
        "create": amp.post_cell(with_change("access_policy", over)),
        "patch": amp.patch(sources[0]["id"], {"access_policy": over}),
        "import": amp.import_cells([to_import("fine", {}), to_import("too wide", over)]),
        "merge": merge_response(amp, [cell["id"] for cell in sources], over),
    }
    for way, response in refusals.items():
        assert response.status_code == 400, (way, response.text)
        error = error_of(response)
        expected = f"cells[1].{field}" if way == "import" else field
        assert (error["code"], error["details"]["field"]) == ("invalid_request", expected), way
        assert expected in error["message"], way
    assert all_keys(amp) == before  # nothing created, imported or merged
    assert [amp.history(cell) for cell in sources] == history  # nor patched or archived


def test_a_policy_at_the_glob_bound_is_accepted_on_every_way_in(amp: Amp) -> None:
    full = {"readable_by": globs(MAX_POLICY_GLOBS), "writable_by": globs(MAX_POLICY_GLOBS)}
    made = created(amp.post_cell(with_change("access_policy", full)))
    assert made["access_policy"] == {**full, "public": False}
    sources = [amp.create(f"full source {n}", owner="bound-full") for n in range(2)]
    patched = amp.patch(sources[0]["id"], {"access_policy": full})
    assert patched.status_code == 200, patched.text
    assert amp.stored(sources[0])["access_policy"] == {**full, "public": False}
    imported = amp.import_cells([to_import("full import", full)])
    assert imported.json() == {"imported": 1, "errors": []}, imported.text
    merged = merge_response(amp, [cell["id"] for cell in sources], full)
    assert merged.status_code == 201, merged.text
    assert merged.json()["access_policy"] == {**full, "public": False}


def test_a_cell_stored_over_the_glob_bound_is_still_read_patched_and_found(amp: Amp) -> None:
    """A cell written before the bound existed: the bound is on input only."""
    cell = amp.create("a legacy wide policy", owner="bound-legacy")
    wide = {"readable_by": globs(1000), "writable_by": globs(MAX_POLICY_GLOBS + 1),
            "public": False}
    stored = {**amp.stored(cell), "access_policy": wide}
    data_client(amp.app).hset(layout.entry(amp.namespace, cell_key(cell)), "val",
                              json.dumps(stored))
    assert amp.read(cell["id"])["access_policy"] == wide
    patched = amp.patch(cell["id"], {"content": {"text": "a legacy wide policy, patched"}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["access_policy"] == wide
    assert amp.stored(cell)["access_policy"] == wide
    assert amp.stored(cell)["content"]["text"] == "a legacy wide policy, patched"
    assert amp.search_ids(query="legacy", owner_id="bound-legacy", owner_type="user") == [
        cell["id"]]
