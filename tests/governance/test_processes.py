"""Governance across two broker OS processes sharing one Redis: two reviewers approving one
proposal at once apply it exactly once, concurrent writers keep the audit chain whole, and
both processes' sweepers dropping closed proposals past their retention uncount each once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

import httpx
import redis

from broker.storage import layout
from tests.support.brokers import ADMIN_KEY, BrokerProcess
from tests.support.clients import run_all
from tests.support.waiting import wait_until


def _client(broker: BrokerProcess, token: str = ADMIN_KEY) -> httpx.Client:
    return httpx.Client(base_url=broker.url, headers={"Authorization": f"Bearer {token}"},
                        timeout=30)


def _approve(client: httpx.Client, path: str) -> int:
    return client.post(path).status_code


def test_two_reviewers_approving_at_once_apply_once(
        broker_process: Callable[..., BrokerProcess], ns: str) -> None:
    brokers = [broker_process(), broker_process()]
    admin = _client(brokers[0])
    tokens = []
    for _ in range(2):
        made = admin.post("/v1/keys", json={"grants": [{"namespace": ns,
                                                         "permissions": ["read", "review"]}]})
        tokens.append(made.json()["api_key"])
    reviewers = [_client(b, t) for b, t in zip(brokers, tokens, strict=True)]
    for round_ in range(5):
        key = f"k{round_}"
        proposal = admin.put(f"/v1/namespaces/{ns}/memory/{key}",
                             json={"value": round_, "approval_required": True}).json()
        path = f"/v1/namespaces/{ns}/proposals/{proposal['id']}/approve"
        statuses = run_all([partial(_approve, c, path) for c in reviewers])
        assert Counter(statuses) == Counter({200: 1, 409: 1})
        entry = admin.get(f"/v1/namespaces/{ns}/memory/{key}").json()
        assert entry["version"] == 1 and entry["value"] == round_
        history = admin.get(f"/v1/namespaces/{ns}/history/{key}").json()["versions"]
        assert len(history) == 1
    approvals = admin.get(f"/v1/namespaces/{ns}/audit", params={"action": "approve"}).json()
    assert len(approvals["records"]) == 5
    for client in (admin, *reviewers):
        client.close()


def test_concurrent_writers_keep_one_audit_chain(
        broker_process: Callable[..., BrokerProcess], ns: str) -> None:
    brokers = [broker_process(), broker_process()]
    clients = [_client(b) for b in brokers]

    def writer(i: int) -> None:
        client = clients[i % 2]
        for j in range(25):
            assert client.put(f"/v1/namespaces/{ns}/memory/w{i}/{j % 3}",
                              json={"value": j}).status_code in (200, 201)

    run_all([partial(writer, i) for i in range(6)])
    verdict = clients[1].get(f"/v1/namespaces/{ns}/audit/verify").json()
    assert verdict["ok"] is True and verdict["records"] == 150
    seqs = [r["seq"] for r in clients[0].get(f"/v1/namespaces/{ns}/audit",
                                             params={"limit": 1000}).json()["records"]]
    assert seqs == list(range(150, 0, -1))
    for client in clients:
        client.close()


def test_two_sweepers_drop_each_closed_proposal_once(
        broker_process: Callable[..., BrokerProcess], redis_url: str, ns: str) -> None:
    """Both processes sweep the same namespace: every closed proposal is dropped after the
    retention, its bytes uncounted exactly once (the count ends at 0, never below), while
    pending ones stay, and the audit chain still verifies."""
    settings = {"MEMP_PROPOSAL_RETENTION_SECONDS": "1", "MEMP_SWEEP_INTERVAL_SECONDS": "0.1"}
    brokers = [broker_process(**settings), broker_process(**settings)]
    clients = [_client(b) for b in brokers]
    assert clients[0].put(f"/v1/namespaces/{ns}/config",
                          json={"allow_self_approval": True}).status_code == 200
    made = []
    for i in range(30):
        proposal = clients[i % 2].put(f"/v1/namespaces/{ns}/memory/k{i}", json={
            "value": {"n": i, "pad": "p" * 500}, "approval_required": True})
        assert proposal.status_code == 202, proposal.text
        made.append(proposal.json()["id"])
    for i, proposal_id in enumerate(made[:25]):
        decision = "approve" if i % 5 == 0 else "reject"
        path = f"/v1/namespaces/{ns}/proposals/{proposal_id}/{decision}"
        assert clients[i % 2].post(path, json={}).status_code == 200
    store = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: store.zcard(layout.closed_proposals(ns)) == 0,
                   "both sweepers to drop every closed proposal", timeout=60, step=0.2)
        listed = clients[0].get(f"/v1/namespaces/{ns}/proposals").json()["proposals"]
        assert sorted(p["id"] for p in listed) == sorted(made[25:])
        kept = sum(int(store.hget(layout.proposal(ns, pid), "size") or 0) for pid in made[25:])
        assert int(store.hget(layout.usage(ns), "pbytes") or 0) == kept > 0
        for pid in made[:25]:
            assert not store.exists(layout.proposal(ns, pid))
            gone = clients[1].get(f"/v1/namespaces/{ns}/proposals/{pid}")
            assert gone.status_code == 404
        store.delete(layout.usage(ns))  # a recount finds the same
        assert clients[1].get(f"/v1/namespaces/{ns}/usage").json()["usage"][
            "proposal_bytes"] == kept
    finally:
        store.close()
    assert clients[0].get(f"/v1/namespaces/{ns}/audit/verify").json()["ok"] is True
    decisions = clients[0].get(f"/v1/namespaces/{ns}/audit", params={"limit": 200}).json()
    assert Counter(r["action"] for r in decisions["records"])["reject"] == 20
    for client in clients:
        client.close()
