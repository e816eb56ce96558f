"""Fair share on governance (docs/limits.md): making a proposal takes a write token from the
proposer's and the namespace's buckets, a namespace holds at most MEMP_MAX_PENDING_PROPOSALS
pending proposals, and an approval writes only within the quotas (it takes no tokens: its
proposal did). Both stores, and two broker processes sharing one budget."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.amp import amp_broker
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, BrokerProcess
from tests.support.clients import create_key
from tests.support.limits import SLOW, assert_rate_limited, mem, set_limits, usage


def props(ns: str, suffix: str = "") -> str:
    return f"/v1/namespaces/{ns}/proposals{suffix}"


def configure(admin: httpx.Client, ns: str, **limits: Any) -> None:
    """Writes under facts/* need approval; the namespace has `limits`."""
    response = admin.put(f"/v1/namespaces/{ns}/config", json={
        "rules": [{"pattern": "facts/*", "approval": "required"}], "limits": limits})
    assert response.status_code == 200, response.text


def pending(admin: httpx.Client, ns: str) -> list[str]:
    response = admin.get(props(ns), params={"status": "pending"})
    assert response.status_code == 200, response.text
    return [p["id"] for p in response.json()["proposals"]]


@pytest.fixture(params=BACKENDS)
def limited(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker]) -> Broker:
    """A broker on each store that holds at most 3 pending proposals per namespace."""
    return broker_factory(request.param, max_pending_proposals=3)


@pytest.fixture
def people(limited: Broker, ns: str) -> Iterator[dict[str, httpx.Client]]:
    """The broker's admin, a writer and a reviewer (API keys of their own)."""
    made = {"admin": limited.client()}
    for name, grants in (("writer", ["read", "write"]), ("reviewer", ["read", "review"])):
        token, _ = create_key(made["admin"], (ns, grants))
        made[name] = limited.client(token)
    yield made
    for client in made.values():
        client.close()


def test_a_proposal_takes_a_write_token(people: dict[str, httpx.Client], ns: str) -> None:
    admin, writer = people["admin"], people["writer"]
    configure(admin, ns, writes_per_second=SLOW, write_burst=2)
    assert writer.put(mem(ns, "facts/a"), json={"value": 1}).status_code == 202
    assert writer.put(mem(ns, "facts/b"), json={"value": 2},
                      headers={"Idempotency-Key": "prop-b"}).status_code == 202
    assert_rate_limited(writer.put(mem(ns, "facts/c"), json={"value": 3}), "namespace",
                        "writes_per_second")
    assert_rate_limited(writer.delete(mem(ns, "facts/a"), params={"approval_required": "true"}),
                        "namespace", "writes_per_second")
    # A resent proposal is replayed, closed bucket or not.
    again = writer.put(mem(ns, "facts/b"), json={"value": 2}, headers={"Idempotency-Key":
                                                                       "prop-b"})
    assert again.status_code == 202, again.text
    assert len(pending(admin, ns)) == 2 and usage(admin, ns)["keys"] == 0


def test_approvals_take_no_tokens_but_respect_quotas(people: dict[str, httpx.Client],
                                                     ns: str) -> None:
    admin, writer, reviewer = people["admin"], people["writer"], people["reviewer"]
    assert admin.put(mem(ns, "other"), json={"value": "x"}).status_code == 201
    configure(admin, ns, writes_per_second=SLOW, write_burst=2, max_keys=1)
    first = writer.put(mem(ns, "facts/a"), json={"value": 1}).json()["id"]
    second = writer.put(mem(ns, "facts/b"), json={"value": 2}).json()["id"]
    refused = reviewer.post(props(ns, f"/{first}/approve"), json={})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert refused.json()["error"]["details"] == {"limit": "max_keys", "max": 1, "used": 1,
                                                  "requested": 1}
    assert writer.get(mem(ns, "facts/a")).status_code == 404
    assert set(pending(admin, ns)) == {first, second}  # still pending: approve it later
    assert admin.delete(mem(ns, "other")).status_code == 200  # room made
    approved = reviewer.post(props(ns, f"/{first}/approve"), json={})
    assert approved.status_code == 200, approved.text  # the bucket is empty: no token needed
    assert writer.get(mem(ns, "facts/a")).json()["value"] == 1
    assert reviewer.post(props(ns, f"/{second}/reject"),
                         json={"reason": "no"}).status_code == 200
    assert usage(admin, ns)["keys"] == 1


def test_proposals_count_toward_max_bytes(people: dict[str, httpx.Client], ns: str) -> None:
    """A proposal is stored data: it must fit `max_bytes` with the values; its approval needs
    no more room than it took (what only an approval needed goes), so it passes even in a
    namespace full to the byte."""
    admin, writer, reviewer = people["admin"], people["writer"], people["reviewer"]
    assert admin.put(mem(ns, "facts/a"), json={"value": "small"}).status_code == 201
    configure(admin, ns, max_bytes=usage(admin, ns)["bytes"] + 2)
    refused = writer.put(mem(ns, "facts/a"), json={"value": "much bigger"})
    assert refused.status_code == 429, refused.text
    details = refused.json()["error"]["details"]
    assert details["limit"] == "max_bytes" and details["requested"] > 2 * len("much bigger")
    assert pending(admin, ns) == [] and usage(admin, ns)["proposal_bytes"] == 0
    configure(admin, ns, max_bytes=usage(admin, ns)["bytes"] + 4000)
    grown = writer.put(mem(ns, "facts/a"), json={"value": "much bigger"})
    assert grown.status_code == 202, grown.text
    kept = usage(admin, ns)
    assert kept["proposal_bytes"] == details["requested"]  # the same record, counted
    configure(admin, ns, max_bytes=kept["bytes"] + kept["proposal_bytes"])  # full
    approved = reviewer.post(props(ns, f"/{grown.json()['id']}/approve"), json={})
    assert approved.status_code == 200, approved.text
    after = usage(admin, ns)
    assert after["bytes"] + after["proposal_bytes"] <= kept["bytes"] + kept["proposal_bytes"]
    assert 0 < after["proposal_bytes"] < kept["proposal_bytes"]  # kept, without its write
    assert writer.get(mem(ns, "facts/a")).json()["value"] == "much bigger"


def test_propose_and_reject_in_a_loop_cannot_pass_the_quota(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    """The attack: a key with write and review proposes 40 KB values and rejects them, over
    and over. Every proposal kept counts, so the namespace stops at its quota with
    `quota_exceeded`, until closed proposals expire after the retention; the audit trail
    keeps every step and still verifies."""
    broker = broker_factory("redis", proposal_retention_seconds=2)
    with broker.client() as admin:
        configure(admin, ns, max_bytes=200_000)
        token, _ = create_key(admin, (ns, ["read", "write", "review"]))
        with broker.client(token) as tenant:
            outcomes = []
            for i in range(12):
                made = tenant.put(mem(ns, f"facts/{i}"), json={"value": "x" * 40_000})
                outcomes.append(made.status_code)
                if made.status_code == 202:
                    assert tenant.post(props(ns, f"/{made.json()['id']}/reject"),
                                       json={"reason": "again"}).status_code == 200
                else:
                    assert made.json()["error"]["details"]["limit"] == "max_bytes"
                used = usage(admin, ns)
                assert used["bytes"] + used["proposal_bytes"] <= 200_000
            assert 202 in outcomes and 429 in outcomes
            assert outcomes.index(429) > 0 and set(outcomes[outcomes.index(429):]) == {429}
            deadline = time.monotonic() + 30  # the sweeper drops them 2 s after they closed
            while usage(admin, ns)["proposal_bytes"] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert usage(admin, ns)["proposal_bytes"] == 0
            assert admin.get(props(ns)).json()["proposals"] == []
            assert tenant.put(mem(ns, "facts/again"), json={"value": "x" * 40_000}
                              ).status_code == 202  # room again
        audit = admin.get(f"/v1/namespaces/{ns}/audit", params={"limit": 500}).json()
        actions = Counter(record["action"] for record in audit["records"])
        assert actions["propose"] == outcomes.count(202) + 1
        assert actions["reject"] == outcomes.count(202)
        assert admin.get(f"/v1/namespaces/{ns}/audit/verify").json()["ok"] is True


def test_pending_proposals_are_bounded_per_namespace(people: dict[str, httpx.Client],
                                                     ns: str) -> None:
    admin, writer, reviewer = people["admin"], people["writer"], people["reviewer"]
    configure(admin, ns)
    made = [writer.put(mem(ns, f"facts/{i}"), json={"value": i}).json()["id"]
            for i in range(3)]
    full = writer.put(mem(ns, "facts/3"), json={"value": 3})
    assert full.status_code == 429, full.text
    assert full.json()["error"]["code"] == "quota_exceeded"
    assert full.json()["error"]["details"] == {"limit": "max_pending_proposals", "max": 3,
                                               "used": 3, "requested": 1}
    assert "retry-after" not in full.headers
    report = admin.get(f"/v1/namespaces/{ns}/usage").json()
    assert report["usage"]["proposals"] == 3
    assert report["agent_defaults"]["max_pending_proposals"] == 3
    over = admin.put(mem(ns, "facts/4"), json={"value": 4})  # for the admin key too
    assert over.status_code == 429
    assert sorted(pending(admin, ns)) == sorted(made)
    assert reviewer.post(props(ns, f"/{made[0]}/reject"), json={}).status_code == 200
    assert writer.put(mem(ns, "facts/3"), json={"value": 3}).status_code == 202  # room again
    # Another namespace has its own bound.
    configure(admin, f"{ns}-b")
    assert admin.put(mem(f"{ns}-b", "facts/x"), json={"value": 1}).status_code == 202


def test_unauthorised_decisions_change_nothing(people: dict[str, httpx.Client], ns: str,
                                               limited: Broker) -> None:
    admin, writer = people["admin"], people["writer"]
    configure(admin, ns, max_keys=5)
    proposal = writer.put(mem(ns, "facts/a"), json={"value": 1}).json()["id"]
    other_token, _ = create_key(admin, (f"{ns}-other", ["read", "write", "review"]))
    with limited.client(other_token) as other:
        assert other.post(props(ns, f"/{proposal}/approve"), json={}).status_code == 403
    assert writer.post(props(ns, f"/{proposal}/approve"), json={}).status_code == 403
    assert admin.post(props(ns, f"/{proposal}/approve"), content=b"{nope",
                      headers={"Content-Type": "application/json"}).status_code == 400
    assert admin.post(props(ns, "/prop_nope/approve"), json={}).status_code == 404
    assert pending(admin, ns) == [proposal]
    assert writer.get(mem(ns, "facts/a")).status_code == 404
    assert usage(admin, ns)["keys"] == 0


def test_an_amp_cell_approval_respects_the_amp_quotas(broker_factory: Callable[..., Broker],
                                                      ns: str) -> None:
    with amp_broker(broker_factory, "redis", ns) as amp:
        amp.create("one already")
        response = amp.http.put(f"/v1/namespaces/{ns}/config", json={
            "rules": [{"pattern": "cells/user/*", "approval": "required"}],
            "limits": {"max_keys": 1}})
        assert response.status_code == 200, response.text
        proposed = amp.post_cell({"type": "semantic", "content": {"text": "gated"},
                                  "identity": {"owner_id": "u-2", "owner_type": "user"}},
                                 agent="agent-2")
        assert proposed.status_code == 202, proposed.text
        refused = amp.http.post(props(ns, f"/{proposed.json()['id']}/approve"), json={})
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["details"]["limit"] == "max_keys"
        assert usage(amp.http, ns)["keys"] == 1
        assert amp.search_ids(agent="agent-2", query="gated") == []


def test_an_amp_cell_proposal_counts_toward_the_amp_quota(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    """A gated cell create is a proposal held to the AMP namespace's `max_bytes` like a MEMP
    one: over it, 429 and nothing proposed; within it, counted until it expires."""
    with amp_broker(broker_factory, "embedded", ns) as amp:
        amp.create("one already")
        cell = {"type": "semantic", "content": {"text": "gated " * 200},
                "identity": {"owner_id": "u-2", "owner_type": "user"}}
        for max_bytes, status in ((usage(amp.http, ns)["bytes"] + 500, 429),
                                  (usage(amp.http, ns)["bytes"] + 20_000, 202)):
            response = amp.http.put(f"/v1/namespaces/{ns}/config", json={
                "rules": [{"pattern": "cells/user/*", "approval": "required"}],
                "limits": {"max_bytes": max_bytes}})
            assert response.status_code == 200, response.text
            proposed = amp.post_cell(cell, agent="agent-2")
            assert proposed.status_code == status, proposed.text
            if status == 429:
                assert proposed.json()["error"]["details"]["limit"] == "max_bytes"
                assert usage(amp.http, ns)["proposals"] == 0
        assert usage(amp.http, ns)["proposals"] == 1
        assert usage(amp.http, ns)["proposal_bytes"] > len("gated " * 200) * 2


def _propose(url: str, token: str, ns: str, key: str) -> int:
    with httpx.Client(base_url=url, timeout=15,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        return client.put(mem(ns, key), json={"value": key}).status_code


def test_two_processes_share_the_proposal_budget(
        broker_processes: Callable[..., list[BrokerProcess]], ns: str) -> None:
    brokers = broker_processes(2, MEMP_MAX_PENDING_PROPOSALS="6")
    with httpx.Client(base_url=brokers[0].url, timeout=15,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        configure(admin, ns, writes_per_second=SLOW, write_burst=4)
        token, _ = create_key(admin, (ns, ["read", "write"]))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: _propose(brokers[i % 2].url, token, ns,
                                                     f"facts/r{i}"), range(12)))
        assert codes.count(202) == 4 and codes.count(429) == 8
        set_limits(admin, ns)  # no rate now: only the bound of 6 pending (4 there)
        configure(admin, ns)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: _propose(brokers[i % 2].url, token, ns,
                                                     f"facts/q{i}"), range(10)))
        assert codes.count(202) == 2 and codes.count(429) == 8
        assert len(pending(admin, ns)) == 6



def test_a_batch_of_proposals_crossing_the_rate(people: dict[str, httpx.Client],
                                                ns: str) -> None:
    """Each gated message of a batch takes its token: those past the burst get rate_limited
    in their own reply, the response the longest Retry-After, and only the others are
    proposed."""
    admin, writer = people["admin"], people["writer"]
    configure(admin, ns, writes_per_second=SLOW, write_burst=2)
    batch = [{"memp": "1.0", "type": "memory.put", "id": f"b-{i}", "namespace": ns,
              "key": f"facts/{i}", "value": i} for i in range(4)]
    response = writer.post("/v1/messages", json=batch)
    assert response.status_code == 200, response.text
    replies = response.json()
    assert [r.get("status") for r in replies[:2]] == ["pending_approval"] * 2
    assert [r["error"]["code"] for r in replies[2:]] == ["rate_limited"] * 2
    assert int(response.headers["retry-after"]) >= 1
    assert len(pending(admin, ns)) == 2
