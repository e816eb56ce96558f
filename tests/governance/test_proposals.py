"""Approval-gated writes over real HTTP on both stores: proposals invisible until approved,
approval with compare-and-set, rebasing, rejection, expiry, self-approval, permissions, bad
input, protocol messages, and who gets a proposal's events."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from broker.core.grammar import compile_pattern
from broker.services.visibility import Viewer
from broker.storage import layout
from broker.streaming.changes import Change
from broker.streaming.hub import Subscriber
from tests.support.brokers import Broker
from tests.support.clients import assert_error, create_key
from tests.support.streams import Stream

pytestmark = pytest.mark.usefixtures("broker")


def mem(ns: str, key: str) -> str:
    return f"/v1/namespaces/{ns}/memory/{key}"


def props(ns: str, suffix: str = "") -> str:
    return f"/v1/namespaces/{ns}/proposals{suffix}"


def gate(admin: httpx.Client, ns: str, pattern: str = "facts/*", **extra: Any) -> None:
    response = admin.put(f"/v1/namespaces/{ns}/config", json={
        "rules": [{"pattern": pattern, "approval": "required"}], **extra})
    assert response.status_code == 200, response.text


@pytest.fixture
def people(admin: httpx.Client, broker: Broker, ns: str) -> Iterator[dict[str, httpx.Client]]:
    """A writer (read, write, subscribe) and two reviewers, each an API key of its own."""
    made = {}
    for name, grants in (("writer", ["read", "write", "subscribe"]),
                         ("reviewer", ["read", "review"]), ("second", ["read", "review"])):
        token, _ = create_key(admin, (ns, grants))
        made[name] = broker.client(token)
    yield made
    for client in made.values():
        client.close()


def propose(client: httpx.Client, ns: str, key: str, value: Any, **body: Any
            ) -> dict[str, Any]:
    response = client.put(mem(ns, key), json={"value": value, **body})
    assert response.status_code == 202, response.text
    proposal: dict[str, Any] = response.json()
    return proposal


def test_a_gated_write_is_invisible_until_approved(admin: httpx.Client, ns: str,
                                                   people: dict[str, httpx.Client]) -> None:
    gate(admin, ns)
    writer, reviewer = people["writer"], people["reviewer"]
    proposal = propose(writer, ns, "facts/sky", {"colour": "blue"})
    assert proposal["status"] == "pending" and proposal["base_version"] == 0
    assert proposal["operation"] == "put" and proposal["value"] == {"colour": "blue"}
    assert proposal["diff"] == [{"op": "add", "path": "", "value": {"colour": "blue"}}]
    assert proposal["proposed_by"] and proposal["created_at"] > 0
    assert set(proposal) >= {"id", "status", "namespace", "key", "value", "base_version",
                             "proposed_by", "created_at", "diff"}
    for client in (writer, reviewer, admin):
        assert client.get(mem(ns, "facts/sky")).status_code == 404
        assert client.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}
                          ).json()["entries"] == []
        assert client.get(f"/v1/namespaces/{ns}/history/facts/sky").json()["versions"] == []
    assert writer.put(mem(ns, "other"), json={"value": 1}).status_code == 201  # not gated
    approved = reviewer.post(props(ns, f"/{proposal['id']}/approve"))
    assert approved.status_code == 200, approved.text
    body = approved.json()
    assert body["proposal"]["status"] == "approved" and body["proposal"]["version"] == 1
    entry = writer.get(mem(ns, "facts/sky")).json()
    assert entry["value"] == {"colour": "blue"} and entry["version"] == 1
    assert entry["proposal_id"] == proposal["id"] and entry["approved_by"]
    assert entry["agent_id"] == proposal["proposed_by"]
    actions = [r["action"] for r in admin.get(f"/v1/namespaces/{ns}/audit",
                                              params={"key": "facts/sky"}).json()["records"]]
    assert actions == ["approve", "put", "propose"]
    assert admin.get(f"/v1/namespaces/{ns}/audit/verify").json()["ok"] is True


def test_per_write_request_and_deletes_and_merges(admin: httpx.Client, ns: str,
                                                  people: dict[str, httpx.Client]) -> None:
    writer, reviewer = people["writer"], people["reviewer"]
    assert writer.put(mem(ns, "doc"), json={"value": {"a": 1, "b": 2}}).status_code == 201
    proposal = propose(writer, ns, "doc", {"a": 1, "c": 3}, approval_required=True)
    assert proposal["base_version"] == 1
    assert sorted(proposal["diff"], key=lambda op: op["path"]) == [
        {"op": "remove", "path": "/b"}, {"op": "add", "path": "/c", "value": 3}]
    assert writer.get(mem(ns, "doc")).json()["value"] == {"a": 1, "b": 2}
    removal = writer.delete(mem(ns, "doc"), params={"approval_required": "true"})
    assert removal.status_code == 202 and removal.json()["operation"] == "delete"
    assert removal.json()["diff"] == [{"op": "remove", "path": ""}]
    assert reviewer.post(props(ns, f"/{removal.json()['id']}/approve")).status_code == 200
    assert writer.get(mem(ns, "doc")).status_code == 404
    gate(admin, ns, "doc", strategy="merge")
    writer_merge = propose(writer, ns, "doc", {"x": 1})
    assert writer_merge["operation"] == "merge"


def test_merge_proposals_show_the_merged_value(admin: httpx.Client, ns: str,
                                               people: dict[str, httpx.Client]) -> None:
    admin.put(f"/v1/namespaces/{ns}/config", json={
        "strategy": "merge", "rules": [{"pattern": "m/*", "approval": "required"}]})
    admin.put(f"/v1/namespaces/{ns}/config", json={"strategy": "merge"})
    writer, reviewer = people["writer"], people["reviewer"]
    writer.put(mem(ns, "m/1"), json={"value": {"a": 1}})
    gate(admin, ns, "m/*", strategy="merge")
    proposal = propose(writer, ns, "m/1", {"b": 2})
    assert proposal["operation"] == "merge" and proposal["value"] == {"a": 1, "b": 2}
    assert proposal["diff"] == [{"op": "add", "path": "/b", "value": 2}]
    assert reviewer.post(props(ns, f"/{proposal['id']}/approve")).status_code == 200
    assert writer.get(mem(ns, "m/1")).json()["value"] == {"a": 1, "b": 2}


def test_approval_after_the_key_moved_needs_a_rebase(admin: httpx.Client, ns: str,
                                                     people: dict[str, httpx.Client]) -> None:
    writer, reviewer = people["writer"], people["reviewer"]
    writer.put(mem(ns, "k"), json={"value": {"v": 1}})
    proposal = propose(writer, ns, "k", {"v": 2}, approval_required=True)
    writer.put(mem(ns, "k"), json={"value": {"v": 3}})
    moved = reviewer.post(props(ns, f"/{proposal['id']}/approve"))
    error = assert_error(moved, 409, "write_conflict")
    assert error["details"]["current_version"] == 2
    assert error["details"]["current"]["value"] == {"v": 3}
    assert error["details"]["diff"] == [{"op": "replace", "path": "/v", "value": 2}]
    assert writer.get(mem(ns, "k")).json()["value"] == {"v": 3}
    stale = reviewer.post(props(ns, f"/{proposal['id']}/approve"), json={"base_version": 1})
    assert_error(stale, 409, "write_conflict")
    rebased = reviewer.post(props(ns, f"/{proposal['id']}/approve"), json={"base_version": 2})
    assert rebased.status_code == 200, rebased.text
    assert rebased.json()["proposal"]["base_version"] == 2
    entry = writer.get(mem(ns, "k")).json()
    assert entry["value"] == {"v": 2} and entry["version"] == 3


def test_self_approval_is_refused_unless_allowed(admin: httpx.Client, broker: Broker, ns: str
                                                 ) -> None:
    token, _ = create_key(admin, (ns, ["read", "write", "review"]))
    gate(admin, ns)
    with broker.client(token) as both:
        proposal = propose(both, ns, "facts/a", 1)
        assert_error(both.post(props(ns, f"/{proposal['id']}/approve")), 403, "forbidden")
        assert both.get(mem(ns, "facts/a")).status_code == 404
        gate(admin, ns, allow_self_approval=True)
        admin.post("/v1/messages", json={"memp": "1.0", "type": "memory.get", "namespace": ns,
                                         "key": "x"})
        _wait_config(both, ns, proposal["id"])
        assert both.get(mem(ns, "facts/a")).json()["value"] == 1


def _wait_config(client: httpx.Client, ns: str, proposal_id: str) -> None:
    """Approve once the namespace cache has the new configuration (5 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        response = client.post(props(ns, f"/{proposal_id}/approve"))
        if response.status_code == 200 or time.monotonic() > deadline:
            assert response.status_code == 200, response.text
            return
        time.sleep(0.2)


def test_rejection_closes_for_good(admin: httpx.Client, ns: str,
                                   people: dict[str, httpx.Client]) -> None:
    gate(admin, ns)
    writer, reviewer = people["writer"], people["reviewer"]
    proposal = propose(writer, ns, "facts/x", 1)
    rejected = reviewer.post(props(ns, f"/{proposal['id']}/reject"), json={"reason": "wrong"})
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    assert rejected.json()["reason"] == "wrong"
    for action in ("approve", "reject"):
        assert_error(reviewer.post(props(ns, f"/{proposal['id']}/{action}")), 409,
                     "write_conflict")
    assert writer.get(mem(ns, "facts/x")).status_code == 404
    listed = reviewer.get(props(ns), params={"status": "rejected"}).json()["proposals"]
    assert [p["id"] for p in listed] == [proposal["id"]]
    assert reviewer.get(props(ns), params={"status": "pending"}).json()["proposals"] == []


def test_listing_paging_and_who_sees_what(admin: httpx.Client, broker: Broker, ns: str,
                                          people: dict[str, httpx.Client]) -> None:
    gate(admin, ns)
    writer, reviewer = people["writer"], people["reviewer"]
    made = [propose(writer, ns, f"facts/{i}", i)["id"] for i in range(3)]
    first = reviewer.get(props(ns), params={"limit": 2}).json()
    rest = reviewer.get(props(ns), params={"cursor": first["next_cursor"]}).json()
    assert [p["id"] for p in first["proposals"] + rest["proposals"]] == made[::-1]
    assert [p["id"] for p in reviewer.get(props(ns), params={"key": "facts/1"}).json()[
        "proposals"]] == [made[1]]
    assert len(writer.get(props(ns)).json()["proposals"]) == 3  # its own
    token, _ = create_key(admin, (ns, ["read", "write"]))
    with broker.client(token) as stranger:
        assert stranger.get(props(ns)).json()["proposals"] == []
        assert_error(stranger.get(props(ns, f"/{made[0]}")), 404, "not_found")
        assert_error(stranger.post(props(ns, f"/{made[0]}/approve")), 403, "forbidden")
    assert reviewer.get(props(ns, f"/{made[0]}")).json()["key"] == "facts/0"


def test_unauthorised_and_hostile_input(admin: httpx.Client, broker: Broker, ns: str,
                                        people: dict[str, httpx.Client]) -> None:
    gate(admin, ns)
    proposal = propose(people["writer"], ns, "facts/z", 1)
    pid = proposal["id"]
    token, _ = create_key(admin, (f"{ns}-other", ["read", "write", "review"]))
    with broker.client(token) as other:
        assert_error(other.post(props(ns, f"/{pid}/approve")), 403, "forbidden")
        assert_error(other.get(props(ns)), 403, "forbidden")
    token, key_id = create_key(admin, (ns, ["review"]))
    admin.delete(f"/v1/keys/{key_id}")
    with broker.client(token) as revoked:
        assert_error(revoked.post(props(ns, f"/{pid}/approve")), 401, "unauthorized")
    reviewer = people["reviewer"]
    assert_error(reviewer.post(props(ns, "/prop_nope/approve")), 404, "not_found")
    assert_error(reviewer.get(props(ns, "/" + "x" * 5000)), 404, "not_found")
    assert_error(reviewer.post(props(ns, f"/{pid}/approve"), content=b"{nope",
                               headers={"content-type": "application/json"}),
                 400, "invalid_json")
    assert_error(reviewer.post(props(ns, f"/{pid}/approve"), json={"base_version": "x"}),
                 400, "invalid_request")
    assert_error(reviewer.post(props(ns, f"/{pid}/reject"), json={"reason": "r" * 3000}),
                 400, "invalid_request")
    assert_error(reviewer.post(props(ns, f"/{pid}/reject"), json={"reason": "r" * 20_000}),
                 413, "payload_too_large")
    assert_error(reviewer.get(props(ns), params={"status": "maybe"}), 400, "invalid_request")
    assert_error(reviewer.get(props(ns), params={"cursor": "zz"}), 400, "invalid_request")
    assert_error(admin.put(f"/v1/namespaces/{ns}/config", json={
        "rules": [{"pattern": "a/*", "approval": "always"}]}), 400, "invalid_request")
    assert_error(admin.put(f"/v1/namespaces/{ns}/config", json={"rules": [{"pattern": "a"}]}),
                 400, "invalid_request")
    assert reviewer.get(props(ns, f"/{pid}")).json()["status"] == "pending"
    assert people["writer"].get(mem(ns, "facts/z")).status_code == 404


def test_idempotency_key_replays_the_proposal(admin: httpx.Client, ns: str,
                                              people: dict[str, httpx.Client]) -> None:
    gate(admin, ns)
    writer = people["writer"]
    headers = {"Idempotency-Key": "once-1"}
    first = writer.put(mem(ns, "facts/i"), json={"value": 1}, headers=headers)
    again = writer.put(mem(ns, "facts/i"), json={"value": 1}, headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    other = writer.put(mem(ns, "facts/i"), json={"value": 2}, headers=headers)
    assert_error(other, 422, "idempotency_key_reused")
    assert len(people["reviewer"].get(props(ns)).json()["proposals"]) == 1


def test_a_retried_message_id_gets_its_first_reply_whatever_the_gate_says_now(
        admin: httpx.Client, ns: str, people: dict[str, httpx.Client]) -> None:
    """A message id answered with a proposal is answered with it again after the gate was
    lifted (not with a made-up 412), one answered with a write again after the gate was
    raised, and the per-write flag is part of the request the id is bound to."""
    writer, reviewer = people["writer"], people["reviewer"]
    gate(admin, ns)
    proposed = writer.put(mem(ns, "facts/a"), json={"value": 1},
                          headers={"Idempotency-Key": "gated-1"})
    assert proposed.status_code == 202, proposed.text
    applied = writer.put(mem(ns, "plain/b"), json={"value": 2},
                         headers={"Idempotency-Key": "plain-1"})
    assert applied.status_code == 201, applied.text
    flagged = writer.put(mem(ns, "plain/c"), json={"value": 3, "approval_required": True},
                         headers={"Idempotency-Key": "flag-1"})
    assert flagged.status_code == 202, flagged.text
    for proposal in (proposed.json(), flagged.json()):
        assert reviewer.post(props(ns, f"/{proposal['id']}/reject"),
                             json={"reason": "no"}).status_code == 200
    gate(admin, ns, pattern="plain/*")  # facts/* is no longer gated, plain/* is

    again = writer.put(mem(ns, "facts/a"), json={"value": 1},
                       headers={"Idempotency-Key": "gated-1"})
    assert again.status_code == 202, again.text
    assert again.json()["id"] == proposed.json()["id"]
    assert again.json()["status"] == "rejected"
    assert writer.get(mem(ns, "facts/a")).status_code == 404
    replayed = writer.put(mem(ns, "plain/b"), json={"value": 2},
                          headers={"Idempotency-Key": "plain-1"})
    assert replayed.status_code == 201, replayed.text
    assert replayed.json()["version"] == applied.json()["version"] == 1
    assert replayed.json()["value"] == 2
    admin.put(f"/v1/namespaces/{ns}/config", json={})
    unflagged = writer.put(mem(ns, "plain/c"), json={"value": 3},
                           headers={"Idempotency-Key": "flag-1"})
    assert_error(unflagged, 422, "idempotency_key_reused")
    assert writer.get(mem(ns, "plain/c")).status_code == 404
    again = writer.put(mem(ns, "plain/c"), json={"value": 3, "approval_required": True},
                       headers={"Idempotency-Key": "flag-1"})
    assert again.status_code == 202 and again.json()["id"] == flagged.json()["id"]
    message = {"memp": "1.0", "type": "memory.delete", "namespace": ns, "key": "plain/b",
               "id": "del-1", "approval_required": True}
    first = writer.post("/v1/messages", json=message).json()
    assert first["status"] == "pending_approval", first
    replay = writer.post("/v1/messages", json={**message, "approval_required": False}).json()
    assert replay["type"] == "error" and replay["error"]["code"] == "idempotency_key_reused"
    assert writer.post("/v1/messages", json=message).json()["proposal"]["id"] \
        == first["proposal"]["id"]
    assert writer.get(mem(ns, "plain/b")).json()["version"] == 1


def test_protocol_messages(admin: httpx.Client, ns: str,
                           people: dict[str, httpx.Client]) -> None:
    gate(admin, ns)

    def send(client: httpx.Client, **message: Any) -> dict[str, Any]:
        response = client.post("/v1/messages", json={"memp": "1.0", "namespace": ns,
                                                     **message})
        reply: dict[str, Any] = response.json()
        return reply

    put = send(people["writer"], type="memory.put", key="facts/m", value=5, id="m-1")
    assert put["type"] == "ack" and put["status"] == "pending_approval"
    pid = put["proposal"]["id"]
    listed = send(people["reviewer"], type="proposal.list", status="pending")
    assert [p["id"] for p in listed["proposals"]] == [pid]
    assert send(people["reviewer"], type="proposal.get", proposal=pid)["proposal"]["key"] \
        == "facts/m"
    approved = send(people["reviewer"], type="proposal.approve", proposal=pid)
    assert approved["type"] == "ack" and approved["entry"]["value"] == 5
    second = send(people["writer"], type="memory.put", key="facts/n", value=6)["proposal"]
    rejected = send(people["reviewer"], type="proposal.reject", proposal=second["id"],
                    reason="no")
    assert rejected["proposal"]["status"] == "rejected"
    refused = send(people["writer"], type="proposal.approve", proposal=second["id"])
    assert refused["type"] == "error" and refused["error"]["code"] == "forbidden"


def test_expired_proposals_close(broker_factory: Callable[..., Broker], ns: str) -> None:
    handle = broker_factory("embedded", proposal_ttl_seconds=1)
    with handle.client() as admin:
        proposal = propose(admin, ns, "k", 1, approval_required=True)
        deadline = time.monotonic() + 15
        while admin.get(props(ns, f"/{proposal['id']}")).json()["status"] == "pending":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert_error(admin.post(props(ns, f"/{proposal['id']}/approve")), 409,
                     "write_conflict")
        while "expire" not in [r["action"] for r in admin.get(
                f"/v1/namespaces/{ns}/audit").json()["records"]]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert admin.get(mem(ns, "k")).status_code == 404


def _change(kind: str, proposer: str | None) -> Change:
    return Change("ns", "1-0", kind, "k", 0, b"{}", proposer=proposer)


@pytest.mark.parametrize("writer,reviews,proposer,wanted", [
    pytest.param("alice", frozenset(), "alice", True, id="proposer"),
    pytest.param("bob", frozenset({"ns"}), "alice", True, id="reviewer"),
    pytest.param("bob", frozenset(), "alice", False, id="neither"),
    pytest.param("bob", frozenset({"other"}), "alice", False, id="reviewer-elsewhere"),
    pytest.param("bob", frozenset(), None, True, id="an-entry-change"),
])
def test_proposal_events_reach_reviewers_and_the_proposer(
        writer: str, reviews: frozenset[str], proposer: str | None, wanted: bool) -> None:
    subscriber = Subscriber({"ns": [compile_pattern("*")]}, 10, Viewer(writer), writer,
                            reviews)
    assert subscriber.wants(_change("proposal", proposer)) is wanted


def test_proposal_events_over_real_streams(admin: httpx.Client, broker: Broker, ns: str,
                                           subscribe: Callable[..., Stream]
                                           ) -> None:
    """Reviewers and the proposer get `proposal` and `approved`; another subscriber gets only
    the write the approval made."""
    gate(admin, ns)
    tokens = {}
    for name, grants in (("proposer", ["read", "write", "subscribe"]),
                         ("reviewer", ["read", "subscribe", "review"]),
                         ("bystander", ["read", "subscribe"])):
        tokens[name], _ = create_key(admin, (ns, grants))
    streams = {name: subscribe(broker.url, ns, "*", token=token).wait_open()
               for name, token in tokens.items()}
    with broker.client(tokens["proposer"]) as proposer:
        proposal = propose(proposer, ns, "facts/e", {"v": 1})
    with broker.client(tokens["reviewer"]) as reviewer:
        assert reviewer.post(props(ns, f"/{proposal['id']}/approve")).status_code == 200
    for stream in streams.values():
        stream.wait_key("facts/e", 1)
    for name in ("proposer", "reviewer"):
        approved = streams[name].wait_event(lambda e: e.event == "approved", "approved")
        assert approved.data["id"] == proposal["id"] and approved.data["type"] == "approved"
        kinds = [e.event for e in streams[name].events]
        assert kinds.index("proposal") < kinds.index("put") < kinds.index("approved")
        assert streams[name].events[kinds.index("proposal")].data["value"] == {"v": 1}
    assert [e.event for e in streams["bystander"].events] == ["put"]


def test_approval_checks_the_schemas_of_the_day(admin: httpx.Client, ns: str,
                                                people: dict[str, httpx.Client]) -> None:
    gate(admin, ns)
    writer, reviewer = people["writer"], people["reviewer"]
    first = propose(writer, ns, "facts/s", {"n": "not a number"})
    second = propose(writer, ns, "facts/t", {"n": "not a number"})
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert admin.put(f"/v1/namespaces/{ns}/schemas/n", json={
        "pattern": "facts/s", "schema": schema, "enforce": True}).status_code == 201
    assert admin.put(f"/v1/namespaces/{ns}/schemas/t", json={
        "pattern": "facts/t", "schema": schema}).status_code == 201
    deadline = time.monotonic() + 10
    while True:  # each process reloads a namespace's schemas when it hears of the change
        refused = reviewer.post(props(ns, f"/{first['id']}/approve"))
        if refused.status_code == 422 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert_error(refused, 422, "schema_violation")
    assert reviewer.get(props(ns, f"/{first['id']}")).json()["status"] == "pending"
    flagged = reviewer.post(props(ns, f"/{second['id']}/approve"))
    assert flagged.status_code == 200 and flagged.json()["entry"]["schema_violation"] is True


def test_a_pending_write_is_not_in_a_snapshot(admin: httpx.Client, broker: Broker, ns: str,
                                              subscribe: Callable[..., Stream]
                                              ) -> None:
    admin.put(mem(ns, "facts/kept"), json={"value": 1})
    gate(admin, ns)
    propose(admin, ns, "facts/kept", 2)
    propose(admin, ns, "facts/new", 3)
    stream = subscribe(broker.url, ns, "*", snapshot=True).wait_open()
    stream.wait_event(lambda e: e.event == "snapshot-end", "the snapshot's end")
    shown = [(e.data["key"], e.data["value"]) for e in stream.events if e.event == "snapshot"]
    assert shown == [("facts/kept", 1)]


def test_a_corrupt_proposal_hides_no_other_and_stops_no_expiry(
        broker_factory: Callable[..., Broker], redis_url: str, ns: str) -> None:
    handle = broker_factory("redis", proposal_ttl_seconds=1)
    with handle.client() as admin:
        broken = propose(admin, ns, "a", 1, approval_required=True)
        kept = propose(admin, ns, "b", 2, approval_required=True)
        data = redis.Redis.from_url(redis_url)
        try:
            data.hset(layout.proposal(ns, broken["id"]), "doc", b"{not json")
        finally:
            data.close()
        listed = admin.get(props(ns))
        assert listed.status_code == 200, listed.text
        assert [p["id"] for p in listed.json()["proposals"]] == [kept["id"]]
        failed = admin.get(props(ns, f"/{broken['id']}"))
        assert failed.status_code == 500 and failed.json()["error"]["code"] == "corrupt_record"
        deadline = time.monotonic() + 15
        while "expire" not in [r["action"] for r in admin.get(
                f"/v1/namespaces/{ns}/audit").json()["records"]]:
            assert time.monotonic() < deadline, "the sweeper stopped at the corrupt proposal"
            time.sleep(0.1)
        assert admin.get(props(ns, f"/{kept['id']}")).json()["status"] == "expired"
