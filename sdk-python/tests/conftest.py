"""SDK test fixtures: the repository's real redis-server and brokers (tests/conftest.py), plus
brokers in their own processes on a chosen port (to restart one under a live subscription)."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The SDK tests run from the repository root and share its fixtures; make `tests` importable
# however pytest was started (`pytest sdk-python/tests` puts only this folder on sys.path).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memp import MEMP, AsyncMEMP, Event, Subscription  # noqa: E402
from tests import conftest as shared  # noqa: E402
from tests.support.brokers import ADMIN_KEY, Broker, free_port, start_broker, wait_for_port  # noqa: E402

# The repository's fixtures, shared rather than copied.
redis_server = shared.redis_server
redis_url = shared.redis_url
broker_factory = shared.broker_factory
ns = shared.ns
certificate_authority = shared.certificate_authority
https_broker = shared.https_broker

WAIT = 15.0  # seconds any single expectation may take before the test fails


@pytest.fixture(scope="session")
def server(redis_url: str) -> Iterator[Broker]:
    """One broker on the real Redis for the SDK tests; they isolate themselves by namespace."""
    handle = start_broker("redis", redis_url)
    yield handle
    handle.stop()


@pytest.fixture
def client(server: Broker, ns: str) -> Iterator[MEMP]:
    """An admin client on a fresh namespace."""
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=server.url) as memp:
        yield memp


@pytest.fixture
def aclient_factory(server: Broker, ns: str) -> Callable[..., AsyncMEMP]:
    """Async clients are made inside the test's event loop."""

    def make(**options: Any) -> AsyncMEMP:
        return AsyncMEMP(**{"api_key": ADMIN_KEY, "namespace": ns, "base_url": server.url,
                            **options})

    return make


@dataclass
class ServeProcess:
    """`memp-broker serve` in its own process, on a port the test chose."""

    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=WAIT)
                raise


@pytest.fixture
def serve(redis_url: str) -> Iterator[Callable[..., ServeProcess]]:
    """Start broker processes on the test Redis (on `port`, or a free one); stopped after."""
    started: list[ServeProcess] = []

    def start(port: int | None = None, **env: str) -> ServeProcess:
        port = port or free_port()
        environment = {**os.environ, "MEMP_REDIS_URL": redis_url, "MEMP_ADMIN_KEY": ADMIN_KEY,
                       "MEMP_PORT": str(port), **env}
        process = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "serve", "--log-level", "warning"],
            env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        handle = ServeProcess(port, process)
        started.append(handle)
        wait_for_port(port, timeout=20)
        return handle

    yield start
    for handle in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            handle.stop()


class Collector:
    """Reads a sync subscription on a thread so every wait on it has a deadline."""

    def __init__(self, subscription: Subscription) -> None:
        self.source = subscription
        self.queue: queue.Queue[Event | BaseException] = queue.Queue()
        self.received: list[Event] = []
        self.opened = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.opened.wait(WAIT) and self.queue.empty():
            pytest.fail(f"the subscription did not open within {WAIT}s")

    def _run(self) -> None:
        try:
            self.source.open()
            self.opened.set()
            for event in self.source:
                self.queue.put(event)
        except BaseException as exc:  # handed to the test
            self.queue.put(exc)
            self.opened.set()

    def take(self, count: int, timeout: float = WAIT) -> list[Event]:
        """The next `count` events; fails if they do not all come within `timeout` each."""
        taken = []
        for _ in range(count):
            try:
                item = self.queue.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"waited {timeout}s for event {len(taken) + 1} of {count}; "
                            f"got {[(e.type, e.key, e.version) for e in taken]}")
            if isinstance(item, BaseException):
                raise item
            taken.append(item)
        self.received += taken
        return taken

    def close(self) -> None:
        self.source.close()
        self.thread.join(timeout=WAIT)
        assert not self.thread.is_alive(), "the subscription did not end after close()"


@pytest.fixture
def collect() -> Iterator[Callable[[Subscription], Collector]]:
    """Read subscriptions on threads, once open; closed (and checked to end) after the test."""
    collectors: list[Collector] = []

    def start(subscription: Subscription) -> Collector:
        collector = Collector(subscription)
        collectors.append(collector)
        return collector

    yield start
    for collector in collectors:
        collector.close()
