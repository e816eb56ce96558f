"""The writes of records beside entries (broker/storage/writes.py): atomic, conditional when
asked, on both stores; and with `MEMP_WRITE_REPLICAS` on a Redis without replicas, every
configuration, schema, API key and agent write is applied but answered 503 saying so, and a
revocation still takes effect at once, everywhere, and is audited. The same on Cluster and
Sentinel, with replicas that answer and then do not: tests/storage/test_topology_brokers.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis as redis_lib

from broker.storage import Storage, layout
from broker.storage.client import Backend, NotReplicated
from broker.storage.writes import Announcement, Holds
from tests.support.brokers import Broker, RedisServer, start_broker

TIMEOUT_MS = 100


async def announced(storage: Storage, subject: str) -> int:
    """How many announcements name `subject`."""
    records: Any = await storage.backend.redis.xrange(layout.bulletins(), "-", "+")
    return sum(fields[b"subject"] == subject.encode() for _, fields in records)


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_a_write_runs_its_commands_atomically_and_only_if_its_condition_holds(
        backend: str, redis_url: str, ns: str) -> None:
    async def main() -> None:
        storage = Storage.open(redis_url if backend == "redis" else None, timeout=2.0,
                               history_limit=4, changelog_maxlen=1000,
                               idempotency_window_ms=1000)
        writer = storage.config.writer
        key, other = f"memp:{{{ns}}}:w", f"memp:{{{ns}}}:h"
        try:
            announce: Announcement = ("namespace", ns)
            assert await writer.write(("SET", key, b"1"), only_if=Holds(b"0"),
                                      announce=announce) is None
            assert await announced(storage, ns) == 0  # nothing changed, nothing to announce
            assert await writer.write(("SET", key, b"1"), ("HSET", other, "f", "v"),
                                      only_if=Holds(None), announce=announce) == [b"OK", 1]
            assert await announced(storage, ns) == 1
            assert await writer.write(("SET", key, b"2"), only_if=Holds(None)) is None
            assert await writer.write(("SET", key, b"2"), only_if=Holds(b"1")) == [b"OK"]
            assert await writer.write(("HDEL", other, "f"), ("HDEL", other, "f")) == [1, 0]
            assert await writer.write(("SET", other, b"x", "PX", 60_000, "NX")) == [b"OK"]
            assert await writer.write(("SET", other, b"y", "PX", 60_000, "NX")) == [None]
            assert await storage.backend.redis.get(other) == b"x"
            await storage.backend.redis.delete(other)
            redis = storage.backend.redis
            assert await redis.get(key) == b"2" and not await redis.exists(other)
        finally:
            await storage.backend.redis.delete(key, other)
            await storage.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_call_whose_script_redis_forgot_is_run_before_replicas_are_counted(
        private_redis: RedisServer) -> None:
    """A script missing from Redis's cache did not run: it is loaded and sent again before
    the write is reported applied (and, with no replica here, not confirmed)."""
    async def main() -> None:
        backend = Backend.open(private_redis.url, 2, replicas=1, wait_ms=TIMEOUT_MS)
        script = backend.redis.register_script("return redis.call('INCR', KEYS[1])")
        try:
            assert await backend.call(script, ["n"], []) == 1  # no wait: not durable
            await backend.redis.script_flush()
            with pytest.raises(NotReplicated):
                await backend.run([(script, ["n"], []), (script, ["n"], [])], durable=True)
            assert await backend.redis.get("n") == b"3"
        finally:
            await backend.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def applied_not_confirmed(reply: httpx.Response, started: float) -> None:
    """A 503 saying the write was applied but no replica confirmed it, within the timeout."""
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "unavailable" and reply.headers["retry-after"] == "1"
    assert error["details"] == {"applied": True, "replicas_confirmed": 0,
                                "replicas_required": 1}
    assert time.monotonic() - started < TIMEOUT_MS / 1000 + 10.0  # gave up, did not hang


def timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    return call(), started


def test_without_replicas_every_acknowledged_write_says_it_is_applied_but_not_confirmed(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    waiting = broker_factory("redis", write_replicas=1,
                             write_replicas_timeout_ms=TIMEOUT_MS)
    plain = broker_factory("redis")
    base = f"/v1/namespaces/{ns}"
    with waiting.client() as admin, plain.client() as other:
        reply, started = timed(lambda: admin.put(f"{base}/config",
                                                 json={"default_ttl_seconds": 60}))
        applied_not_confirmed(reply, started)
        config = other.get(f"{base}/config").json()
        assert config["revision"] == 1 and config["default_ttl_seconds"] == 60
        reply, started = timed(lambda: admin.put(f"{base}/schemas/s", json={
            "pattern": "typed/*", "schema": {"type": "object"}}))
        applied_not_confirmed(reply, started)
        assert other.get(f"{base}/schemas/s").status_code == 200
        reply, started = timed(lambda: admin.delete(f"{base}/schemas/s"))
        applied_not_confirmed(reply, started)
        assert other.get(f"{base}/schemas/s").status_code == 404

        before = {k["id"] for k in other.get("/v1/keys").json()["keys"]}
        # Grants that reach no namespace holding data: no audit record follows the key.
        reply, started = timed(lambda: admin.post("/v1/keys", json={
            "grants": [{"namespace": f"{ns}-k*", "permissions": ["read"]}]}))
        applied_not_confirmed(reply, started)
        # Its secret was never shown: the key is listed, for an admin to revoke.
        assert len({k["id"] for k in other.get("/v1/keys").json()["keys"]} - before) == 1

        reply, started = timed(lambda: admin.post("/v1/agents", json={
            "name": "a", "namespace": ns}))
        applied_not_confirmed(reply, started)
        agents = other.get(f"{base}/agents").json()["agents"]
        assert len(agents) == 1
        reply, started = timed(lambda: admin.delete(f"{base}/agents/{agents[0]['id']}"))
        applied_not_confirmed(reply, started)
        assert other.get(f"{base}/agents").json()["agents"] == []


def test_an_unconfirmed_revocation_takes_effect_everywhere_and_is_audited(
        broker_factory: Callable[..., Broker], ns: str) -> None:
    waiting = broker_factory("redis", write_replicas=1,
                             write_replicas_timeout_ms=TIMEOUT_MS)
    plain = broker_factory("redis")
    with plain.client() as other:
        created: dict[str, Any] = other.post("/v1/keys", json={
            "grants": [{"namespace": ns, "permissions": ["read"]}]}).json()
    path = f"/v1/namespaces/{ns}/memory/k"
    with waiting.client(created["api_key"]) as here, plain.client(created["api_key"]) as there:
        assert here.get(path).status_code == 404  # authenticated (and cached) on both
        assert there.get(path).status_code == 404
        with waiting.client() as admin:
            reply, started = timed(lambda: admin.delete(f"/v1/keys/{created['key']['id']}"))
        applied_not_confirmed(reply, started)
        assert here.get(path).status_code == 401  # at once, in the process that revoked it
        deadline = time.monotonic() + 5
        while there.get(path).status_code != 401:  # and, announced, in every other one
            assert time.monotonic() < deadline, "the other process still takes the key"
            time.sleep(0.02)
    with plain.client() as other:
        audit = other.get(f"/v1/namespaces/{ns}/audit").json()["records"]
        assert [r["action"] for r in audit] == ["key-revoke", "key-create"]
        with waiting.client() as admin:
            assert admin.delete(f"/v1/keys/{created['key']['id']}").status_code == 404


def test_a_primary_refusing_writes_for_replicas_or_demoted_answers_503_never_500(
        private_redis: RedisServer, ns: str) -> None:
    """A primary short of replicas (`min-replicas-to-write`, as a deposed one is) refuses a
    write before applying it: `503` with `applied: false`; a node demoted to a replica refuses
    it `READONLY`: `503`. Neither is a `500`, nothing is written, and the same write retried
    with its id once the node is a primary again is applied once."""
    broker = start_broker("redis", private_redis.url)
    put = f"/v1/namespaces/{ns}/memory/k"
    try:
        with broker.client() as admin, redis_lib.Redis.from_url(private_redis.url) as redis:
            assert admin.put(put, json={"value": 1}).status_code == 201
            redis.config_set("min-replicas-to-write", 1)
            reply = admin.put(put, json={"value": 2}, headers={"Idempotency-Key": "w2"})
            assert reply.status_code == 503, reply.text
            assert reply.json()["error"]["details"] == {"reason": "no_replicas",
                                                        "applied": False}
            redis.config_set("min-replicas-to-write", 0)
            redis.execute_command("REPLICAOF", "127.0.0.1", "1")  # no primary there
            try:
                reply = admin.put(put, json={"value": 2}, headers={"Idempotency-Key": "w2"})
                assert reply.status_code == 503, reply.text
            finally:
                redis.execute_command("REPLICAOF", "NO", "ONE")
            assert admin.get(put).json()["value"] == 1
            reply = admin.put(put, json={"value": 2}, headers={"Idempotency-Key": "w2"})
            assert reply.status_code == 200 and reply.json()["version"] == 2, reply.text
            again = admin.put(put, json={"value": 2}, headers={"Idempotency-Key": "w2"})
            assert again.json()["version"] == 2
    finally:
        broker.stop()
