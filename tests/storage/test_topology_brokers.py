"""The broker on Redis Cluster and Redis Sentinel (tests/support/topologies.py, started once per
session on loopback, behind an ACL user): the contract's core behaviours on each, then a
primary killed under load through two broker processes.

The whole contract suite can also run against either topology (docs/tests.md, "Redis topologies");
CI runs this subset, marked `topology`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.commands.core import AsyncScript

from broker.amp.poster import IDLE_SECONDS
from broker.storage import layout
from broker.storage.client import STORE_DOWN, Backend
from tests.support.brokers import (
    ADMIN_KEY,
    Broker,
    BrokerProcess,
    ServeProcesses,
    check_workers_auto,
    start_broker,
)
from tests.support.streams import Event, Stream
from tests.support.topologies import (
    Credentials,
    RedisCluster,
    RedisProcess,
    RedisSentinel,
    TlsRedis,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.topology
Topology = RedisCluster | RedisSentinel
WAIT = 20.0


@pytest.fixture(scope="module", params=["cluster", "sentinel"])
def topology(request: pytest.FixtureRequest) -> Topology:
    found: Topology = request.getfixturevalue(f"redis_{request.param}")
    return found


@pytest.fixture(scope="module")
def broker(topology: Topology) -> Iterator[Broker]:
    handle = start_broker("redis", topology.url, amp_namespace="cells",
                          amp_purge_retention=True)
    yield handle
    handle.stop()


@pytest.fixture
def admin(broker: Broker) -> Iterator[httpx.Client]:
    with broker.client() as client:
        yield client


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    opened: list[Stream] = []

    def open_stream(url: str, subs: list[str], last_event_id: str | None = None,
                    snapshot: bool = False, token: str = ADMIN_KEY) -> Stream:
        params = [("sub", s) for s in subs] + ([("snapshot", "1")] if snapshot else [])
        headers = {"Authorization": f"Bearer {token}"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        stream = Stream(f"{url}/v1/subscribe", params, headers)
        opened.append(stream)
        return stream.wait_open()

    yield open_stream
    for stream in opened:
        stream.close()


def put(client: httpx.Client, ns: str, key: str, value: Any, **kw: Any) -> httpx.Response:
    return client.put(f"/v1/namespaces/{ns}/memory/{key}", json={"value": value, **kw})


# ---- the contract's core on each topology ----


def test_memory_across_many_namespaces_and_shards(admin: httpx.Client, ns: str) -> None:
    spaces = [f"{ns}-{i}" for i in range(12)]  # spread over every shard of a cluster
    for space in spaces:
        assert put(admin, space, "a/1", {"n": 1}).status_code == 201
        assert put(admin, space, "a/2", {"n": 2}).status_code == 201
        assert put(admin, space, "a/1", {"n": 3}).status_code == 200
    for space in spaces:
        page = admin.get(f"/v1/namespaces/{space}/memory", params={"pattern": "a/*"}).json()
        assert [(e["key"], e["value"]["n"], e["version"]) for e in page["entries"]] == [
            ("a/1", 3, 2), ("a/2", 2, 1)]
        gone = admin.delete(f"/v1/namespaces/{space}/memory/a/2")
        assert gone.json()["deleted"] is True
        history = admin.get(f"/v1/namespaces/{space}/history/a/1").json()["versions"]
        assert [v["version"] for v in history] == [2, 1]


def test_expiry_idempotency_and_conflicts(admin: httpx.Client, ns: str) -> None:
    assert put(admin, ns, "brief", 1, ttl_seconds=1).status_code == 201
    first = admin.put(f"/v1/namespaces/{ns}/memory/idem", json={"value": 1},
                      headers={"Idempotency-Key": "m-1"})
    again = admin.put(f"/v1/namespaces/{ns}/memory/idem", json={"value": 1},
                      headers={"Idempotency-Key": "m-1"})
    assert again.json() == first.json()
    reused = admin.put(f"/v1/namespaces/{ns}/memory/idem", json={"value": 2},
                       headers={"Idempotency-Key": "m-1"})
    assert reused.status_code == 422
    now = int(time.time() * 1000)
    assert put(admin, ns, "lww", "new", timestamp=now).status_code == 201
    assert put(admin, ns, "lww", "old", timestamp=now - 10).status_code == 409
    admin.put(f"/v1/namespaces/{ns}/config", json={"rules": [
        {"pattern": "doc/*", "strategy": "merge"}]}).raise_for_status()
    put(admin, ns, "doc/1", {"a": 1, "b": 1}).raise_for_status()
    put(admin, ns, "doc/1", {"a": 2}).raise_for_status()
    merged = put(admin, ns, "doc/1", {"a": 3}, base_version=1).json()
    assert merged["value"] == {"a": 3, "b": 1} and merged["conflicts"][0]["path"] == "/a"
    deadline = time.monotonic() + WAIT
    while not admin.get(f"/v1/namespaces/{ns}/history/brief").json()["versions"][0]["deleted"]:
        assert time.monotonic() < deadline, "the sweeper did not record the expiry"
        time.sleep(0.05)
    assert admin.get(f"/v1/namespaces/{ns}/memory/brief").status_code == 404


def test_schemas_shares_keys_and_agents(broker: Broker, admin: httpx.Client, ns: str) -> None:
    admin.put(f"/v1/namespaces/{ns}/schemas/s", json={
        "pattern": "typed/*", "enforce": True,
        "schema": {"type": "object", "required": ["n"]}}).raise_for_status()
    assert put(admin, ns, "typed/1", {"x": 1}).status_code == 422
    registered = admin.post("/v1/agents", json={"name": "a", "namespace": ns}).json()
    with broker.client(registered["credentials"]["api_key"]) as agent:
        written = put(agent, ns, "by-agent", 1).json()
        assert written["agent_id"] == registered["agent"]["id"]
    key = admin.post("/v1/keys", json={"grants": [{"namespace": f"{ns}-x", "permissions":
                                                   ["read"]}]}).json()
    admin.put(f"/v1/namespaces/{ns}/config", json={"shares": [
        {"namespace": f"{ns}-x", "permissions": ["read"]}]}).raise_for_status()
    with broker.client(key["api_key"]) as guest:
        assert guest.get(f"/v1/namespaces/{ns}/memory/by-agent").status_code == 200
    assert admin.delete(f"/v1/keys/{key['key']['id']}").status_code == 204
    with broker.client(key["api_key"]) as guest:
        assert guest.get(f"/v1/namespaces/{ns}/memory/by-agent").status_code == 401
    listed = [k["id"] for k in admin.get("/v1/keys").json()["keys"]]
    assert key["key"]["id"] not in listed


def test_a_stream_over_namespaces_on_different_shards_resumes_without_gap(
        broker: Broker, admin: httpx.Client, streams: Callable[..., Stream], ns: str) -> None:
    spaces = [f"{ns}-s{i}" for i in range(4)]
    for space in spaces:
        put(admin, space, "k", 0).raise_for_status()
    first = streams(broker.url, [f"{s}:*" for s in spaces], snapshot=True)
    first.wait_event(lambda e: e.event == "snapshot-end", "the snapshot")
    for n in range(1, 4):
        for space in spaces:
            put(admin, space, "k", n).raise_for_status()
    first.wait_for(lambda: len(first.changes()) >= 12, "12 changes")
    cursor = first.changes()[5].id  # resume in the middle
    first.close()
    for space in spaces:
        put(admin, space, "k", 4).raise_for_status()
    resumed = streams(broker.url, [f"{s}:*" for s in spaces], last_event_id=cursor)
    resumed.wait_for(lambda: len(resumed.changes()) >= 10, "the rest")
    seen = defaultdict(list)
    for event in [*first.changes()[:6], *resumed.changes()]:
        seen[event.data["namespace"]].append(event.data["version"])
    assert all(versions == [2, 3, 4, 5] for versions in seen.values()), dict(seen)


def test_the_amp_bridge(broker: Broker, admin: httpx.Client) -> None:
    headers = {"X-AMP-Agent-ID": "agent-1"}
    created = admin.post("/amp/memories", headers=headers, json={
        "type": "semantic", "content": {"text": "the user prefers green tea"},
        "identity": {"owner_id": "u-topo", "owner_type": "user"}})
    assert created.status_code == 201, created.text
    cell = created.json()
    assert admin.get(f"/amp/memories/{cell['id']}", headers=headers).status_code == 200
    deadline = time.monotonic() + WAIT
    while True:
        found = admin.post("/amp/memories/search", headers=headers, json={"query": "green"})
        if cell["id"] in [h["cell"]["id"] for h in found.json()["results"]]:
            break
        assert time.monotonic() < deadline, found.text
        time.sleep(0.05)
    later = "2099-01-01T00:00:00.000Z"
    run = admin.post("/amp/lifecycle/run", json={"as_of": later}).json()["transitions"]
    assert run["stale"] >= 1
    imported = admin.post("/amp/import", headers=headers, json={"cells": [{
        "id": "01HQ3Z8X9Y0000000000000009", "type": "semantic",
        "content": {"text": "old"}, "identity": {"owner_id": "u-topo", "owner_type": "user"},
        "lifecycle": {"created_at": "2020-01-01T00:00:00Z", "status": "deleted",
                      "deleted_at": "2020-02-01T00:00:00Z"}}]})
    assert imported.json()["imported"] == 1, imported.text
    purged = admin.post("/amp/purge", json={"ids": ["01HQ3Z8X9Y0000000000000009"]})
    assert purged.json()["purged"] == ["01HQ3Z8X9Y0000000000000009"], purged.text


def test_fair_share(broker: Broker, admin: httpx.Client, ns: str,
                    streams: Callable[..., Stream]) -> None:
    """Rates, quotas, usage and stream caps, each one script in the namespace's slot, over
    namespaces on every shard."""
    for space in [f"{ns}-{i}" for i in range(6)]:
        config = {"limits": {"writes_per_second": 0.001, "write_burst": 3,
                             "reads_per_second": 0.001, "read_burst": 1, "max_keys": 2,
                             "max_bytes": 100, "max_streams": 1}}
        assert admin.put(f"/v1/namespaces/{space}/config", json=config).status_code == 200
        registered = admin.post("/v1/agents", json={"name": "fair", "namespace": space})
        token = registered.json()["credentials"]["api_key"]
        with broker.client(token) as agent:
            assert put(agent, space, "a", 1).status_code == 201
            assert put(agent, space, "b", 2).status_code == 201
            over = put(agent, space, "c", 3)
            assert over.status_code == 429
            assert over.json()["error"]["details"]["limit"] == "max_keys"
            limited = put(agent, space, "c", 3)
            assert limited.status_code == 429 and "retry-after" in limited.headers
            assert agent.get(f"/v1/namespaces/{space}/memory/a").status_code == 200
            assert agent.get(f"/v1/namespaces/{space}/memory/a").status_code == 429
            streams(broker.url, [f"{space}:*"], token=token)
            refused = agent.get("/v1/subscribe", params={"sub": f"{space}:*"})
            assert refused.status_code == 429
        assert admin.delete(f"/v1/namespaces/{space}/memory/a").status_code == 200
        assert put(admin, space, "d", 4).status_code == 201  # a delete frees its key at once
        usage = admin.get(f"/v1/namespaces/{space}/usage").json()["usage"]
        assert usage == {"keys": 2, "bytes": 2, "streams": 1, "proposals": 0,
                         "proposal_bytes": 0}


def test_governance_proposals_and_the_audit_log(admin: httpx.Client, ns: str) -> None:
    """Proposals, approvals (entries and AMP cells) and audit records across shards: every
    script touches only its namespace's slot."""
    spaces = [f"{ns}-g{i}" for i in range(6)]
    for space in spaces:
        admin.put(f"/v1/namespaces/{space}/config", json={
            "rules": [{"pattern": "facts/*", "approval": "required"}],
            "allow_self_approval": True})
        proposed = put(admin, space, "facts/a", {"n": 1})
        assert proposed.status_code == 202, proposed.text
        assert admin.get(f"/v1/namespaces/{space}/memory/facts/a").status_code == 404
        approve = f"/v1/namespaces/{space}/proposals/{proposed.json()['id']}/approve"
        assert admin.post(approve).status_code == 200
        assert admin.post(approve).status_code == 409
        assert put(admin, space, "other", 1).status_code == 201
        verdict = admin.get(f"/v1/namespaces/{space}/audit/verify").json()
        assert verdict["ok"] is True and verdict["records"] == 5  # config, propose, put,
        # approve, put
    admin.put("/v1/namespaces/cells/config", json={
        "rules": [{"pattern": "cells/user/u-gov/*", "approval": "required"}],
        "allow_self_approval": True})
    proposed = admin.post("/amp/memories", headers={"X-AMP-Agent-ID": "agent-1"}, json={
        "type": "semantic", "content": {"text": "the user prefers rooibos"},
        "identity": {"owner_id": "u-gov", "owner_type": "user"}})
    assert proposed.status_code == 202, proposed.text
    approved = admin.post(f"/v1/namespaces/cells/proposals/{proposed.json()['id']}/approve")
    assert approved.status_code == 200, approved.text
    cell_id = proposed.json()["value"]["id"]
    assert admin.get(f"/amp/memories/{cell_id}",
                     headers={"X-AMP-Agent-ID": "agent-1"}).status_code == 200
    assert admin.get("/v1/namespaces/cells/audit/verify").json()["ok"] is True


def test_a_revocation_reaches_a_stream_on_another_process(
        topology: Topology, broker_processes: Callable[..., list[BrokerProcess]],
        streams: Callable[..., Stream], ns: str) -> None:
    first, second = broker_processes(2, MEMP_REDIS_URL=topology.url)
    with httpx.Client(base_url=first.url, timeout=10,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        key = admin.post("/v1/keys", json={"grants": [
            {"namespace": ns, "permissions": ["read", "subscribe"]}]}).json()
        stream = streams(second.url, [f"{ns}:*"], token=key["api_key"])
        started = time.monotonic()
        assert admin.delete(f"/v1/keys/{key['key']['id']}").status_code == 204
    event = stream.wait_event(lambda e: e.event == "revoked", "the revoked event", timeout=5)
    assert time.monotonic() - started < 2.5
    assert event.data["reason"] == "the API key was revoked"


def test_serve_workers_auto_runs_a_worker_per_core(
        topology: Topology, serve_processes: ServeProcesses, ns: str) -> None:
    broker = serve_processes.start(1, {"MEMP_REDIS_URL": topology.url}, ("--workers", "auto"),
                                   timeout=120)[0]
    check_workers_auto(broker, ns)


# ---- writes beside entries wait for a replica ----


def _replicas(topology: Topology) -> list[RedisProcess]:
    if isinstance(topology, RedisCluster):
        return [topology.process(n.port) for n in topology.nodes() if not n.primary]
    return [p for p in topology.data if p is not topology.primary]


@contextlib.contextmanager
def _paused(replicas: list[RedisProcess]) -> Iterator[None]:
    """Replicas that apply nothing of their primary's stream, so they confirm nothing
    (CLIENT PAUSE WRITE; ALL would refuse the UNPAUSE too), until the block ends."""
    for replica in replicas:
        with replica.client() as client:
            client.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        yield
    finally:
        for replica in replicas:
            with replica.client() as client:
                client.execute_command("CLIENT", "UNPAUSE")


def test_configuration_schemas_and_keys_wait_for_a_replica(topology: Topology, ns: str
                                                           ) -> None:
    """With `MEMP_WRITE_REPLICAS=1` a configuration, schema or API key write is acknowledged
    once a replica has it; while the replicas confirm nothing it is applied and answered 503
    saying so, within the timeout, and a revocation takes effect at once all the same. (The
    keys' grants reach no namespace holding data, so no audit record, which waits for
    replicas itself, follows their writes.)"""
    timeout_ms = 300
    # A socket timeout well past the WAIT's, so that a slow machine does not turn "applied,
    # not confirmed" into "store unavailable" (what this test checks is the WAIT).
    waiting = start_broker("redis", topology.url, write_replicas=1,
                           write_replicas_timeout_ms=timeout_ms, redis_timeout_seconds=10.0)
    grants = {"grants": [{"namespace": f"{ns}-k*", "permissions": ["read"]}]}
    replicas = _replicas(topology)
    try:
        with waiting.client() as admin:
            assert admin.put(f"/v1/namespaces/{ns}/config", json={
                "default_ttl_seconds": 60}).status_code == 200
            assert admin.put(f"/v1/namespaces/{ns}/schemas/s", json={
                "pattern": "*", "schema": {}}).status_code == 201
            doomed = admin.post("/v1/keys", json=grants).json()
            assert admin.get(f"/v1/namespaces/{ns}-k/memory/k",
                             headers={"Authorization": f"Bearer {doomed['api_key']}"}
                             ).status_code == 404
            with _paused(replicas):
                for call in (
                        lambda: admin.put(f"/v1/namespaces/{ns}/config", json={}),
                        lambda: admin.delete(f"/v1/namespaces/{ns}/schemas/s"),
                        lambda: admin.post("/v1/keys", json=grants),
                        lambda: admin.delete(f"/v1/keys/{doomed['key']['id']}")):
                    started = time.monotonic()
                    reply = call()
                    assert reply.status_code == 503, reply.text
                    assert reply.json()["error"]["details"]["applied"] is True
                    assert time.monotonic() - started < timeout_ms / 1000 + 10.0  # no hang
                assert admin.get(f"/v1/namespaces/{ns}-k/memory/k", headers={
                    "Authorization": f"Bearer {doomed['api_key']}"}).status_code == 401
                assert admin.get(f"/v1/namespaces/{ns}/config").json()["revision"] == 2
            deadline = time.monotonic() + WAIT
            while (reply := admin.put(f"/v1/namespaces/{ns}/config", json={
                    "default_ttl_seconds": 5})).status_code != 200:
                assert time.monotonic() < deadline, reply.text
                time.sleep(0.1)
            assert admin.post("/v1/keys", json=grants).status_code == 201
    finally:
        waiting.stop()


# ---- a primary killed under load ----


APPLIED = 1503  # a 503 whose write the primary applied but too few replicas confirmed


class Load:
    """Writers through two broker processes, one key per writer per namespace, each write's
    outcome recorded with its time: (status, monotonic time, namespace, key, value); a 503
    for a write that was applied but not confirmed by replicas is recorded as APPLIED. The
    time each write was sent is in `sent`, by (namespace, key, value)."""

    def __init__(self, urls: list[str], spaces: list[str], writers: int = 6) -> None:
        self.urls, self.spaces = urls, spaces
        self.outcomes: list[tuple[int, float, str, str, int]] = []
        self.sent: dict[tuple[str, str, int], float] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._write, args=(w,), daemon=True)
                        for w in range(writers)]

    def _write(self, writer: int) -> None:
        with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                space = self.spaces[n % len(self.spaces)]
                url = self.urls[(writer + n) % len(self.urls)]
                key = f"w{writer}"
                self.sent[(space, key, n)] = time.monotonic()
                try:
                    reply = http.put(f"{url}/v1/namespaces/{space}/memory/{key}",
                                     json={"value": n}, headers={"Idempotency-Key": f"{key}-{n}"})
                    status = reply.status_code
                    if status == 503 and reply.json()["error"]["details"].get("applied"):
                        status = APPLIED
                except httpx.HTTPError:
                    status = 0
                self.outcomes.append((status, time.monotonic(), space, key, n))
                time.sleep(0.01)

    def wait_for(self, space: str, after: float, statuses: tuple[int, ...],
                 timeout: float) -> None:
        """Wait until a write to `space` made after `after` (monotonic) got one of `statuses`
        (the assertions that follow say what failed, if none did in time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(
                s == space and t > after and status in statuses
                for status, t, s, *_ in list(self.outcomes)):
            time.sleep(0.05)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


class Readiness(threading.Thread):
    """Polls a broker's /readyz every 0.1 s while in use: (status, whether `degraded`)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.replies: list[tuple[int, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self.stop.wait(0.1):
                reply = client.get("/readyz")
                self.replies.append((reply.status_code, "degraded" in reply.json()))

    def __enter__(self) -> Readiness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(timeout=30)


def _kill_and_watch(topology: Topology, doomed_space: str) -> float:
    """SIGKILL the primary that serves `doomed_space`; the seconds until a replica took over."""
    if isinstance(topology, RedisCluster):
        topology.kill_primary(topology.slot_of("{" + doomed_space + "}"))
        return topology.wait_promoted()
    topology.kill_primary()
    return topology.wait_failover()


def test_a_killed_primary_loses_no_acknowledged_write_and_recovers_quickly(
        topology: Topology, broker_processes: Callable[..., list[BrokerProcess]],
        streams: Callable[..., Stream], ns: str) -> None:
    """Two brokers acknowledge a write only once a replica has it. The promoted replica has
    no replica of its own until the killed node comes back, so in between its shard's writes
    are applied but answered 503 saying so; the old node is then restarted, as an operator
    would, and writes are acknowledged again."""
    env = {"MEMP_REDIS_URL": topology.url, "MEMP_WRITE_REPLICAS": "1",
           "MEMP_WRITE_REPLICAS_TIMEOUT_MS": "500"}
    first, second = broker_processes(2, **env)
    spaces = [f"{ns}-f{i}" for i in range(6)]
    doomed = spaces[0]
    follower = streams(first.url, [f"{doomed}:*"])
    try:
        with Load([first.url, second.url], spaces) as load:
            time.sleep(1.5)  # writes acknowledged before the kill, to count afterwards
            killed_at = time.monotonic()
            with Readiness(first.url) as readiness:
                promoted_after = _kill_and_watch(topology, doomed)
            promoted_at = killed_at + promoted_after
            # Until the killed shard takes writes again, then a second more of load.
            load.wait_for(doomed, promoted_at, (200, 201, APPLIED), 10)
            time.sleep(1)
            topology.heal()  # the old primary rejoins as a replica
            healed_at = time.monotonic()
            load.wait_for(doomed, healed_at, (200, 201), 10)
        statuses = {status for status, *_ in load.outcomes}
        assert statuses <= {200, 201, 503, APPLIED}, statuses  # never a 500, never broken
        if isinstance(topology, RedisCluster):
            # A shard's failover stays on that shard (`cluster-require-full-coverage no`):
            # namespaces on the healthy shards took writes while the doomed one had no
            # primary, and were never refused as unreachable.
            doomed_port = topology.primary_for(topology.slot_of("{" + doomed + "}")).port
            healthy = {space for space in spaces if topology.primary_for(
                topology.slot_of("{" + space + "}")).port != doomed_port}
            assert healthy and all(any(
                space == s and killed_at < t < promoted_at and status in (200, 201)
                for status, t, s, *_ in load.outcomes) for space in healthy), healthy
            refused = [(s, t - killed_at) for status, t, s, *_ in load.outcomes
                       if s in healthy and status == 503]
            assert not refused, refused
            # ... and the broker stayed ready, saying which part was not, so a load balancer
            # checking /readyz kept it in rotation for the healthy shards.
            assert {status for status, _ in readiness.replies} == {200}, readiness.replies
            assert any(degraded for _, degraded in readiness.replies), readiness.replies
        served = [t for status, t, space, *_ in load.outcomes
                  if space == doomed and t > promoted_at and status in (200, 201, APPLIED)]
        assert served, "the killed shard took no write after the promotion"
        recovery = served[0] - promoted_at
        assert recovery < 5.0, f"{recovery:.1f} s after the promotion"
        acknowledged_again = [t for status, t, space, *_ in load.outcomes
                              if space == doomed and t > healed_at and status in (200, 201)]
        assert acknowledged_again, "no write was acknowledged once the replica was back"
        acknowledged = _check_acknowledged_writes_kept(load, second.url)
        _check_no_silent_gap(follower)
        print(f"{type(topology).__name__}: promoted {promoted_after:.1f} s after the kill, "
              f"writes recovered {recovery:.2f} s after the promotion, "
              f"{len(load.outcomes)} writes, {len(acknowledged)} keys")
    finally:
        topology.heal()


def _check_acknowledged_writes_kept(load: Load, url: str, sent_after: float = 0.0
                                    ) -> dict[tuple[str, str], int]:
    """Every write acknowledged (and sent after `sent_after`) is there: the last acknowledged
    value of each key, or a later one the broker applied though it answered 503 (it may have
    landed). The values checked, by (namespace, key)."""
    acknowledged: dict[tuple[str, str], int] = {}
    for status, _, space, key, value in load.outcomes:
        if status in (200, 201) and load.sent[(space, key, value)] > sent_after:
            acknowledged[(space, key)] = max(value, acknowledged.get((space, key), 0))
    with httpx.Client(base_url=url, timeout=10,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
        for (space, key), value in acknowledged.items():
            stored = http.get(f"/v1/namespaces/{space}/memory/{key}").json()["value"]
            assert stored >= value, (space, key, stored, value)
    return acknowledged


def _check_no_silent_gap(stream: Stream) -> None:
    """The stream saw its writes without a silent gap: per key the versions rise one by one,
    or a `reset` said changes were lost, or it ended with a cursor to resume from."""
    if any(e.event == "reset" for e in list(stream.events)):
        return
    versions: dict[str, list[int]] = defaultdict(list)
    for event in stream.changes():
        versions[event.data["key"]].append(event.data["version"])
    for key, seen in versions.items():
        assert seen == list(range(seen[0], seen[0] + len(seen))), (key, seen)


def _reset_or(key: str, version: int) -> Callable[[Event], bool]:
    """A stream event that is a `reset`, or `key`'s change to `version`."""
    return lambda e: e.event == "reset" or (isinstance(e.data, dict) and e.data.get("key") == key
                                            and e.data.get("version") == version)


def test_a_paused_sentinel_primary_takes_no_acknowledged_write_with_it(
        redis_sentinel: RedisSentinel, broker_processes: Callable[..., list[BrokerProcess]],
        streams: Callable[..., Stream], ns: str) -> None:
    """SIGSTOP the primary until Sentinel promotes its replica, then SIGCONT: the deposed node
    is a primary again until the sentinels demote it. Every broker process follows the
    sentinels' `+switch-master`, so no write goes to it: with `MEMP_WRITE_REPLICAS=0` (no
    replica's confirmation to stop it) every write sent after the pause and acknowledged is
    kept, writes are acknowledged again after the resume, a held-open stream shows no silent
    gap and one resumed from a cursor of before the pause replays every change or resets."""
    topology = redis_sentinel
    first, second = broker_processes(2, MEMP_REDIS_URL=topology.url, MEMP_WRITE_REPLICAS="0")
    spaces = [f"{ns}-p{i}" for i in range(2)]
    held = streams(first.url, [f"{spaces[0]}:*"]).wait_open()
    paused: RedisProcess | None = None
    try:
        with Load([first.url, second.url], spaces) as load:
            load.wait_for(spaces[0], time.monotonic(), (200, 201), WAIT)
            held.wait_changes(1)
            cursor = held.changes()[-1].id
            paused_at = time.monotonic()
            paused = topology.pause_primary()
            topology.wait_failover()
            topology.resume(paused)
            paused = None
            resumed_at = time.monotonic()
            load.wait_for(spaces[0], resumed_at, (200, 201), WAIT)
        statuses = {status for status, *_ in load.outcomes}
        assert statuses <= {200, 201, 503}, statuses  # never a 500, never broken
        assert any(t > resumed_at and status in (200, 201)
                   for status, t, *_ in load.outcomes), "nothing acknowledged after the resume"
        kept = _check_acknowledged_writes_kept(load, second.url, sent_after=paused_at)
        assert kept, "no write sent after the pause was acknowledged"
        _check_no_silent_gap(held)
        assert cursor is not None
        resumed = streams(second.url, [f"{spaces[0]}:*"], last_event_id=cursor)
        with httpx.Client(base_url=second.url, timeout=10,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as http:
            for key in {key for _, _, space, key, _ in load.outcomes if space == spaces[0]}:
                version = http.get(f"/v1/namespaces/{spaces[0]}/memory/{key}").json()["version"]
                resumed.wait_event(_reset_or(key, version), f"{key} v{version} or a reset")
        _check_no_silent_gap(resumed)
    finally:
        if paused is not None and paused.process is not None:
            paused.process.send_signal(signal.SIGCONT)
        topology.heal()


@pytest.fixture
def fresh_sentinel(tmp_path: Path) -> Iterator[RedisSentinel]:
    """A Sentinel group of its own: the session's has been failed over and paused by the tests
    before, and sentinels that remember those failovers may answer a forced one slowly."""
    with RedisSentinel(tmp_path, credentials=Credentials(), quick_discovery=True) as sentinel:
        yield sentinel


def test_every_client_follows_the_sentinels_announcement_without_a_command(
        fresh_sentinel: RedisSentinel, ns: str) -> None:
    """A failover the sentinels announce (`SENTINEL FAILOVER`, `+switch-master`) moves every
    client of the process at once: its pooled connections to the old primary are closed before
    any command could use them, a write sent across the move answers 503 rather than being
    acknowledged, and the next write goes to the new primary."""
    topology = fresh_sentinel

    async def main() -> None:
        backend = Backend.open(topology.url, 2.0, replicas=1)
        follower = asyncio.create_task(backend.follow_failovers())
        script = AsyncScript(backend.redis, "return redis.call('INCR', KEYS[1])")
        pool: Any = backend.redis.connection_pool
        key = f"memp:{{{ns}}}:count"
        try:
            # On the replica too, so that the promoted one has it.
            assert await backend.call(script, [key], [], durable=True) == 1
            old = pool.master_address
            idle = list(pool._available_connections)
            assert idle and all(c.is_connected for c in idle)
            with topology.sentinels[0].client() as sentinel:
                sentinel.execute_command("SENTINEL", "FAILOVER", topology.service_name)
            deadline = time.monotonic() + WAIT
            # The sentinels' part first, so that a slow election is told apart from a broker
            # that did not follow: then the pool moves within seconds, no command sent meanwhile.
            while all(port in (old[1], None) for port in topology.reported_primaries()):
                assert time.monotonic() < deadline, "the sentinels did not fail over"
                await asyncio.sleep(0.05)
            announced = time.monotonic()
            while pool.master_address == old:
                assert time.monotonic() < announced + 5, "the pool did not follow the sentinels"
                await asyncio.sleep(0.05)
            assert not any(c.is_connected for c in idle)
            while True:  # the promoted replica may need a moment to take writes
                try:
                    count = await backend.call(script, [key], [])
                    break
                except STORE_DOWN:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
            assert count in (2, 3)  # 3: one refused as unconfirmed across the move had run
            connection = await pool.get_connection()
            try:
                assert (connection.host, connection.port) == pool.master_address != old
            finally:
                await pool.release(connection)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await backend.close()
        return None

    topology.wait_ready()  # replicas in sync and known, so the sentinels may promote one
    deposed = topology.primary.port
    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        def moved() -> bool:
            ports = set(topology.reported_primaries())
            return len(ports) == 1 and None not in ports and deposed not in ports
        wait_until(moved, "every sentinel naming the new primary", WAIT)
        heir = set(topology.reported_primaries())
        topology.primary = next(p for p in topology.data if p.port in heir)
        topology.wait_ready()


QUIET_LOOPS = {"amp_post_interval_seconds": 3600, "amp_embed_interval_seconds": 3600,
               "sweep_interval_seconds": 3600, "amp_lifecycle_interval_seconds": 3600}


def test_a_write_in_flight_across_a_sentinel_failover_is_sent_again_to_the_new_primary(
        fresh_sentinel: RedisSentinel, ns: str, caplog: pytest.LogCaptureFixture) -> None:
    """A put with a message id sent to a primary that then stops (SIGSTOP) until the sentinels
    promote its replica: the broker follows the announcement while the write is in flight, and
    once the deposed node answers (or drops the connection as the sentinels demote it) sends
    the write once more, to the new primary, where it is applied once and answered `201`.
    `MEMP_WRITE_REPLICAS=0`: the new primary has no replica until the old one resyncs, and
    this test is about the second sending, not about replicas' confirmations."""
    topology = fresh_sentinel
    topology.wait_ready()
    # Redis's answer may take the whole failover: no timeout may end the write first.
    # The background loops look at the store at start and then stay out of the way, so that
    # the put is what is in flight on the paused primary.
    broker = start_broker("redis", topology.url, write_replicas=0, redis_timeout_seconds=60,
                          **QUIET_LOOPS)
    pool: Any = broker.app.state.services.storage.backend.redis.connection_pool
    replies: list[httpx.Response] = []
    paused: RedisProcess | None = None
    try:
        with httpx.Client(base_url=broker.url, headers=broker.admin_headers,
                          timeout=90) as client:
            assert put(client, ns, "warm", 0).status_code == 201  # caches and pool warm
            time.sleep(IDLE_SECONDS + 0.5)  # the idle loops' last look before their long wait
            assert put(client, ns, "warm", 1).status_code == 200
            epoch = pool.epoch
            caplog.set_level(logging.INFO, logger="memp.store")
            paused = topology.pause_primary()
            writer = threading.Thread(target=lambda: replies.append(client.put(
                f"/v1/namespaces/{ns}/memory/k", json={"value": "v"},
                headers={"Idempotency-Key": "m-1"})))
            writer.start()
            topology.wait_failover()
            wait_until(lambda: pool.epoch > epoch, "the broker following the failover", WAIT)
            paused.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            paused = None
            writer.join(timeout=WAIT)
            assert len(replies) == 1, "the write did not finish"
            assert replies[0].status_code == 201, replies[0].text
            assert replies[0].json()["version"] == 1
            # It was in flight across the move, and sent again.
            assert any("under a replayable write" in r.getMessage() for r in caplog.records)
            topology.wait_ready()  # the deposed node resynced: only the new history is left
            with topology.primary.client() as data:
                log = data.xrange(layout.changelog(ns))
            assert [f["ver"] for _, f in log if f.get("key") == "k"] == ["1"]  # applied once
            again = client.put(f"/v1/namespaces/{ns}/memory/k", json={"value": "v"},
                               headers={"Idempotency-Key": "m-1"})
            assert (again.status_code, again.json()) == (201, replies[0].json())
    finally:
        if paused is not None and paused.process is not None:
            paused.process.send_signal(signal.SIGCONT)
        broker.stop()


def test_a_topology_reset_under_load_closes_no_connection_into_a_500(
        redis_cluster: RedisCluster, ns: str) -> None:
    """Every node's connections closed while script calls use them (what redis-py before
    8.2 did to every shard when a topology refresh failed during another shard's failover):
    each call either answers or fails as the store being unreachable (a 503), never with
    the closed transport's own error (a 500), and the shard answers again at once."""
    async def main() -> tuple[int, int]:
        backend = Backend.open(redis_cluster.url, 2.0)
        await backend.ping()
        script = AsyncScript(backend.redis, "return redis.call('INCR', KEYS[1])")
        cluster: Any = backend.redis
        key = f"memp:{{{ns}}}:count"
        done = asyncio.Event()
        answered = refused = 0

        async def writer() -> None:
            nonlocal answered, refused
            while not done.is_set():
                try:
                    await backend.call(script, [key], [], durable=True)
                    answered += 1
                except STORE_DOWN:
                    refused += 1
                await asyncio.sleep(0)

        async def reset() -> None:
            for _ in range(30):
                await asyncio.sleep(0.01)
                nodes = cluster.nodes_manager.nodes_cache.values()
                await asyncio.gather(*(node.disconnect() for node in nodes))
            done.set()

        try:
            await asyncio.gather(reset(), *(writer() for _ in range(16)))
            # Each answered call ran; each refused one may or may not have.
            count = await backend.call(script, [key], [])
            assert answered + 1 <= count <= answered + refused + 1, (count, answered, refused)
        finally:
            await backend.close()
        return answered, refused

    answered, refused = asyncio.run(asyncio.wait_for(main(), 60))
    assert answered and refused, (answered, refused)  # the resets did cut calls short


# ---- TLS to Redis ----


def test_the_broker_speaks_tls_to_redis_and_refuses_an_unverified_server(
        tls_redis: TlsRedis) -> None:
    trusted = start_broker("redis", tls_redis.url_with_ca)
    try:
        with trusted.client() as admin:
            assert admin.get("/readyz").status_code == 200
            assert put(admin, "tls-ns", "k", {"over": "tls"}).status_code == 201
            assert admin.get("/v1/namespaces/tls-ns/memory/k").json()["value"] == {"over": "tls"}
    finally:
        trusted.stop()
    untrusted = start_broker("redis", tls_redis.url)  # the system CAs do not know this one
    try:
        with untrusted.client() as admin:
            assert admin.get("/readyz").status_code == 503
            assert put(admin, "tls-ns", "k", 2).status_code == 503
    finally:
        untrusted.stop()


@pytest.mark.parametrize("topology", ["tls_cluster", "tls_sentinel"])
def test_the_broker_speaks_tls_to_a_cluster_and_to_sentinels(
        topology: str, request: pytest.FixtureRequest) -> None:
    """`redis+cluster+tls://` and `redis+sentinel+tls://` with `ssl_ca_certs`: every node (and
    every sentinel) speaks only TLS, with a certificate from a CA made for the run."""
    group: RedisCluster | RedisSentinel = request.getfixturevalue(topology)
    trusted = start_broker("redis", group.url_with_ca)
    try:
        with trusted.client() as admin:
            assert admin.get("/readyz").json()["store"] == topology.removeprefix("tls_")
            spaces = [f"tls-{topology.replace('_', '-')}-{n}" for n in range(8)]  # 3 shards
            for space in spaces:
                assert put(admin, space, "k", {"over": "tls"}).status_code == 201
            for space in spaces:
                assert admin.get(f"/v1/namespaces/{space}/memory/k").json()["value"] == {
                    "over": "tls"}
    finally:
        trusted.stop()
    untrusted = start_broker("redis", group.url)  # the system CAs do not know this one
    try:
        with untrusted.client() as admin:
            assert admin.get("/readyz").status_code == 503
            assert put(admin, "tls-untrusted", "k", 2).status_code == 503
    finally:
        untrusted.stop()
