"""Approval-gated AMP cells over real HTTP on both stores: a gated create or patch is a
proposal that AMP reads, search and MEMP reads do not see until a reviewer approves it; the
approval writes the cell and indexes it in one step."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.support.amp import Amp, amp_broker, cell_key
from tests.support.brokers import BACKENDS, Broker
from tests.support.clients import assert_error, create_key


@pytest.fixture(params=BACKENDS)
def gated(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
          ns: str) -> Iterator[tuple[Amp, httpx.Client]]:
    """An AMP namespace whose user cells need approval, and a reviewer of it."""
    with amp_broker(broker_factory, request.param, ns) as amp:
        config = amp.http.put(f"/v1/namespaces/{ns}/config", json={
            "rules": [{"pattern": "cells/user/*", "approval": "required"}]})
        assert config.status_code == 200, config.text
        token, _ = create_key(amp.http, (ns, ["review"]))
        with httpx.Client(base_url=amp.url, headers={"Authorization": f"Bearer {token}"},
                          timeout=30) as reviewer:
            yield amp, reviewer


def test_a_gated_cell_is_invisible_until_approved(gated: tuple[Amp, httpx.Client]) -> None:
    amp, reviewer = gated
    body = {"type": "semantic", "content": {"text": "the user prefers oolong"},
            "identity": {"owner_id": "u-7", "owner_type": "user"}}
    proposed = amp.post_cell(body)
    assert proposed.status_code == 202, proposed.text
    proposal = proposed.json()
    cell = proposal["value"]
    assert proposal["key"] == cell_key(cell) and proposal["base_version"] == 0
    assert amp.get(cell["id"]).status_code == 404
    assert amp.search_ids(query="oolong") == []
    assert amp.entry_response(cell).status_code == 404
    ungated = amp.create("agent notes", owner="a-1", owner_type="agent")  # another pattern
    assert ungated["id"]

    approved = reviewer.post(f"/v1/namespaces/{amp.namespace}/proposals/{proposal['id']}/approve")
    assert approved.status_code == 200, approved.text
    assert amp.read(cell["id"])["content"]["text"] == "the user prefers oolong"
    assert amp.search_ids(query="oolong") == [cell["id"]]
    entry = amp.entry_response(cell).json()
    assert entry["proposal_id"] == proposal["id"] and entry["approved_by"]

    patched = amp.patch(cell["id"], {"content": {"text": "the user prefers sencha"}})
    assert patched.status_code == 202, patched.text
    assert amp.read(cell["id"])["content"]["text"] == "the user prefers oolong"
    diff = patched.json()["diff"]
    assert {"op": "replace", "path": "/content/text", "value": "the user prefers sencha"} in diff
    rejected = reviewer.post(
        f"/v1/namespaces/{amp.namespace}/proposals/{patched.json()['id']}/reject",
        json={"reason": "not what the user said"})
    assert rejected.status_code == 200
    assert amp.search_ids(query="sencha") == []
    actions = [r["action"] for r in amp.http.get(
        f"/v1/namespaces/{amp.namespace}/audit", params={"key": cell_key(cell)}).json()["records"]]
    assert actions == ["reject", "propose", "approve", "amp-create", "propose"]


def test_a_patch_approved_after_the_cell_moved_needs_a_rebase(
        gated: tuple[Amp, httpx.Client]) -> None:
    amp, reviewer = gated
    cell = amp.create("notes", owner="a-2", owner_type="agent")
    amp.http.put(f"/v1/namespaces/{amp.namespace}/config", json={
        "rules": [{"pattern": "cells/*", "approval": "required"}]})
    response = amp.patch(cell["id"], {"content": {"text": "first change"}})
    assert response.status_code == 202, response.text  # this process dropped its cached rules
    proposal = response.json()
    second = amp.patch(cell["id"], {"scoring": {"importance": 0.9}})
    assert second.status_code == 202
    path = f"/v1/namespaces/{amp.namespace}/proposals"
    assert reviewer.post(f"{path}/{second.json()['id']}/approve").status_code == 200
    moved = reviewer.post(f"{path}/{proposal['id']}/approve")
    error = assert_error(moved, 409, "write_conflict")
    current = error["details"]["current_version"]
    rebased = reviewer.post(f"{path}/{proposal['id']}/approve", json={"base_version": current})
    assert rebased.status_code == 200, rebased.text
    stored = amp.read(cell["id"])
    assert stored["content"]["text"] == "first change"
    assert stored["scoring"]["importance"] == 0.9


def test_a_merge_touching_a_gated_cell_is_refused_and_writes_nothing(
        gated: tuple[Amp, httpx.Client]) -> None:
    """A merge writes several cells in one step, which no single-key proposal can hold: where
    one of its cells needs approval it is 403 (docs/amp.md), not a proposal."""
    amp, reviewer = gated
    first, second = (amp.create(text, owner="a-4", owner_type="agent")
                     for text in ("prefers oolong", "likes oolong tea"))
    merge = {"ids": [first["id"], second["id"]], "text": "prefers oolong tea"}
    # The merged cell would be an agent's, outside `cells/user/*`: not gated.
    acting = {"X-AMP-Agent-ID": "agent-1"}
    ungated = amp.http.post("/amp/memories/merge", headers=acting, json=merge)
    assert ungated.status_code == 201, ungated.text
    third, fourth = (amp.create(text, owner="a-4", owner_type="agent")
                     for text in ("drinks oolong", "drinks oolong daily"))
    amp.http.put(f"/v1/namespaces/{amp.namespace}/config", json={
        "rules": [{"pattern": "cells/agent/a-4/*", "approval": "required"}]})
    gated_merge = amp.http.post("/amp/memories/merge", headers=acting, json={
        "ids": [third["id"], fourth["id"]], "text": "drinks oolong daily"})
    assert assert_error(gated_merge, 403, "forbidden")["details"] == {"field": "ids"}
    for cell in (third, fourth):
        assert amp.read(cell["id"])["lifecycle"]["status"] == "active"
    listed = reviewer.get(f"/v1/namespaces/{amp.namespace}/proposals")
    assert listed.status_code == 200 and listed.json()["proposals"] == [], listed.text
