"""The Redis topologies of tests/support/topologies.py: each comes up, requires its ACL user, and
recovers as the failure helpers say (a killed cluster primary is replaced by its replica, the
sentinels fail over, TLS Redis speaks only TLS)."""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis
from redis.cluster import ClusterNode as PyClusterNode
from redis.cluster import RedisCluster as PyRedisCluster
from redis.sentinel import Sentinel

from broker.storage.urls import parse
from tests.support.brokers import ADMIN_KEY, BrokerProcess, worker_database
from tests.support.topologies import (
    Credentials,
    RedisCluster,
    RedisSentinel,
    RedisSingle,
    TlsRedis,
)

pytestmark = pytest.mark.topology

# Generous against a busy 2-core machine; failovers take 2-3 s here.
FAILOVER_BOUND = 20.0


def cluster_client(cluster: RedisCluster) -> PyRedisCluster:
    """A cluster client built only from the topology's URL, as the broker reads it."""
    target = parse(cluster.url)
    seeds = [PyClusterNode(host, port) for host, port in target.hosts]
    return PyRedisCluster(startup_nodes=seeds, decode_responses=True,
                          username=target.username, password=target.password)


def test_urls_have_the_documented_forms(redis_cluster: RedisCluster,
                                        redis_sentinel: RedisSentinel,
                                        tls_redis: TlsRedis) -> None:
    pair = r"127\.0\.0\.1:\d+"
    userinfo = r"memp:[0-9a-f]{32}@"
    assert re.fullmatch(rf"redis\+cluster://{userinfo}{pair}(,{pair}){{5}}", redis_cluster.url)
    assert re.fullmatch(
        rf"redis\+sentinel://{userinfo}{pair}(,{pair}){{2}}/memp",
        redis_sentinel.url)
    assert re.fullmatch(rf"rediss://{userinfo}{pair}/0", tls_redis.url)
    assert tls_redis.ca_file.read_text().startswith("-----BEGIN CERTIFICATE-----")


@pytest.mark.parametrize("password", ["", "has space", "p@ss", "p:w", "new\nline"])
def test_credentials_refuse_characters_configs_and_urls_would_escape(password: str) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        Credentials("memp", password)


def test_cluster_is_ok_on_every_node(redis_cluster: RedisCluster) -> None:
    for process in redis_cluster.processes:
        with process.client() as client:
            assert "cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
    nodes = redis_cluster.nodes()
    primaries = [n for n in nodes if n.primary]
    assert len(primaries) == 3 and len(nodes) == 6
    assert sum(high - low + 1 for n in primaries for low, high in n.slots) == 16384
    with cluster_client(redis_cluster) as client:
        for i in range(30):  # keys on every primary
            client.set(f"topology:{i}", i)
        assert [client.get(f"topology:{i}") for i in range(30)] == [str(i) for i in range(30)]


def test_cluster_refuses_a_wrong_password_and_no_password(redis_cluster: RedisCluster) -> None:
    process = redis_cluster.processes[0]
    with pytest.raises(redis.AuthenticationError), \
            process.client(username="memp", password="wrong") as client:
        client.ping()
    with pytest.raises(redis.AuthenticationError), \
            process.client(username=None, password=None) as client:
        client.ping()


def test_a_killed_cluster_primary_is_replaced_by_its_replica(
        redis_cluster: RedisCluster) -> None:
    with cluster_client(redis_cluster) as client:
        client.set("failover:key", "kept")
        slot = redis_cluster.slot_of("failover:key")
        primary = redis_cluster.primary_for(slot)
        with primary.client() as direct:
            assert direct.execute_command("WAIT", 1, 2000) == 1  # the replica has it
        try:
            killed = redis_cluster.kill_primary(slot)
            assert killed is primary and not killed.running
            seconds = redis_cluster.wait_promoted()
            assert 0 < seconds < FAILOVER_BOUND
            heir = redis_cluster.primary_for(slot)
            assert heir is not killed
            with heir.client() as direct:
                assert direct.get("failover:key") == "kept"
            redis_cluster.restart(killed)
            assert killed.info("replication")["role"] == "slave"
        finally:
            redis_cluster.heal()
    assert redis_cluster.healthy()


def test_sentinels_fail_over_and_take_the_old_primary_back(
        redis_sentinel: RedisSentinel) -> None:
    target = parse(redis_sentinel.url)
    assert target.service == "memp" and target.sentinel_username == target.username
    watcher = Sentinel(list(target.hosts), decode_responses=True,
                       sentinel_kwargs={"username": target.sentinel_username,
                                        "password": target.sentinel_password},
                       username=target.username, password=target.password)
    old = redis_sentinel.primary
    with watcher.master_for("memp") as client:
        client.set("failover:key", "kept")
        assert client.execute_command("WAIT", 1, 2000) == 1
    try:
        assert redis_sentinel.kill_primary() is old
        seconds = redis_sentinel.wait_failover()
        assert 0 < seconds < FAILOVER_BOUND
        assert redis_sentinel.primary is not old
        assert watcher.discover_master("memp") == ("127.0.0.1", redis_sentinel.primary.port)
        with watcher.master_for("memp") as client:
            assert client.get("failover:key") == "kept"
        redis_sentinel.restart_old_primary()
        assert old.info("replication")["role"] == "slave"
        assert [port for _, port in watcher.discover_slaves("memp")] == [old.port]
    finally:
        redis_sentinel.heal()
        for sentinel in watcher.sentinels:
            sentinel.close()


def test_sentinels_and_data_nodes_require_their_credentials(
        redis_sentinel: RedisSentinel) -> None:
    for process in (redis_sentinel.sentinels[0], redis_sentinel.primary):
        with pytest.raises(redis.AuthenticationError), \
                process.client(username="memp", password="wrong") as client:
            client.ping()
        with pytest.raises(redis.AuthenticationError), \
                process.client(username=None, password=None) as client:
            client.ping()


def test_tls_redis_speaks_only_tls_and_checks_the_user(tls_redis: TlsRedis) -> None:
    with redis.Redis.from_url(tls_redis.url_with_ca) as client:
        assert client.ping()
    server = tls_redis.server
    with pytest.raises(redis.ConnectionError), server.client(ssl=False) as client:
        client.ping()  # plain TCP on the TLS port
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"), \
            server.client(ssl_ca_certs=None, ssl_cert_reqs=ssl.CERT_REQUIRED) as client:
        client.ping()  # a CA that did not sign the server's certificate
    with pytest.raises(redis.AuthenticationError), server.client(password="wrong") as client:
        client.ping()


@pytest.mark.parametrize("topology", ["redis_cluster", "redis_sentinel", "tls_redis"])
def test_a_broker_works_on_each_topology_url(
        topology: str, request: pytest.FixtureRequest,
        broker_process: Callable[..., BrokerProcess]) -> None:
    redis_topology = request.getfixturevalue(topology)
    url = redis_topology.url_with_ca if isinstance(redis_topology, TlsRedis) \
        else redis_topology.url
    broker = broker_process(MEMP_REDIS_URL=url)
    with httpx.Client(base_url=broker.url, timeout=10,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        deadline = time.monotonic() + 10
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.05)
        path = f"/v1/namespaces/topology-{topology.replace('_', '-')}/memory/k"
        assert client.put(path, json={"value": 1}).status_code in (200, 201)
        assert client.get(path).json()["value"] == 1


def test_an_acl_protected_redis_replays_its_transactions_after_a_kill(tmp_path: Path) -> None:
    """Redis 7.0 replays MULTI/EXEC from the append-only file with the `default` user's
    permissions: with a bare `user default off`, a restart silently dropped every script's
    writes, so Credentials keeps them on the (disabled) `default` user."""
    with RedisSingle(tmp_path, credentials=Credentials(), appendonly=True) as single:
        server = single.server
        with server.client() as client:
            # `everysec` may put off the file write past the reply while an fsync is running
            # (a busy disk): `always` writes before replying, so the kill loses nothing.
            client.config_set("appendfsync", "always")
            client.eval("redis.call('hset', KEYS[1], 'f', 'v'); redis.call('xadd', KEYS[2], "
                        "'*', 'k', 'v')", 2, "entry", "log")
            with client.pipeline(transaction=True) as multi:
                multi.zadd("index", {"a": 0}).lpush("history", "x").execute()
        server.kill()
        server.start()
        with server.client() as client:
            assert client.dbsize() == 4
            assert client.hget("entry", "f") == "v" and client.xlen("log") == 1
        assert "NOPERM" not in server.log.read_text()


def test_each_parallel_worker_gets_a_database_of_its_own() -> None:
    """Under pytest-xdist, MEMP_TEST_REDIS_URL's database plus the worker's number."""
    assert worker_database("redis://h:1/2", None) == "redis://h:1/2"
    assert worker_database("redis://h:1/2", "gw0") == "redis://h:1/2"
    assert worker_database("redis://h:1/2", "gw3") == "redis://h:1/5"
    assert worker_database("redis://u:p@h:1", "gw1") == "redis://u:p@h:1/1"
