"""Concurrent writers on two broker OS processes sharing one Redis: versions, compare-and-set,
idempotency and last-write-wins hold across processes."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import httpx
import pytest
import redis

from tests.support.brokers import ADMIN_KEY, BrokerProcess, read_changelog
from tests.support.clients import run_all

WRITERS = 8
PUTS_PER_WRITER = 50
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def brokers(broker_processes: Callable[..., list[BrokerProcess]]) -> list[BrokerProcess]:
    """Two `memp-broker serve` processes on the same Redis."""
    return broker_processes(2)


@pytest.fixture
def log_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def clients(brokers: list[BrokerProcess], token: str = ADMIN_KEY) -> list[httpx.Client]:
    """One client per broker process; index i % 2 picks the process."""
    return [httpx.Client(base_url=b.url, headers={"Authorization": f"Bearer {token}"},
                         timeout=30) for b in brokers]


def memory_path(ns: str, key: str) -> str:
    return f"/v1/namespaces/{ns}/memory/{key}"


def puts_for(log: list[dict[str, str]], key: str) -> list[dict[str, str]]:
    return [r for r in log if r["key"] == key and r["type"] == "put"]


def test_concurrent_puts_on_one_key_get_versions_1_to_n(
    brokers: list[BrokerProcess], log_client: redis.Redis, ns: str
) -> None:
    key = "hot/key"

    def writer(w: int) -> list[tuple[int, int, int]]:
        pair = clients(brokers)
        done = []
        try:
            for n in range(PUTS_PER_WRITER):
                reply = pair[(w + n) % 2].put(memory_path(ns, key),
                                              json={"value": {"w": w, "n": n}})
                assert reply.status_code in (200, 201), reply.text
                done.append((reply.json()["version"], w, n))
        finally:
            for c in pair:
                c.close()
        return done

    results = [r for batch in run_all([partial(writer, w) for w in range(WRITERS)])
               for r in batch]
    total = WRITERS * PUTS_PER_WRITER
    versions = sorted(v for v, _, _ in results)
    assert versions == list(range(1, total + 1))
    by_version = {v: {"w": w, "n": n} for v, w, n in results}
    # Each writer's own replies rise, since its puts were sequential.
    for w in range(WRITERS):
        own = [v for v, ww, _ in sorted(results, key=lambda r: r[2]) if ww == w]
        assert own == sorted(own)

    log = puts_for(read_changelog(log_client, ns), key)
    assert [int(r["ver"]) for r in log] == list(range(1, total + 1))
    assert all(json.loads(r["val"]) == by_version[int(r["ver"])] for r in log)
    assert len({r["id"] for r in log}) == 1, "one entry id for the key's whole life"

    with httpx.Client(base_url=brokers[1].url, headers=HEADERS, timeout=30) as client:
        current = client.get(memory_path(ns, key))
        assert current.json()["version"] == total
        assert current.json()["value"] == by_version[total]
        history = client.get(f"/v1/namespaces/{ns}/history/{key}").json()["versions"]
    assert history, "history keeps recent versions"
    assert [h["version"] for h in history] == list(range(total, total - len(history), -1))
    assert all(h["value"] == by_version[h["version"]] for h in history)


def test_compare_and_set_counter_loses_no_update(
    brokers: list[BrokerProcess], log_client: redis.Redis, ns: str
) -> None:
    key = "counter"
    writers, increments = 6, 15
    with httpx.Client(base_url=brokers[0].url, headers=HEADERS, timeout=30) as client:
        assert client.put(memory_path(ns, key), json={"value": {"count": 0}},
                          headers={"If-None-Match": "*"}).status_code == 201

    def incrementer(w: int) -> tuple[int, int, list[int]]:
        pair = clients(brokers)
        succeeded, refused, versions = 0, 0, []
        deadline = time.monotonic() + 60
        try:
            while succeeded < increments and time.monotonic() < deadline:
                client = pair[(w + succeeded + refused) % 2]
                got = client.get(memory_path(ns, key))
                assert got.status_code == 200, got.text
                count = got.json()["value"]["count"]
                put = client.put(memory_path(ns, key), json={"value": {"count": count + 1}},
                                 headers={"If-Match": got.headers["etag"]})
                if put.status_code == 412:
                    assert put.json()["error"]["code"] == "precondition_failed"
                    refused += 1
                    continue
                assert put.status_code == 200, put.text
                assert put.json()["version"] == int(got.headers["etag"].strip('"')) + 1
                succeeded += 1
                versions.append(put.json()["version"])
        finally:
            for c in pair:
                c.close()
        return succeeded, refused, versions

    outcomes = run_all([partial(incrementer, w) for w in range(writers)])
    successes = sum(s for s, _, _ in outcomes)
    assert successes == writers * increments, "every writer finished before the deadline"
    won = sorted(v for _, _, vs in outcomes for v in vs)
    assert won == list(range(2, successes + 2)), "each version was won by exactly one writer"
    with httpx.Client(base_url=brokers[1].url, headers=HEADERS, timeout=30) as client:
        final = client.get(memory_path(ns, key)).json()
    assert final["value"]["count"] == successes
    assert final["version"] == successes + 1
    log = puts_for(read_changelog(log_client, ns), key)
    assert [json.loads(r["val"])["count"] for r in log] == list(range(successes + 1))


@pytest.mark.parametrize("rounds", [pytest.param(10, id="10-keys")])
def test_idempotency_key_applies_once_across_processes(
    brokers: list[BrokerProcess], log_client: redis.Redis, ns: str, rounds: int
) -> None:
    def send(b: int, key: str, message_id: str) -> httpx.Response:
        with httpx.Client(base_url=brokers[b].url, headers=HEADERS, timeout=30) as client:
            return client.put(memory_path(ns, key), json={"value": {"key": key}},
                              headers={"Idempotency-Key": message_id})

    for i in range(rounds):
        key = f"idem/{i}"
        first, second = run_all([partial(send, b, key, f"msg-{i}") for b in range(2)])
        assert first.status_code == second.status_code == 201
        assert first.json() == second.json()
        assert first.json()["version"] == 1

    def send_message(b: int, key: str, message_id: str) -> dict[str, Any]:
        message = {"memp": "1.0", "type": "memory.put", "id": message_id, "namespace": ns,
                   "key": key, "value": {"via": "messages"}}
        with httpx.Client(base_url=brokers[b].url, headers=HEADERS, timeout=30) as client:
            reply = client.post("/v1/messages", json=[message])
        assert reply.status_code == 200, reply.text
        result: dict[str, Any] = reply.json()[0]
        return result

    for i in range(rounds):
        key = f"idem-msg/{i}"
        first, second = run_all([partial(send_message, b, key, f"m-{i}") for b in range(2)])
        assert first["type"] == second["type"] == "ack"
        assert first["entry"] == second["entry"]
        assert first["entry"]["version"] == 1

    log = read_changelog(log_client, ns)
    per_key = Counter(r["key"] for r in log)
    assert len(per_key) == 2 * rounds
    assert set(per_key.values()) == {1}, "each message was applied exactly once"


def test_last_write_wins_keeps_the_newest_timestamp_and_agent(
    brokers: list[BrokerProcess], log_client: redis.Redis, ns: str
) -> None:
    key = "lww/contested"
    agents: list[tuple[str, str]] = []
    with httpx.Client(base_url=brokers[0].url, headers=HEADERS, timeout=30) as admin:
        for i in range(6):
            reply = admin.post("/v1/agents", json={"name": f"writer-{i}", "namespace": ns})
            assert reply.status_code == 201, reply.text
            body = reply.json()
            agents.append((body["agent"]["id"], body["credentials"]["api_key"]))
    rng = random.Random(7)
    base = int(time.time() * 1000) - 60_000
    writes_per_agent = 25
    # A narrow window makes equal timestamps across agents common, so the agent id breaks ties;
    # each agent's own timestamps are distinct, so (timestamp, agent) names one write.
    plans = {agent_id: rng.sample(range(base, base + 60), writes_per_agent)
             for agent_id, _ in agents}

    def writer(w: int) -> list[tuple[int, str, int, dict[str, Any]]]:
        agent_id, token = agents[w]
        pair = clients(brokers, token)
        out = []
        try:
            for n, ts in enumerate(plans[agent_id]):
                reply = pair[(w + n) % 2].put(
                    memory_path(ns, key), json={"value": {"ts": ts, "agent": agent_id},
                                                "timestamp": ts})
                out.append((ts, agent_id, reply.status_code, reply.json()))
        finally:
            for c in pair:
                c.close()
        return out

    writes = [r for batch in run_all([partial(writer, w) for w in range(len(agents))])
              for r in batch]
    assert {status for _, _, status, _ in writes} <= {200, 201, 409}
    newest = max((ts, agent) for ts, agent, _, _ in writes)
    applied = sorted((body["version"], (ts, agent)) for ts, agent, status, body in writes
                     if status in (200, 201))
    assert newest in [order for _, order in applied], "the newest write was applied"
    orders = [order for _, order in applied]
    assert orders == sorted(orders) and len(set(orders)) == len(orders), \
        "every applied write was newer than the one it replaced"
    assert [v for v, _ in applied] == list(range(1, len(applied) + 1))
    for ts, agent, status, body in writes:
        if status == 409:
            error = body["error"]
            assert error["code"] == "write_conflict"
            winner = error["details"]["winner"]
            assert (winner["timestamp"], winner["agent_id"]) > (ts, agent)
            assert winner["value"] == {"ts": winner["timestamp"], "agent": winner["agent_id"]}
    assert len(applied) + sum(s == 409 for _, _, s, _ in writes) == len(writes)

    with httpx.Client(base_url=brokers[1].url, headers=HEADERS, timeout=30) as client:
        survivor = client.get(memory_path(ns, key)).json()
    assert (survivor["timestamp"], survivor["agent_id"]) == newest
    assert survivor["value"] == {"ts": newest[0], "agent": newest[1]}
    log = puts_for(read_changelog(log_client, ns), key)
    assert [(int(r["ts"]), r["agent"]) for r in log] == orders


def test_configuration_writes_from_two_processes_each_get_a_revision_of_their_own(
    brokers: list[BrokerProcess], ns: str
) -> None:
    """Configuration writes race through both processes (broker/storage/config.py swaps the
    document only if it is still the one read): no revision is given twice or lost."""
    writers, writes = 6, 5

    def writer(w: int) -> list[tuple[int, int]]:
        pair = clients(brokers)
        try:
            done = []
            for n in range(writes):
                ttl = 1000 * (w + 1) + n
                reply = pair[(w + n) % 2].put(f"/v1/namespaces/{ns}/config",
                                              json={"default_ttl_seconds": ttl})
                assert reply.status_code == 200, reply.text
                done.append((reply.json()["revision"], ttl))
            return done
        finally:
            for c in pair:
                c.close()

    stored = sorted(r for rs in run_all([partial(writer, w) for w in range(writers)])
                    for r in rs)
    assert [revision for revision, _ in stored] == list(range(1, writers * writes + 1))
    with httpx.Client(base_url=brokers[1].url, headers=HEADERS, timeout=30) as client:
        final = client.get(f"/v1/namespaces/{ns}/config").json()
    assert (final["revision"], final["default_ttl_seconds"]) == stored[-1]
