"""Fair share (broker/services/limits.py, docs/limits.md): namespace limits, agent default rates and
stream caps, on both stores and across two broker processes. Rates here are tiny (one token
per 1,000 s) so a bucket never refills during a test: every outcome is exact, no timing."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from broker.storage import layout
from tests.support.brokers import ADMIN_KEY, BACKENDS, Broker, BrokerProcess, data_client
from tests.support.limits import (
    SLOW,
    agent_key,
    assert_rate_limited,
    mem,
    open_stream,
    set_limits,
    usage,
)


def new_key(admin: httpx.Client, ns: str, permissions: list[str]) -> str:
    response = admin.post("/v1/keys", json={"name": "limits test",
                                            "grants": [{"namespace": ns,
                                                        "permissions": permissions}]})
    assert response.status_code == 201, response.text
    return str(response.json()["api_key"])


@pytest.fixture
def agent(broker: Broker, admin: httpx.Client, ns: str) -> Iterator[httpx.Client]:
    with broker.client(agent_key(admin, ns)) as client:
        yield client


# ---- configuration ----


def test_limits_are_recorded_in_the_config_and_the_usage(admin: httpx.Client, ns: str) -> None:
    stored = set_limits(admin, ns, writes_per_second=50, write_burst=100, reads_per_second=2.5,
                        max_keys=10, max_bytes=4096, max_streams=3)
    assert stored["limits"] == {"writes_per_second": 50.0, "write_burst": 100,
                                "reads_per_second": 2.5, "max_keys": 10, "max_bytes": 4096,
                                "max_streams": 3}
    assert admin.get(f"/v1/namespaces/{ns}/config").json()["limits"] == stored["limits"]
    report = admin.get(f"/v1/namespaces/{ns}/usage").json()
    assert report["namespace"] == ns
    assert report["limits"] == stored["limits"]
    assert report["usage"] == {"keys": 0, "bytes": 0, "streams": 0, "proposals": 0,
                               "proposal_bytes": 0}
    assert set(report["agent_defaults"]) == {"writes_per_second", "write_burst",
                                             "reads_per_second", "read_burst",
                                             "max_streams_per_token", "max_pending_proposals"}


@pytest.mark.parametrize("limits", [
    pytest.param({"writes_per_second": 0}, id="zero-rate"),
    pytest.param({"writes_per_second": -5}, id="negative-rate"),
    pytest.param({"writes_per_second": 1e-300}, id="vanishing-rate"),
    pytest.param({"reads_per_second": 1e12}, id="huge-rate"),
    pytest.param(b'{"writes_per_second": 1e400}', id="infinite-rate"),
    pytest.param(b'{"writes_per_second": NaN}', id="nan-rate"),
    pytest.param({"writes_per_second": "10"}, id="string-rate"),
    pytest.param({"writes_per_second": 10, "write_burst": 0}, id="zero-burst"),
    pytest.param({"writes_per_second": 10, "write_burst": 2.5}, id="fractional-burst"),
    pytest.param({"write_burst": 10}, id="burst-without-rate"),
    pytest.param({"read_burst": 10}, id="read-burst-without-rate"),
    pytest.param({"max_keys": -1}, id="negative-quota"),
    pytest.param({"max_bytes": 2**63}, id="quota-beyond-2^53"),
    pytest.param({"max_streams": True}, id="boolean-quota"),
    pytest.param({"max_keys": None, "max_cpu": 5}, id="unknown-field"),
    pytest.param([1, 2], id="not-an-object"),
])
def test_absurd_limits_are_refused_and_change_nothing(admin: httpx.Client, ns: str,
                                                      limits: Any) -> None:
    before = set_limits(admin, ns, max_keys=5)
    if isinstance(limits, bytes):
        response = admin.put(f"/v1/namespaces/{ns}/config", content=b'{"limits": ' + limits
                             + b"}", headers={"content-type": "application/json"})
    else:
        response = admin.put(f"/v1/namespaces/{ns}/config", json={"limits": limits})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in ("invalid_request", "invalid_json")
    assert admin.get(f"/v1/namespaces/{ns}/config").json() == before


def test_only_the_namespace_admin_sets_or_reads_limits(
        broker: Broker, admin: httpx.Client, ns: str) -> None:
    before = set_limits(admin, ns, max_keys=5)
    other = f"{ns}-other"
    writer = new_key(admin, ns, ["read", "write", "subscribe"])
    tenant = new_key(admin, other, ["admin"])  # admin of another namespace
    for token in (writer, tenant, agent_key(admin, ns)):
        with broker.client(token) as client:
            put = client.put(f"/v1/namespaces/{ns}/config", json={"limits": {"max_keys": 10**6}})
            assert put.status_code == 403, put.text
            assert client.get(f"/v1/namespaces/{ns}/usage").status_code == 403
    with broker.client("memp_sk_live_unknown") as client:
        assert client.get(f"/v1/namespaces/{ns}/usage").status_code == 401
    revoked_id = admin.post("/v1/keys", json={"name": "x", "grants": [
        {"namespace": ns, "permissions": ["admin"]}]}).json()
    assert admin.delete(f"/v1/keys/{revoked_id['key']['id']}").status_code == 204
    with broker.client(revoked_id["api_key"]) as client:
        assert client.get(f"/v1/namespaces/{ns}/usage").status_code == 401
    assert admin.get(f"/v1/namespaces/{ns}/config").json() == before
    assert admin.get("/v1/namespaces/BAD/usage").status_code == 400


# ---- rates ----


def test_writes_over_the_rate_get_429_and_write_nothing(
        broker: Broker, admin: httpx.Client, agent: httpx.Client, ns: str) -> None:
    set_limits(admin, ns, writes_per_second=SLOW, write_burst=3)
    for i in range(3):
        assert agent.put(mem(ns, f"k{i}"), json={"value": i}).status_code == 201
    refused = agent.put(mem(ns, "k3"), json={"value": 3})
    assert_rate_limited(refused, "namespace", "writes_per_second")
    assert refused.json()["error"]["details"]["burst"] == 3
    assert agent.delete(mem(ns, "k0")).status_code == 429  # deletes are writes
    assert admin.get(mem(ns, "k3")).status_code == 404
    assert admin.get(mem(ns, "k0")).status_code == 200
    # the broker's admin key is exempt from rates (docs/limits.md, "Who is exempt")
    assert admin.put(mem(ns, "k4"), json={"value": 4}).status_code == 201
    metrics = admin.get("/metrics").text
    assert 'memp_rate_limited_total{limit="writes_per_second",scope="namespace"}' in metrics


def test_a_batch_crossing_the_rate_gets_the_error_in_each_message_over(
        admin: httpx.Client, agent: httpx.Client, ns: str) -> None:
    set_limits(admin, ns, writes_per_second=SLOW, write_burst=2)
    batch = [{"memp": "1.0", "type": "memory.put", "namespace": ns, "key": f"b{i}",
              "value": i, "id": f"m{i}"} for i in range(4)]
    response = agent.post("/v1/messages", json=batch)
    assert response.status_code == 200, response.text
    replies = response.json()
    assert [r["type"] for r in replies] == ["ack", "ack", "error", "error"]
    for reply in replies[2:]:
        assert reply["error"]["code"] == "rate_limited"
        assert reply["error"]["details"]["retry_after"] >= 1
    assert int(response.headers["retry-after"]) >= 1
    keys = [e["key"] for e in admin.get(f"/v1/namespaces/{ns}/memory").json()["entries"]]
    assert keys == ["b0", "b1"]
    single = agent.post("/v1/messages", json=batch[3])
    assert_rate_limited(single, "namespace", "writes_per_second")


def test_a_batch_crossing_a_quota(admin: httpx.Client, agent: httpx.Client, ns: str) -> None:
    set_limits(admin, ns, max_keys=2)
    batch = [{"memp": "1.0", "type": "memory.put", "namespace": ns, "key": key, "value": 1}
             for key in ("a", "b", "c", "a", "d")]
    replies = agent.post("/v1/messages", json=batch).json()
    assert [r["type"] for r in replies] == ["ack", "ack", "error", "ack", "error"]
    assert replies[2]["error"]["code"] == "quota_exceeded"
    assert replies[2]["error"]["details"]["used"] == 2
    assert usage(admin, ns)["keys"] == 2


def test_a_raised_rate_admits_at_once(admin: httpx.Client, agent: httpx.Client,
                                      ns: str) -> None:
    """A process remembers a refusing bucket until it reopens; a changed limit is a new one."""
    set_limits(admin, ns, writes_per_second=SLOW, write_burst=1)
    assert agent.put(mem(ns, "a"), json={"value": 1}).status_code == 201
    for _ in range(3):
        assert_rate_limited(agent.put(mem(ns, "b"), json={"value": 2}), "namespace",
                            "writes_per_second")
    set_limits(admin, ns, writes_per_second=1000, write_burst=1000)
    assert agent.put(mem(ns, "b"), json={"value": 2}).status_code == 201
    set_limits(admin, ns)
    assert agent.put(mem(ns, "c"), json={"value": 3}).status_code == 201


def test_a_flood_over_its_rate_keeps_getting_429(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    """Past ten refusals of a closed bucket, each refusal is held (here 10 ms) before it is
    sent: still a 429 with its Retry-After, and nothing written."""
    broker = broker_factory("embedded", rate_limit_hold_ms=10)
    with broker.client() as admin:
        set_limits(admin, ns, writes_per_second=SLOW, write_burst=1)
        with broker.client(agent_key(admin, ns)) as agent:
            assert agent.put(mem(ns, "a"), json={"value": 1}).status_code == 201
            for i in range(15):
                assert_rate_limited(agent.put(mem(ns, f"f{i}"), json={"value": i}),
                                    "namespace", "writes_per_second")
        assert usage(admin, ns)["keys"] == 1


def test_reads_over_the_rate_get_429(admin: httpx.Client, agent: httpx.Client,
                                     ns: str) -> None:
    assert admin.put(mem(ns, "a"), json={"value": 1}).status_code == 201
    set_limits(admin, ns, reads_per_second=SLOW, read_burst=3)
    assert agent.get(mem(ns, "a")).status_code == 200
    assert agent.get(f"/v1/namespaces/{ns}/memory").status_code == 200
    assert agent.get(f"/v1/namespaces/{ns}/history/a").status_code == 200
    assert_rate_limited(agent.get(mem(ns, "a")), "namespace", "reads_per_second")
    assert_rate_limited(agent.get(f"/v1/namespaces/{ns}/memory"), "namespace",
                        "reads_per_second")
    assert agent.put(mem(ns, "b"), json={"value": 2}).status_code == 201  # writes apart
    assert admin.get(mem(ns, "a")).status_code == 200


def test_every_agent_has_its_own_default_rate(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    broker = broker_factory("redis", agent_writes_per_second=SLOW, agent_write_burst=2,
                            agent_reads_per_second=SLOW, agent_read_burst=1)
    with broker.client() as admin:
        first, second = agent_key(admin, ns, "first"), agent_key(admin, ns, "second")
        with broker.client(first) as one, broker.client(second) as two:
            assert [one.put(mem(ns, f"a{i}"), json={"value": i}).status_code
                    for i in range(3)] == [201, 201, 429]
            assert_rate_limited(one.put(mem(ns, "a9"), json={"value": 9}), "agent",
                                "writes_per_second")
            assert [two.put(mem(ns, f"b{i}"), json={"value": i}).status_code
                    for i in range(3)] == [201, 201, 429]
            assert one.get(mem(ns, "a0")).status_code == 200
            assert_rate_limited(one.get(mem(ns, "a0")), "agent", "reads_per_second")
            assert two.get(mem(ns, "a0")).status_code == 200
        # the admin key is exempt
        assert all(admin.put(mem(ns, f"c{i}"), json={"value": i}).status_code == 201
                   for i in range(4))
        assert usage(admin, ns)["keys"] == 8


def test_a_runaway_agent_does_not_spend_the_namespace_budget(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    broker = broker_factory("embedded", agent_writes_per_second=SLOW, agent_write_burst=1)
    with broker.client() as admin:
        set_limits(admin, ns, writes_per_second=SLOW, write_burst=2)
        keys = [agent_key(admin, ns, f"a{i}") for i in range(3)]
        with broker.client(keys[0]) as runaway:
            assert runaway.put(mem(ns, "r0"), json={"value": 0}).status_code == 201
            for i in range(5):
                assert_rate_limited(runaway.put(mem(ns, f"r{i + 1}"), json={"value": i}),
                                    "agent", "writes_per_second")
        with broker.client(keys[1]) as calm:
            assert calm.put(mem(ns, "c"), json={"value": 1}).status_code == 201
        with broker.client(keys[2]) as late:
            assert_rate_limited(late.put(mem(ns, "l"), json={"value": 1}), "namespace",
                                "writes_per_second")


# ---- quotas ----


def test_max_keys(admin: httpx.Client, agent: httpx.Client, ns: str) -> None:
    set_limits(admin, ns, max_keys=2)
    assert agent.put(mem(ns, "a"), json={"value": 1}).status_code == 201
    assert agent.put(mem(ns, "b"), json={"value": 2}).status_code == 201
    refused = agent.put(mem(ns, "c"), json={"value": 3})
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert error["details"] == {"limit": "max_keys", "max": 2, "used": 2, "requested": 1}
    assert "retry-after" not in refused.headers
    assert admin.put(mem(ns, "c"), json={"value": 3}).status_code == 429  # quotas bind all
    assert agent.put(mem(ns, "a"), json={"value": 10}).status_code == 200  # no new key
    assert admin.get(mem(ns, "c")).status_code == 404
    assert agent.delete(mem(ns, "b")).status_code == 200  # frees its key at once
    assert agent.put(mem(ns, "c"), json={"value": 3}).status_code == 201
    assert usage(admin, ns)["keys"] == 2
    assert 'memp_quota_exceeded_total{limit="max_keys"}' in admin.get("/metrics").text


def test_max_bytes(admin: httpx.Client, agent: httpx.Client, ns: str) -> None:
    set_limits(admin, ns, max_bytes=20)
    assert agent.put(mem(ns, "a"), json={"value": "x" * 8}).status_code == 201  # 10 bytes
    assert usage(admin, ns)["bytes"] == 10
    refused = agent.put(mem(ns, "b"), json={"value": "y" * 10})  # 12 more: 22 > 20
    assert refused.status_code == 429
    assert refused.json()["error"]["details"] == {"limit": "max_bytes", "max": 20, "used": 10,
                                                  "requested": 12}
    assert agent.put(mem(ns, "b"), json={"value": "y" * 8}).status_code == 201  # exactly 20
    assert agent.put(mem(ns, "a"), json={"value": "x" * 9}).status_code == 429  # grows by 1
    assert agent.put(mem(ns, "a"), json={"value": 1}).status_code == 200  # shrinks
    assert usage(admin, ns)["bytes"] == 11
    assert agent.delete(mem(ns, "b")).status_code == 200
    assert usage(admin, ns) == {"keys": 1, "bytes": 1, "streams": 0, "proposals": 0,
                                "proposal_bytes": 0}
    assert agent.put(mem(ns, "c"), json={"value": "z" * 17}).status_code == 201
    assert usage(admin, ns)["bytes"] == 20


def test_a_lowered_quota_still_lets_usage_shrink(admin: httpx.Client, agent: httpx.Client,
                                                 ns: str) -> None:
    for i in range(3):
        assert agent.put(mem(ns, f"k{i}"), json={"value": "abc"}).status_code == 201
    set_limits(admin, ns, max_keys=1, max_bytes=1)
    assert agent.put(mem(ns, "k0"), json={"value": 1}).status_code == 200
    assert agent.put(mem(ns, "k9"), json={"value": 1}).status_code == 429
    assert agent.delete(mem(ns, "k1")).status_code == 200


def test_a_refused_message_id_applies_once_room_is_made(
        admin: httpx.Client, agent: httpx.Client, ns: str) -> None:
    set_limits(admin, ns, max_keys=0)
    headers = {"Idempotency-Key": "retry-me"}
    assert agent.put(mem(ns, "a"), json={"value": 1}, headers=headers).status_code == 429
    set_limits(admin, ns, max_keys=1)
    assert agent.put(mem(ns, "a"), json={"value": 1}, headers=headers).status_code == 201
    replay = agent.put(mem(ns, "a"), json={"value": 1}, headers=headers)
    assert replay.status_code == 201 and replay.json()["version"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_applied_message_resent_during_a_flood_gets_its_first_reply(
        broker_factory: Callable[..., Broker], ns: str, backend: str) -> None:
    """The bucket is closed and flooded (its refusals held), yet a resent message id that was
    applied gets its remembered reply at once, not a 429; a new one is still refused."""
    broker = broker_factory(backend, rate_limit_hold_ms=10)
    with broker.client() as admin:
        set_limits(admin, ns, writes_per_second=SLOW, write_burst=1)
        with broker.client(agent_key(admin, ns)) as agent:
            first = agent.put(mem(ns, "a"), json={"value": 1},
                              headers={"Idempotency-Key": "applied"})
            assert first.status_code == 201
            for i in range(15):
                assert agent.put(mem(ns, f"f{i}"), json={"value": i}).status_code == 429
            again = agent.put(mem(ns, "a"), json={"value": 1},
                              headers={"Idempotency-Key": "applied"})
            assert again.status_code == 201, again.text
            assert again.json() == first.json()
            message = {"memp": "1.0", "type": "memory.delete", "id": "del-1", "namespace": ns,
                       "key": "a"}
            assert_rate_limited(agent.put(mem(ns, "b"), json={"value": 2},
                                          headers={"Idempotency-Key": "new"}),
                                "namespace", "writes_per_second")
            batch = agent.post("/v1/messages", json=[message]).json()
            assert batch[0]["type"] == "error" and batch[0]["error"]["code"] == "rate_limited"
        assert usage(admin, ns)["keys"] == 1


def test_expiry_frees_quota_at_once(broker_factory: Callable[..., Broker], ns: str) -> None:
    broker = broker_factory("redis", sweep_interval_seconds=3600.0)  # no sweeper to help
    with broker.client() as admin:
        set_limits(admin, ns, max_keys=1, max_bytes=3)
        assert admin.put(mem(ns, "short"), json={"value": 1, "ttl_seconds": 1}).status_code == 201
        assert admin.put(mem(ns, "other"), json={"value": 2}).status_code == 429
        time.sleep(1.1)  # let the entry come due; the quota check expires it itself
        assert admin.put(mem(ns, "other"), json={"value": 2}).status_code == 201
        assert admin.get(mem(ns, "short")).status_code == 404
        assert usage(admin, ns) == {"keys": 1, "bytes": 1, "streams": 0, "proposals": 0,
                                "proposal_bytes": 0}


def test_data_from_before_the_count_is_counted_exactly(broker: Broker, admin: httpx.Client,
                                                       ns: str) -> None:
    for i in range(5):
        assert admin.put(mem(ns, f"k{i}"), json={"value": "v" * i}).status_code == 201
    data_client(broker.app).delete(layout.usage(ns))  # as a release before the count left it
    assert usage(admin, ns) == {"keys": 5, "bytes": sum(i + 2 for i in range(5)), "streams": 0,
                                "proposals": 0, "proposal_bytes": 0}
    data_client(broker.app).delete(layout.usage(ns))
    set_limits(admin, ns, max_bytes=21)
    assert admin.put(mem(ns, "k5"), json={"value": 1}).status_code == 201  # 20 + 1
    assert admin.put(mem(ns, "k6"), json={"value": 1}).status_code == 429


# ---- streams ----


def test_max_streams_and_the_per_token_cap(broker_factory: Callable[..., Broker],
                                           ns: str) -> None:
    broker = broker_factory("redis", max_streams_per_token=1)
    with broker.client() as admin:
        set_limits(admin, ns, max_streams=2)
        one, two, three = (agent_key(admin, ns, f"s{i}") for i in range(3))
        opened = [open_stream(broker, one, ns)]
        assert opened[0][2].status_code == 200
        client, stream, second = open_stream(broker, one, ns)  # the token's cap
        assert second.status_code == 429
        second.read()
        assert second.json()["error"]["details"]["limit"] == "max_streams_per_token"
        stream.__exit__(None, None, None)
        client.close()
        opened.append(open_stream(broker, two, ns))
        assert opened[1][2].status_code == 200
        assert usage(admin, ns)["streams"] == 2
        client, stream, third = open_stream(broker, three, ns)  # the namespace's cap
        third.read()
        assert third.status_code == 429
        assert third.json()["error"]["details"] == {"limit": "max_streams", "max": 2,
                                                    "used": 2, "requested": 1}
        stream.__exit__(None, None, None)
        client.close()
        for client, stream, _ in opened:
            stream.__exit__(None, None, None)
            client.close()
        deadline = time.monotonic() + 10
        while usage(admin, ns)["streams"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert usage(admin, ns)["streams"] == 0  # closing frees the count
        client, stream, again = open_stream(broker, three, ns)
        assert again.status_code == 200
        stream.__exit__(None, None, None)
        client.close()


# ---- two broker processes share one budget ----


def _put(url: str, token: str, ns: str, key: str) -> int:
    with httpx.Client(base_url=url, timeout=15,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        return client.put(mem(ns, key), json={"value": key}).status_code


def test_two_processes_share_one_budget(
        broker_process: Callable[..., BrokerProcess], ns: str) -> None:
    brokers = [broker_process(), broker_process()]
    with httpx.Client(base_url=brokers[0].url, timeout=15,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        set_limits(admin, ns, writes_per_second=SLOW, write_burst=7)
        token = agent_key(admin, ns)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: _put(brokers[i % 2].url, token, ns, f"r{i}"),
                                  range(24)))
        assert sorted(codes).count(201) == 7 and codes.count(429) == 17
        set_limits(admin, ns, max_keys=12)  # 7 keys stored: room for exactly 5 more
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda i: _put(brokers[i % 2].url, ADMIN_KEY, ns, f"q{i}"),
                                  range(20)))
        assert codes.count(201) == 5 and codes.count(429) == 15
        assert usage(admin, ns)["keys"] == 12
        # reads, bytes and streams: one budget too
        set_limits(admin, ns)
        assert _put(brokers[0].url, ADMIN_KEY, ns, "q0") in (200, 201)
        set_limits(admin, ns, reads_per_second=SLOW, read_burst=3, max_bytes=usage(admin, ns)
                   ["bytes"] + 5, max_streams=2)
        reads = [httpx.get(f"{brokers[i % 2].url}{mem(ns, 'q0')}", timeout=15,
                           headers={"Authorization": f"Bearer {token}"}).status_code
                 for i in range(6)]
        assert reads.count(200) == 3 and reads.count(429) == 3
        assert _put(brokers[1].url, ADMIN_KEY, ns, "q0") == 200  # same size: no growth
        sizes = [_put(brokers[i].url, ADMIN_KEY, ns, f"zz{i}") for i in range(2)]  # 5 bytes
        assert sorted(sizes) == [201, 429]
        opened = [open_stream(broker, token, ns) for broker in brokers]
        try:
            assert [o[2].status_code for o in opened] == [200, 200]
            for broker in brokers:
                client, stream, refused = open_stream(broker, token, ns)
                refused.read()
                assert refused.status_code == 429
                assert refused.json()["error"]["details"]["limit"] == "max_streams"
                stream.__exit__(None, None, None)
                client.close()
        finally:
            for client, stream, _ in opened:
                stream.__exit__(None, None, None)
                client.close()
