"""Redis going away and coming back: 503 `unavailable` with Retry-After (never a 500 or a hang)
while it is down, and a working broker again once it is back."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker.storage.client import Backend, store_down
from tests.support.brokers import (
    ADMIN_KEY,
    Broker,
    RedisServer,
    free_port,
    read_changelog,
    start_broker,
)
from tests.support.waiting import wait_until

# Every call gets a hard client-side timeout: a request that hangs fails the test.
CALL_TIMEOUT = 20.0


@pytest.fixture
def broker_on_private_redis(private_redis: RedisServer) -> Iterator[Broker]:
    handle = start_broker("redis", private_redis.url, sweep_interval_seconds=0.02)
    yield handle
    handle.stop()


def client_for(broker: Broker, token: str = ADMIN_KEY) -> httpx.Client:
    return httpx.Client(base_url=broker.url, headers={"Authorization": f"Bearer {token}"},
                        timeout=CALL_TIMEOUT)


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"].isdigit()
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    # HTTP error replies carry the request's id; a message's error reply does not.
    assert set(error) - {"request_id"} == {"code", "message", "details"}
    assert error["code"] == "unavailable"
    assert isinstance(error["message"], str) and error["message"]


def put_message(ns: str, key: str, value: object, message_id: str) -> dict[str, object]:
    return {"memp": "1.0", "type": "memory.put", "id": message_id, "namespace": ns,
            "key": key, "value": value}


def exercise_everything_down(client: httpx.Client, ns: str, agent_token: str) -> None:
    """Every kind of request while Redis is down: all 503, none 500, none hanging."""
    path = f"/v1/namespaces/{ns}/memory"
    assert_unavailable(client.get(f"{path}/customer/1"))
    assert_unavailable(client.put(f"{path}/customer/1", json={"value": {"plan": "free"}}))
    assert_unavailable(client.put(f"{path}/customer/9", json={"value": 1, "ttl_seconds": 5},
                                  headers={"Idempotency-Key": "down-1"}))
    assert_unavailable(client.delete(f"{path}/customer/1"))
    assert_unavailable(client.get(path, params={"pattern": "customer/*"}))
    assert_unavailable(client.get(f"/v1/namespaces/{ns}/history/customer/1"))
    assert_unavailable(client.post("/v1/agents", json={"name": "late", "namespace": ns}))
    assert_unavailable(client.get(f"/v1/namespaces/{ns}/agents"))

    single = client.post("/v1/messages", json=put_message(ns, "m/1", 1, "single-down"))
    assert_unavailable(single)
    assert single.json()["type"] == "error" and single.json()["reply_to"] == "single-down"
    batch = client.post("/v1/messages", json=[
        put_message(ns, "m/1", 1, "batch-down-1"),
        {"memp": "1.0", "type": "memory.get", "id": "batch-down-2", "namespace": ns,
         "key": "customer/1"},
        {"memp": "1.0", "type": "memory.query", "id": "batch-down-3", "namespace": ns,
         "pattern": "*"},
    ])
    assert batch.status_code == 200, batch.text
    replies = batch.json()
    assert [r["type"] for r in replies] == ["error"] * 3
    assert [r["error"]["code"] for r in replies] == ["unavailable"] * 3
    assert [r["reply_to"] for r in replies] == ["batch-down-1", "batch-down-2", "batch-down-3"]

    # A token the broker must look up in Redis (not the admin key) is not refused as unknown.
    with httpx.Client(base_url=str(client.base_url), timeout=CALL_TIMEOUT,
                      headers={"Authorization": f"Bearer {agent_token}"}) as agent:
        assert_unavailable(agent.get(f"{path}/customer/1"))


def test_redis_outage_gives_503_then_the_broker_recovers(
    broker_on_private_redis: Broker, private_redis: RedisServer, ns: str
) -> None:
    broker = broker_on_private_redis
    with client_for(broker) as client:
        path = f"/v1/namespaces/{ns}/memory"
        assert client.put(f"{path}/customer/1", json={"value": {"plan": "pro"}}).status_code == 201
        assert client.delete(f"{path}/customer/1").status_code == 200
        assert client.put(f"{path}/customer/1", json={"value": {"plan": "pro"}}).status_code == 201
        registered = client.post("/v1/agents", json={"name": "a", "namespace": ns})
        assert registered.status_code == 201
        agent_token = registered.json()["credentials"]["api_key"]
        assert client.get("/readyz").status_code == 200

        private_redis.stop()
        exercise_everything_down(client, ns, agent_token)
        ready = client.get("/readyz")
        assert_unavailable(ready)
        assert client.get("/healthz").status_code == 200
        # Still down a moment later: the background jobs failing meanwhile change nothing.
        time.sleep(0.3)
        exercise_everything_down(client, ns, agent_token)

        private_redis.start()
        wait_until(lambda: client.get("/readyz").status_code == 200, "/readyz", timeout=15)
        # A restarted Redis without persistence is empty, and has no scripts loaded: every
        # write script must be loaded again (NOSCRIPT) on first use.
        assert redis.Redis.from_url(private_redis.url).script_exists("0" * 40) == [False]
        assert client.get(f"{path}/customer/1").status_code == 404
        created = client.put(f"{path}/customer/1", json={"value": {"plan": "team"}})
        assert created.status_code == 201 and created.json()["version"] == 1
        assert client.get(f"{path}/customer/1").json()["value"] == {"plan": "team"}
        assert client.put(f"{path}/customer/1", json={"value": {"plan": "x"}},
                          headers={"If-Match": '"1"'}).json()["version"] == 2
        assert client.delete(f"{path}/customer/1").json()["version"] == 3
        batch = client.post("/v1/messages", json=[put_message(ns, "m/1", 1, "after-1"),
                                                   put_message(ns, "m/2", 2, "after-2")])
        assert [r["type"] for r in batch.json()] == ["ack", "ack"], batch.text
        assert client.post("/v1/agents",
                           json={"name": "b", "namespace": ns}).status_code == 201

        # The sweeper is back too: a TTL entry written now is expired and logged once.
        ttl = client.put(f"{path}/short", json={"value": 1, "ttl_seconds": 1})
        assert ttl.status_code == 201
        data = redis.Redis.from_url(private_redis.url)
        try:
            def expired() -> bool:
                return any(r["key"] == "short" and r["type"] == "expire"
                           for r in read_changelog(data, ns))

            wait_until(expired, "the sweeper to expire the entry", timeout=15)
            log = [(r["type"], r["key"], r["ver"]) for r in read_changelog(data, ns)]
        finally:
            data.close()
        assert log == [
            ("put", "customer/1", "1"), ("put", "customer/1", "2"), ("delete", "customer/1", "3"),
            ("put", "m/1", "1"), ("put", "m/2", "1"), ("put", "short", "1"),
            ("expire", "short", "2"),
        ]


def test_broker_started_while_redis_is_down_serves_once_it_is_up(
    tmp_path: Path, ns: str
) -> None:
    server = RedisServer(free_port(), tmp_path)
    broker = start_broker("redis", server.url)
    try:
        with client_for(broker) as client:
            assert_unavailable(client.get("/readyz"))
            assert client.get("/healthz").status_code == 200
            assert_unavailable(client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1}))
            server.start()
            wait_until(lambda: client.get("/readyz").status_code == 200, "/readyz", timeout=15)
            put = client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
            assert put.status_code == 201, put.text
            assert client.get(f"/v1/namespaces/{ns}/memory/k").json()["value"] == 1
    finally:
        broker.stop()
        server.stop()


def test_frozen_redis_gives_503_within_the_timeout_and_retries_apply_once(
    private_redis: RedisServer, ns: str
) -> None:
    """A Redis that accepts connections but never answers (stopped with SIGSTOP, like a network
    partition): requests end with 503 after the store timeout, and a write whose outcome was
    unknown is applied once when retried with its Idempotency-Key."""
    assert private_redis.process is not None
    pid = private_redis.process.pid
    broker = start_broker("redis", private_redis.url, redis_timeout_seconds=1.0,
                          reader_block_ms=500)
    path = f"/v1/namespaces/{ns}/memory/k"
    try:
        with client_for(broker) as client:
            assert client.put(path, json={"value": 1}).status_code == 201
            os.kill(pid, signal.SIGSTOP)
            try:
                assert_unavailable(client.get(path))
                assert_unavailable(client.put(path, json={"value": 2},
                                              headers={"Idempotency-Key": "frozen-1"}))
                batch = client.post("/v1/messages", json=[put_message(ns, "m", 1, "f-1")])
                assert batch.json()[0]["error"]["code"] == "unavailable"
                assert_unavailable(client.get("/readyz"))
                assert client.get("/healthz").status_code == 200
            finally:
                os.kill(pid, signal.SIGCONT)
            # The frozen put may have run once Redis woke up; either way the retry applies it
            # at most once more in total.
            retried = client.put(path, json={"value": 2}, headers={"Idempotency-Key": "frozen-1"})
            assert retried.status_code == 200, retried.text
            assert retried.json()["version"] == 2
            assert client.get(path).json() == retried.json()
        data = redis.Redis.from_url(private_redis.url)
        try:
            log = [(r["type"], r["key"], r["ver"]) for r in read_changelog(data, ns)
                   if r["key"] == "k"]
        finally:
            data.close()
        assert log == [("put", "k", "1"), ("put", "k", "2")]
    finally:
        broker.stop()


def at_once(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run the jobs on threads released together; their results in order."""
    start = threading.Barrier(len(jobs))

    def gated(job: Callable[[], Any]) -> Any:
        start.wait(timeout=CALL_TIMEOUT)
        return job()

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(gated, job) for job in jobs]
        return [f.result(timeout=CALL_TIMEOUT * 2) for f in futures]


def restart_and_wait_ready(server: RedisServer, client: httpx.Client) -> None:
    server.stop()
    server.start()
    wait_until(lambda: client.get("/readyz").status_code == 200, "/readyz", timeout=15)


def test_a_redis_restart_while_the_broker_is_idle_costs_no_request(
    broker_on_private_redis: Broker, private_redis: RedisServer, ns: str
) -> None:
    """Every pooled connection died with the old Redis. Each is found dead before anything is
    sent on it and replaced, so once /readyz says ready no write or read gets a 503."""
    broker = broker_on_private_redis
    path = f"/v1/namespaces/{ns}/memory"
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(base_url=broker.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      timeout=CALL_TIMEOUT, limits=limits) as client:
        def put(n: int) -> Callable[[], int]:
            return lambda: client.put(f"{path}/k{n}", json={"value": n},
                                      headers={"Idempotency-Key": f"{ns}-{n}"}).status_code

        def batch(n: int) -> Callable[[], list[str]]:
            return lambda: [r["type"] for r in client.post("/v1/messages", json=[
                put_message(ns, f"m{n}", n, f"{ns}-m{n}")]).json()]

        def reads(n: int) -> Callable[[], tuple[int, int, int]]:
            return lambda: (client.get(f"{path}/k{n}").status_code,
                            client.get(path, params={"pattern": "k*"}).status_code,
                            client.get(f"/v1/namespaces/{ns}/history/k{n}").status_code)

        for _ in range(3):  # the pool opens a connection per concurrent request
            assert at_once([put(n) for n in range(50)]).count(503) == 0

        restart_and_wait_ready(private_redis, client)
        writes = at_once([put(n) for n in range(40)] + [batch(n) for n in range(10)])
        assert writes[:40] == [201] * 40, writes  # Redis came back empty: created again
        assert writes[40:] == [["ack"]] * 10, writes

        restart_and_wait_ready(private_redis, client)
        assert at_once([reads(n) for n in range(50)]) == [(404, 200, 200)] * 50


def test_configuration_changes_reach_every_process_again_after_a_redis_restart(
    private_redis: RedisServer, ns: str
) -> None:
    """The invalidation listener subscribes again once Redis is back: a process that cached a
    namespace's configuration sees another process change it, long before its cache expires."""
    caching = start_broker("redis", private_redis.url, namespace_cache_seconds=3600)
    other = start_broker("redis", private_redis.url)
    memory, config = f"/v1/namespaces/{ns}/memory/doc", f"/v1/namespaces/{ns}/config"
    try:
        with client_for(caching) as admin, client_for(other) as elsewhere:
            assert admin.put(memory, json={"value": 1}).status_code == 201  # caches the config
            restart_and_wait_ready(private_redis, admin)
            wait_until(lambda: elsewhere.get("/readyz").status_code == 200, "/readyz", timeout=15)

            reader_ns = f"r-{ns}"
            created = elsewhere.post("/v1/keys", json={"grants": [
                {"namespace": reader_ns, "permissions": ["read"]}]})
            assert created.status_code == 201, created.text
            assert elsewhere.put(memory, json={"value": 2}).status_code == 201
            with client_for(caching, created.json()["api_key"]) as reader:
                def shared(shares: list[dict[str, Any]], then: int) -> None:
                    changed = elsewhere.put(config, json={"shares": shares})
                    assert changed.status_code == 200, changed.text
                    wait_until(lambda: reader.get(memory).status_code == then,
                               f"reads answered {then}", 10)

                shared([{"namespace": reader_ns, "permissions": ["read"]}], then=200)
                shared([], then=403)
    finally:
        caching.stop()
        other.stop()


def store_image(server: RedisServer) -> dict[Any, Any]:
    """Every key of the server and its serialized value: what a refused write must not change."""
    data = redis.Redis.from_url(server.url)
    try:
        return {key: data.dump(key) for key in sorted(data.keys("*"))}
    finally:
        data.close()


def assert_out_of_memory(response: httpx.Response) -> None:
    assert_unavailable(response)
    error = response.json()["error"]
    assert error["details"] == {"reason": "out_of_memory", "applied": False}
    assert "out of memory" in error["message"]


def test_a_redis_at_maxmemory_refuses_every_write_with_503_and_writes_nothing(
    private_redis: RedisServer, ns: str
) -> None:
    """`maxmemory` reached under `noeviction`: every kind of write gets 503 `unavailable`
    saying Redis is out of memory and nothing was applied (never a 500 or a dropped
    connection), stored data stays byte for byte as it was, reads go on, and once memory is
    freed the same write retried with its id, through another process, is applied once."""
    first = start_broker("redis", private_redis.url)
    second = start_broker("redis", private_redis.url)
    data = redis.Redis.from_url(private_redis.url)
    path = f"/v1/namespaces/{ns}/memory"
    try:
        with client_for(first) as client, client_for(second) as other:
            assert client.put(f"{path}/kept", json={"value": 1}).status_code == 201
            registered = client.post("/v1/agents", json={"name": "a", "namespace": ns})
            assert registered.status_code == 201
            agent_token = registered.json()["credentials"]["api_key"]
            data.config_set("maxmemory-policy", "noeviction")
            data.config_set("maxmemory", 1)
            before = store_image(private_redis)

            assert_out_of_memory(client.put(f"{path}/new", json={"value": {"n": 1}},
                                            headers={"Idempotency-Key": "oom-1"}))
            assert_out_of_memory(client.put(f"{path}/kept", json={"value": 2},
                                            headers={"If-Match": '"1"'}))
            assert_out_of_memory(client.post("/v1/agents", json={"name": "b", "namespace": ns}))
            assert_out_of_memory(client.post("/v1/keys", json={"grants": [
                {"namespace": ns, "permissions": ["read"]}]}))
            assert_out_of_memory(client.put(f"/v1/namespaces/{ns}/config",
                                            json={"strategy": "merge"}))
            assert_out_of_memory(client.put(f"/v1/namespaces/{ns}/schemas/s", json={
                "pattern": "x/*", "schema": {"type": "object"}}))
            with httpx.Client(base_url=first.url, timeout=CALL_TIMEOUT,
                              headers={"Authorization": f"Bearer {agent_token}"}) as agent:
                assert_out_of_memory(agent.put(f"{path}/by-agent", json={"value": 1}))
            single = client.post("/v1/messages", json=put_message(ns, "m", 1, "oom-m1"))
            assert_out_of_memory(single)
            assert single.json()["reply_to"] == "oom-m1"
            batch = client.post("/v1/messages", json=[put_message(ns, "m", 1, "oom-m2"),
                                                       put_message(ns, "n", 2, "oom-m3")])
            assert batch.status_code == 200, batch.text
            assert [r["error"]["details"]["reason"] for r in batch.json()] == [
                "out_of_memory"] * 2

            # Reads go on; nothing of the refused writes was stored, not even in part.
            assert client.get(f"{path}/kept").json()["value"] == 1
            assert other.get(f"{path}/new").status_code == 404
            assert store_image(private_redis) == before
            # A delete frees memory: it is applied even now.
            assert other.delete(f"{path}/kept").json()["version"] == 2

            data.config_set("maxmemory", 0)
            retried = other.put(f"{path}/new", json={"value": {"n": 1}},
                                headers={"Idempotency-Key": "oom-1"})
            assert retried.status_code == 201, retried.text
            again = client.put(f"{path}/new", json={"value": {"n": 1}},
                               headers={"Idempotency-Key": "oom-1"})
            assert again.json() == retried.json()
        log = [(r["type"], r["key"], r["ver"]) for r in read_changelog(data, ns)]
        assert log == [("put", "kept", "1"), ("delete", "kept", "2"), ("put", "new", "1")]
    finally:
        data.close()
        first.stop()
        second.stop()


def test_a_registration_that_failed_part_way_is_finished_by_its_retry(
    private_redis: RedisServer, ns: str
) -> None:
    """Registration is several writes. Redis refusing the API key's write (an ACL that hides
    the API key keys stands in for Redis dying between the steps) leaves the agent stored and
    the request failed; the retry with the same id finishes that registration: one agent, and
    the key the retry returns works, then and on every later replay."""
    broker = start_broker("redis", private_redis.url)
    data = redis.Redis.from_url(private_redis.url)
    body = {"name": "planner", "namespace": ns}
    try:
        with client_for(broker) as client:
            # Every key but `memp:{a...` ones, which include `memp:{api-keys}:...`.
            data.execute_command("ACL", "SETUSER", "default", "resetkeys", "~memp:[^{]*",
                                 f"~memp:{{{ns[0]}*")
            try:
                failed = client.post("/v1/agents", json=body, headers={"Idempotency-Key": "r1"})
            finally:
                data.execute_command("ACL", "SETUSER", "default", "allkeys")
            assert failed.status_code >= 500, failed.text
            retried = client.post("/v1/agents", json=body, headers={"Idempotency-Key": "r1"})
            assert retried.status_code == 201, retried.text
            registered = retried.json()
            agents = client.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
            assert [a["id"] for a in agents] == [registered["agent"]["id"]]
            again = client.post("/v1/agents", json=body, headers={"Idempotency-Key": "r1"})
            assert again.json() == registered
        with client_for(broker, registered["credentials"]["api_key"]) as agent:
            written = agent.put(f"/v1/namespaces/{ns}/memory/k", json={"value": 1})
            assert written.status_code == 201, written.text
            assert written.json()["agent_id"] == registered["agent"]["id"]
    finally:
        data.close()
        broker.stop()


def test_an_unexpected_store_error_is_a_500_with_its_request_id_on_a_connection_that_lives(
    private_redis: RedisServer, ns: str
) -> None:
    """A failure the broker has no answer for (here Redis refusing the broker's keys to its
    user, an operator's ACL mistake) is `500 internal` in the error shape with the request id,
    in the body and the header, and the keep-alive connection serves the next request (it
    used to be closed, so the next request on it met a reset)."""
    broker = start_broker("redis", private_redis.url)
    data = redis.Redis.from_url(private_redis.url)
    path = f"/v1/namespaces/{ns}/memory"
    try:
        with client_for(broker) as client:
            assert client.put(f"{path}/k", json={"value": 1}).status_code == 201
            data.execute_command("ACL", "SETUSER", "default", "resetkeys", "~nothing")
            try:
                for value in ("small", "x" * 20_000, "y" * 200_000):
                    failed = client.put(f"{path}/k", json={"value": value})
                    assert failed.status_code == 500, failed.text
                    error = failed.json()["error"]
                    assert error["code"] == "internal"
                    assert error["request_id"] == failed.headers["x-request-id"]
            finally:
                data.execute_command("ACL", "SETUSER", "default", "allkeys")
            assert client.get(f"{path}/k").json()["value"] == 1
    finally:
        data.close()
        broker.stop()


def test_a_batch_refused_for_memory_part_way_does_not_claim_nothing_was_written(
    private_redis: RedisServer
) -> None:
    """Several scripts in one round trip (an AMP import stores 50 cells a script): when Redis
    crosses its maxmemory after the first, the second is refused and the first's writes stay,
    so the 503 must not say `applied: false`. A write refused whole still says it."""
    data = redis.Redis.from_url(private_redis.url)

    async def scenario() -> None:
        backend = Backend.open(private_redis.url, 2.0)
        grow = backend.redis.register_script(
            "redis.call('SET', KEYS[1], string.rep('x', 8000000)) return 1")
        try:
            await backend.run([(grow, ["warm"], [])])  # scripts loaded, the pool warm
            data.delete("warm")
            used = int(data.info("memory")["used_memory"])
            data.config_set("maxmemory-policy", "noeviction")
            data.config_set("maxmemory", used + 4_000_000)  # one value crosses it
            with pytest.raises(Exception) as part_way:
                await backend.run([(grow, ["first"], []), (grow, ["second"], [])])
            assert data.exists("first") and not data.exists("second")
            error = store_down(part_way.value)
            assert error.status == 503 and error.details == {"reason": "out_of_memory"}
            with pytest.raises(Exception) as whole:
                await backend.run([(grow, ["third"], []), (grow, ["fourth"], [])])
            assert not data.exists("third") and not data.exists("fourth")
            assert store_down(whole.value).details == {"reason": "out_of_memory",
                                                       "applied": False}
        finally:
            data.config_set("maxmemory", 0)
            await backend.close()

    try:
        asyncio.run(scenario())
    finally:
        data.close()
