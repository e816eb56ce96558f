"""Brokers and Redis for the tests: a redis-server on a free port, brokers in-process (uvicorn in
a thread) or as `memp-broker serve` processes, HTTPS brokers with a throwaway CA, and clients
that read the store directly."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import uvicorn

from broker.app import create_app
from broker.runtime.settings import Settings
from broker.storage import Storage

ADMIN_KEY = "test-admin-key-0123456789"


# The stores every contract test runs on: the embedded store and one redis-server by default.
# `MEMP_TEST_BACKENDS=embedded,redis,cluster,sentinel` adds brokers on the Redis Cluster and
# Sentinel topologies of tests/support/topologies.py (docs/tests.md, "Redis topologies").
BACKENDS = os.environ.get("MEMP_TEST_BACKENDS", "embedded,redis").split(",")


TOPOLOGY_BACKENDS = ("cluster", "sentinel")


def load_yaml(text: str) -> Any:
    """YAML text as `yaml.safe_load` reads it, with libyaml's loader (the tests read
    openapi.yaml often; tests/web/test_openapi.py also checks the served document against
    `yaml.safe_load`'s reading)."""
    from broker.web.reference import load_document

    return load_document(text)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on port {port}")


@dataclass
class RedisServer:
    """A redis-server process the tests own; can be stopped and restarted on the same port."""

    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (see .ci/run)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def flush(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        client.flushdb()
        client.close()


def worker_database(url: str, worker: str | None) -> str:
    """`url` for one pytest-xdist worker (`gw<N>`): its database number plus N, so parallel
    workers never flush or read each other's data in a Redis given by MEMP_TEST_REDIS_URL."""
    if not worker or not worker.startswith("gw"):
        return url
    parts = urlsplit(url)
    base = parts.path.strip("/")
    database = (int(base) if base.isdigit() else 0) + int(worker[2:])
    return urlunsplit(parts._replace(path=f"/{database}"))


@dataclass
class Broker:
    """A broker served by uvicorn in a thread, reachable over real HTTP."""

    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread
    backend: str
    admin_headers: dict[str, str] = field(
        default_factory=lambda: {"Authorization": f"Bearer {ADMIN_KEY}"})

    def client(self, token: str | None = ADMIN_KEY, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=15, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def backend_url(request: pytest.FixtureRequest, backend: str, redis_url: str) -> str:
    """The Redis URL of a backend: the topology's for cluster and sentinel, else the test
    Redis (unused by the embedded store)."""
    if backend in TOPOLOGY_BACKENDS:
        return str(request.getfixturevalue(f"redis_{backend}").url)
    return redis_url


def start_broker(backend: str, redis_url: str, **overrides: Any) -> Broker:
    """Start a broker on a free port with the given backend and settings overrides."""
    port = free_port()
    settings = Settings.from_env(
        environ={}, port=port, admin_key=ADMIN_KEY,
        redis_url=None if backend == "embedded" else redis_url, **overrides,
    )
    app = create_app(settings)
    server, thread = serve_in_thread(app, port)
    return Broker(f"http://127.0.0.1:{port}", app, server, thread, backend)


def serve_in_thread(app: Any, port: int, **config: Any
                    ) -> tuple[uvicorn.Server, threading.Thread]:
    """Serve `app` on 127.0.0.1:`port` from a daemon thread (uvicorn.Config `config` on top of
    the tests' defaults); return once it listens."""
    server = uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="on",
        timeout_graceful_shutdown=2, **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("broker did not start")
        time.sleep(0.01)
    return server, thread


@dataclass
class BrokerProcess:
    """A broker in its own OS process (`memp-broker serve`), for multi-process tests."""

    url: str
    port: int
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=15)


class ServeProcesses:
    """`memp-broker serve` processes on the test Redis, started together (each one spends
    seconds importing the broker, so they start in parallel) and stopped at the end."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.started: list[BrokerProcess] = []

    def start(self, count: int, env: dict[str, str], args: tuple[str, ...] = (),
              timeout: float = 60.0, module: str = "broker.cli") -> list[BrokerProcess]:
        """`args` go to `serve` (such as `--workers auto`), `env` to its environment;
        `module` is what runs it (`python -m module serve`)."""
        handles = []
        for _ in range(count):
            port = free_port()
            environment = {**os.environ, "MEMP_REDIS_URL": self.redis_url,
                           "MEMP_ADMIN_KEY": ADMIN_KEY, "MEMP_PORT": str(port), **env}
            process = subprocess.Popen(
                [sys.executable, "-m", module, "serve", "--log-level", "warning", *args],
                env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            handles.append(BrokerProcess(f"http://127.0.0.1:{port}", port, process))
            self.started.append(handles[-1])
        for handle in handles:
            wait_for_port(handle.port, timeout=timeout)  # a busy machine slows the imports
        return handles

    def stop(self) -> None:
        for handle in self.started:
            handle.stop()


@contextlib.asynccontextmanager
async def open_storage(url: str | None, **options: Any) -> AsyncIterator[Storage]:
    """The storage layer on `url` (None: an embedded server), closed afterwards."""
    settings: dict[str, Any] = {"timeout": 2.0, "history_limit": 4,
                                "changelog_maxlen": 100_000, "idempotency_window_ms": 60_000,
                                **options}
    storage = Storage.open(url, **settings)
    try:
        yield storage
    finally:
        await storage.close()


def read_changelog(client: Any, namespace: str) -> list[dict[str, str]]:
    """Every record of a namespace's change log, oldest first, with text fields."""
    from broker.storage import layout

    records = client.xrange(layout.changelog(namespace), "-", "+")
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in records]


class CertificateAuthority:
    """A CA of the test's own (trustme) and the certificate files a broker serves; `issue()`
    writes a new certificate for 127.0.0.1 over them, as a renewal does."""

    def __init__(self, directory: Path) -> None:
        import trustme

        from broker.runtime.tls import CertificateFiles

        self.ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.files = CertificateFiles(str(directory / "cert.pem"), str(directory / "key.pem"))
        self.serial = self.issue()

    def issue(self) -> int:
        """Write a new certificate, then its key (each file replaced at once, as certbot and
        Kubernetes do); returns the certificate's serial number."""
        from cryptography import x509

        leaf = self.ca.issue_cert("127.0.0.1", "localhost")
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        for path, content in ((self.files.cert, chain),
                              (self.files.key or "", leaf.private_key_pem.bytes())):
            Path(f"{path}.new").write_bytes(content)
            os.replace(f"{path}.new", path)
        self.serial = x509.load_pem_x509_certificate(chain).serial_number
        return self.serial

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)


@dataclass
class HTTPSBroker:
    """A broker serving HTTPS from certificate files, by uvicorn in a thread."""

    url: str
    port: int
    authority: CertificateAuthority
    server: uvicorn.Server
    thread: threading.Thread

    def client(self, token: str | None = ADMIN_KEY, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=15,
                            verify=self.authority.client_context(), **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def served_serial(port: int, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new TLS connection to the port is given."""
    from cryptography import x509

    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def data_client(app: Any) -> Any:
    """A synchronous client on a broker's own data, for tests that look at what it stored:
    its embedded server, its Redis, its Sentinel group's primary or its Cluster."""
    from broker.storage.urls import parse

    storage = app.state.services.storage
    if storage.embedded:
        import fakeredis

        pool = storage.backend.redis.connection_pool
        return fakeredis.FakeRedis(server=pool.connection_kwargs["server"])
    import redis

    target = parse(str(app.state.services.settings.redis_url))
    credentials: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.kind == "cluster":
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in target.hosts],
                            **credentials)
    if target.kind == "sentinel":
        from redis.sentinel import Sentinel

        sentinels = Sentinel(list(target.hosts), sentinel_kwargs=credentials, **credentials)
        return sentinels.master_for(target.service, db=target.db)
    return redis.Redis.from_url(target.url)


def check_workers_auto(broker: BrokerProcess, ns: str) -> None:
    """A `serve --workers auto` broker runs one worker process per usable core, and writes
    through it over many connections each land once and read back."""
    from broker.cli import usable_cores

    def workers() -> int:
        children = Path(f"/proc/{broker.process.pid}/task").glob("*/children")
        pids = " ".join(p.read_text() for p in children).split()
        return sum(b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids
                   if Path(f"/proc/{pid}/cmdline").exists())

    def poll(condition: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if condition():
                    return True
            time.sleep(0.1)
        return False

    assert poll(lambda: workers() == usable_cores(), 60), workers()
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    with httpx.Client(base_url=broker.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      timeout=30, limits=limits) as client:
        assert poll(lambda: client.get("/readyz").status_code == 200, 60)
        with ThreadPoolExecutor(16) as pool:
            puts = list(pool.map(lambda n: client.put(
                f"/v1/namespaces/{ns}/memory/k{n % 10}", json={"value": n},
                headers={"Idempotency-Key": f"{ns}-{n}"}).status_code, range(100)))
        assert sorted(puts) == [200] * 90 + [201] * 10, puts
        versions = [client.get(f"/v1/namespaces/{ns}/memory/k{n}").json()["version"]
                    for n in range(10)]
        assert versions == [10] * 10
