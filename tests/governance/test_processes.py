"""Governance across two broker OS processes sharing one Redis: two reviewers approving one
proposal at once apply it exactly once, and concurrent writers keep the audit chain whole."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

import httpx

from tests.support.brokers import ADMIN_KEY, BrokerProcess
from tests.support.clients import run_all


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
