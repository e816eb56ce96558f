"""Shared fixtures: a real redis-server on a free port, real brokers over real HTTP, and the
Redis topologies of tests/support/topologies.py (cluster, sentinel, TLS) for tests marked
`topology`. The helpers behind them are in tests/support/ (tests/README.md).

Set MEMP_TEST_REDIS_URL to use an existing Redis instead (its database is flushed)."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.app import create_app
from broker.runtime.settings import Settings
from tests.support.brokers import (
    ADMIN_KEY,
    BACKENDS,
    Broker,
    BrokerProcess,
    CertificateAuthority,
    HTTPSBroker,
    RedisServer,
    ServeProcesses,
    backend_url,
    free_port,
    serve_in_thread,
    start_broker,
    worker_database,
)
from tests.support.relay import RelayProxy
from tests.support.streams import Stream
from tests.support.topologies import Credentials, RedisCluster, RedisSentinel, TlsRedis
from tests.support.trust import share_default_trust

share_default_trust()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | str]:
    """A redis-server on a free port (or the URL in MEMP_TEST_REDIS_URL: under pytest-xdist,
    one database per worker)."""
    external = os.environ.get("MEMP_TEST_REDIS_URL")
    if external:
        import redis

        external = worker_database(external, os.environ.get("PYTEST_XDIST_WORKER"))
        client = redis.Redis.from_url(external)
        client.flushdb()
        client.close()
        yield external
        return
    with tempfile.TemporaryDirectory() as workdir:
        server = RedisServer(free_port(), Path(workdir))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | str) -> str:
    return redis_server if isinstance(redis_server, str) else redis_server.url


@pytest.fixture(scope="session", params=BACKENDS)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Broker]:
    """One broker per backend for the session; tests isolate themselves by namespace."""
    handle = start_broker(request.param, backend_url(request, request.param, redis_url))
    yield handle
    handle.stop()


@pytest.fixture
def broker_factory(request: pytest.FixtureRequest, redis_url: str
                   ) -> Iterator[Callable[..., Broker]]:
    """Start extra brokers with custom settings; they are stopped after the test."""
    started: list[Broker] = []

    def factory(backend: str, **overrides: Any) -> Broker:
        handle = start_broker(backend, backend_url(request, backend, redis_url), **overrides)
        started.append(handle)
        return handle

    yield factory
    for handle in started:
        handle.stop()


@pytest.fixture
def ns() -> str:
    """A namespace no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def admin(broker: Broker) -> Iterator[httpx.Client]:
    with broker.client() as client:
        yield client


@pytest.fixture
def serve_processes(redis_url: str) -> Iterator[ServeProcesses]:
    processes = ServeProcesses(redis_url)
    yield processes
    processes.stop()


@pytest.fixture
def broker_process(serve_processes: ServeProcesses) -> Callable[..., BrokerProcess]:
    """Start a `memp-broker serve` process on the test Redis (`broker_process(*args, **env)`);
    stopped after the test."""
    return lambda *args, **env: serve_processes.start(1, env, args)[0]


@pytest.fixture
def broker_processes(serve_processes: ServeProcesses) -> Callable[..., list[BrokerProcess]]:
    """Start `count` `memp-broker serve` processes at once (`broker_processes(2, **env)`)."""
    return lambda count, **env: serve_processes.start(count, env)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that stop Redis or must not share it."""
    server = RedisServer(free_port(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def relay(private_redis: RedisServer) -> Iterator[RelayProxy]:
    """A relay to the test's own Redis (`relay.url`) that the test can cut or reset."""
    proxy = RelayProxy(private_redis.port)
    yield proxy
    proxy.close()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest) -> str | None:
    """Where a test's own store lives: a private Redis, or None for an embedded server."""
    if request.param == "embedded":
        return None
    server: RedisServer = request.getfixturevalue("private_redis")
    return server.url


# ---- HTTPS ----


@pytest.fixture
def certificate_authority(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path)


@pytest.fixture
def https_broker(certificate_authority: CertificateAuthority) -> Iterator[HTTPSBroker]:
    """A broker on the embedded store serving HTTPS with `certificate_authority`'s files."""
    port = free_port()
    app = create_app(Settings.from_env(environ={}, port=port, admin_key=ADMIN_KEY))
    server, thread = serve_in_thread(app, port,
                                     ssl_context_factory=certificate_authority.files)
    handle = HTTPSBroker(f"https://127.0.0.1:{port}", port, certificate_authority, server,
                         thread)
    yield handle
    handle.stop()


@pytest.fixture
def subscribe(broker_factory: Callable[..., Broker]) -> Iterator[Callable[..., Stream]]:
    """Open subscription streams; closed after the test (before any broker it started stops)."""
    streams: list[Stream] = []

    def open_stream(base_url: str, namespace: str | None = None, *patterns: str,
                    subs: Iterable[str] = (), snapshot: bool = False,
                    last_event_id: str | None = None, cursor_param: str | None = None,
                    token: str | None = ADMIN_KEY, query: Iterable[tuple[str, str]] = (),
                    **options: Any) -> Stream:
        params: list[tuple[str, str]] = [("sub", s) for s in subs]
        params += list(query)
        if namespace is not None:
            params.append(("namespace", namespace))
            params += [("pattern", p) for p in patterns]
        if snapshot:
            params.append(("snapshot", "1"))
        if cursor_param is not None:
            params.append(("last_event_id", cursor_param))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        stream = Stream(f"{base_url}/v1/subscribe", params, headers, **options)
        streams.append(stream)
        return stream

    yield open_stream
    for stream in streams:
        stream.close()


# Redis topologies, started once per session behind an ACL user (so every URL carries
# `user:password@`) and stopped by pid. A test that kills a node calls heal() before it ends.
TOPOLOGY_FIXTURES = frozenset({"redis_cluster", "redis_sentinel", "tls_redis", "tls_cluster",
                               "tls_sentinel"})


# The longest single tests (a minute or two each), run first so that no worker is left with
# one of them at the end while the others idle.
LONGEST_FIRST = ("tests/web/test_fuzz.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests using a topology are marked `topology`, so `-m topology` (or `-m 'not topology'`)
    selects them; the LONGEST_FIRST files' tests move to the front."""
    for item in items:
        if TOPOLOGY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.topology)
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in LONGEST_FIRST)


# Files whose tests share one pytest-xdist worker (./scripts/test): the topology files' tests,
# so that each topology starts once rather than once per worker (a test elsewhere that uses a
# topology still works, on a topology its worker starts for it), and the console's, which
# share one Chromium and one broker.
GROUPED_FILES = {"tests/storage/test_topologies.py": "topology",
                 "tests/storage/test_topology_brokers.py": "topology",
                 "tests/web/test_console.py": "console"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` with the GROUPED_FILES groups. (xdist's own `xdist_group` marks do
    not group under pytest 9: it renames items by a field pytest 9 no longer reads.) Groups go
    out first, the largest first (xdist's `--loadscope-reorder`), then single tests in
    collection order."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

    class FileGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            group = GROUPED_FILES.get(nodeid.split("::", 1)[0])
            return group if group is not None else str(super()._split_scope(nodeid))

    return FileGroupScheduling(config, log)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """Redis Cluster, 3 primaries + 3 replicas; `.url` is `redis+cluster://user:pw@h:p,...`."""
    with RedisCluster(tmp_path_factory.mktemp("cluster"), credentials=Credentials()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinel]:
    """1 primary, 1 replica, 3 sentinels (quorum 2); `.url` is
    `redis+sentinel://user:pw@h:p,h:p,h:p/memp`. The sentinels require the user too."""
    with RedisSentinel(tmp_path_factory.mktemp("sentinel"), credentials=Credentials(),
                       quick_discovery=True) as sentinel:
        yield sentinel


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """Redis over TLS only; `.url` is `rediss://user:pw@127.0.0.1:p/0`, `.ca_file` the CA."""
    with TlsRedis(tmp_path_factory.mktemp("tls"), credentials=Credentials()) as server:
        yield server


@pytest.fixture(scope="session")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """`redis_cluster` speaking only TLS, on the cluster bus and to replicas too;
    `.url_with_ca` is `redis+cluster+tls://user:pw@h:p,...?ssl_ca_certs=<the run's CA>`."""
    with RedisCluster(tmp_path_factory.mktemp("tls-cluster"), credentials=Credentials(),
                      tls=True) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tls_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinel]:
    """`redis_sentinel` speaking only TLS, the sentinels too; `.url_with_ca` is
    `redis+sentinel+tls://user:pw@h:p,.../memp?ssl_ca_certs=<the run's CA>`."""
    with RedisSentinel(tmp_path_factory.mktemp("tls-sentinel"), credentials=Credentials(),
                       quick_discovery=True, tls=True) as sentinel:
        yield sentinel


