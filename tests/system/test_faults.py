"""Faults under load, from outside: two `memp-broker serve` processes on one redis-server,
writers that retry every write with its message id on either process, and subscribers that
resume with Last-Event-ID on either process, while Redis is killed (with and without
persistence) or frozen, and while a broker is killed or stopped.

What must hold (docs/api.md, "Retries are safe"; docs/subscriptions.md): a write answered 2xx is
durable (when Redis persists), a write answered 503 or cut off is applied once or not at all
and its retry applies it exactly once, and every subscriber sees each version of each key
once, in order, with a `reset` where Redis lost its data."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.brokers import (
    ADMIN_KEY,
    BrokerProcess,
    RedisServer,
    ServeProcesses,
    free_port,
    wait_for_port,
)

WAIT = 20.0  # seconds any one expectation may take
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}
# A frozen Redis is noticed after 1 s (the change-log readers block for less than that).
BROKER_ENV = {"MEMP_REDIS_TIMEOUT_SECONDS": "1", "MEMP_READER_BLOCK_MS": "400"}


@dataclass
class Event:
    kind: str
    data: Any
    id: str | None
    via: str


class Subscriber(threading.Thread):
    """Follows a namespace, reconnecting after the stream ends or breaks, each time to the next
    broker in `urls` and with the last event id it saw, as the SDKs do."""

    def __init__(self, urls: list[str], ns: str) -> None:
        super().__init__(daemon=True)
        self.urls, self.ns = urls, ns
        self.events: list[Event] = []
        self.last_id: str | None = None
        self.opened = threading.Event()
        self.stopping = False

    def run(self) -> None:
        turn = 0
        while not self.stopping:
            url = self.urls[turn % len(self.urls)]
            turn += 1
            headers = {**HEADERS, **({"Last-Event-ID": self.last_id} if self.last_id else {})}
            try:
                with httpx.Client(timeout=httpx.Timeout(5, read=10)) as client, client.stream(
                        "GET", f"{url}/v1/subscribe", params={"namespace": self.ns, "pattern": "*"},
                        headers=headers) as response:
                    if response.status_code == 200:
                        self.opened.set()
                        self._read(response, url)
            except httpx.HTTPError:
                pass
            time.sleep(0.1)

    def _read(self, response: httpx.Response, url: str) -> None:
        kind, event_id = "", None
        data: list[str] = []
        for line in response.iter_lines():
            if self.stopping:
                return
            if line == "":
                if data:
                    self.events.append(Event(kind or "message", json.loads("\n".join(data)),
                                             event_id, url))
                    self.last_id = event_id or self.last_id
                kind, data, event_id = "", [], None
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    kind = value
                elif name == "data":
                    data.append(value)
                elif name == "id":
                    event_id = value

    def versions(self, key: str) -> list[int]:
        """The versions of `key` seen since the last reset."""
        seen: list[int] = []
        for event in self.events:
            if event.kind == "reset":
                seen = []
            elif event.kind == "put" and event.data["key"] == key:
                seen.append(event.data["version"])
        return seen


class Writer(threading.Thread):
    """Writes 1, 2, 3, ... to its own key, alternating brokers; a write answered 503 or cut
    off is sent again with the same Idempotency-Key (to the other broker) until it is
    acknowledged. Stops only between writes, so every write it began was acknowledged."""

    def __init__(self, urls: list[str], ns: str, key: str) -> None:
        super().__init__(daemon=True)
        self.urls, self.ns, self.key = urls, ns, key
        self.acked: list[tuple[int, int]] = []  # (value, version)
        self.refusals: list[str] = []  # 503s and broken connections, retried
        self.failure: str | None = None
        self.stopping = False

    def run(self) -> None:
        with httpx.Client(timeout=10, headers=HEADERS) as client:
            n = 0
            while not self.stopping and self.failure is None:
                n += 1
                self._write(client, n)

    def _write(self, client: httpx.Client, n: int) -> None:
        deadline = time.monotonic() + WAIT
        for attempt in range(10_000):
            url = self.urls[(n + attempt) % len(self.urls)]
            try:
                response = client.put(f"{url}/v1/namespaces/{self.ns}/memory/{self.key}",
                                      json={"value": n},
                                      headers={"Idempotency-Key": f"{self.key}-{n}"})
            except httpx.TransportError as exc:
                self.refusals.append(type(exc).__name__)
            else:
                if response.status_code in (200, 201):
                    self.acked.append((n, response.json()["version"]))
                    return
                if response.status_code != 503:
                    self.failure = f"{response.status_code} {response.text}"
                    return
                assert response.json()["error"]["code"] == "unavailable"
                self.refusals.append("503")
            if time.monotonic() > deadline:
                self.failure = f"write {n} of {self.key} not acknowledged within {WAIT} s"
                return
            time.sleep(0.05)


@dataclass
class Traffic:
    """Writers and subscribers on both brokers of a namespace."""

    brokers: list[BrokerProcess]
    ns: str
    writers: list[Writer] = field(default_factory=list)
    subscribers: list[Subscriber] = field(default_factory=list)

    def start(self, writers: int = 3, subscribers_each: int = 2) -> Traffic:
        urls = [b.url for b in self.brokers]
        for i in range(subscribers_each * len(urls)):
            self.subscribers.append(Subscriber(urls[i % 2:] + urls[:i % 2], self.ns))
        for subscriber in self.subscribers:
            subscriber.start()
        for subscriber in self.subscribers:
            assert subscriber.opened.wait(WAIT), "a subscription did not open"
        self.writers = [Writer(urls, self.ns, f"w{i}") for i in range(writers)]
        for writer in self.writers:
            writer.start()
        self.wait_for(lambda: all(len(w.acked) >= 20 for w in self.writers), "writes to flow")
        return self

    def finish(self) -> None:
        """Let the writers write on the recovered store, stop them, and wait until every
        subscriber has seen every key's last version."""
        counts = {w.key: len(w.acked) for w in self.writers}
        self.wait_for(lambda: all(len(w.acked) >= counts[w.key] + 20 for w in self.writers),
                      "writes to flow again")
        for writer in self.writers:
            writer.stopping = True
        for writer in self.writers:
            writer.join(WAIT)
            assert writer.failure is None, writer.failure
        try:
            for subscriber in self.subscribers:
                self.wait_for(lambda s=subscriber: all(
                    s.versions(w.key)[-1:] == [w.acked[-1][1]] for w in self.writers),
                    "every subscriber to see the last writes")
        finally:
            for subscriber in self.subscribers:
                subscriber.stopping = True

    @staticmethod
    def wait_for(condition: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def check_every_write_applied_once(self, client: httpx.Client) -> None:
        """Each acknowledged write has its own version, 1 to N with none skipped (nothing
        retried was applied twice, nothing acknowledged was lost), and the stored entry is
        the last one."""
        for writer in self.writers:
            assert [v for _, v in writer.acked] == list(range(1, len(writer.acked) + 1))
            stored = client.get(f"/v1/namespaces/{self.ns}/memory/{writer.key}").json()
            assert (stored["value"], stored["version"]) == writer.acked[-1]

    def check_streams_gap_free(self) -> None:
        """Every subscriber saw every version of every key once, in order."""
        for subscriber in self.subscribers:
            for writer in self.writers:
                assert subscriber.versions(writer.key) == list(
                    range(1, len(writer.acked) + 1)), (writer.key, subscriber.events[-5:])


@dataclass
class FaultyRedis(RedisServer):
    """A redis-server that can persist to an append-only file (fsync every second, the usual
    production setting: a killed process loses nothing the kernel has)."""

    appendonly: bool = False

    def start(self) -> None:
        self.process = _spawn_redis(self.port, self.workdir, self.appendonly)

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)
        if sig == signal.SIGKILL:
            self.process.wait(timeout=10)


def _spawn_redis(port: int, workdir: Path, appendonly: bool) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed"
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir",
         str(workdir), "--appendonly", "yes" if appendonly else "no",
         "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port)
    # Ours answers, not another process that took the port meanwhile (a shared machine).
    assert process.poll() is None, f"redis-server could not start on port {port}"
    return process


@pytest.fixture(params=[pytest.param(True, id="aof"), pytest.param(False, id="no-persistence")])
def faulty_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaultyRedis]:
    server = FaultyRedis(free_port(), tmp_path, appendonly=bool(request.param))
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


@pytest.fixture
def two_brokers(faulty_redis: FaultyRedis) -> Iterator[list[BrokerProcess]]:
    processes = ServeProcesses(faulty_redis.url)
    try:
        yield processes.start(2, BROKER_ENV)
    finally:
        processes.stop()


def test_redis_killed_under_writes_and_streams(
    faulty_redis: FaultyRedis, two_brokers: list[BrokerProcess], ns: str
) -> None:
    traffic = Traffic(two_brokers, ns).start()
    faulty_redis.kill()
    time.sleep(0.5)
    faulty_redis.start()
    traffic.finish()
    with httpx.Client(base_url=two_brokers[0].url, headers=HEADERS, timeout=10) as client:
        if faulty_redis.appendonly:
            traffic.check_every_write_applied_once(client)
            traffic.check_streams_gap_free()
            assert not any(e.kind == "reset" for s in traffic.subscribers for e in s.events)
            return
        # Without persistence Redis came back empty: every stream says so with a reset, and
        # from there on sees every version the writers were given, once, in order.
        for subscriber in traffic.subscribers:
            resets = [e for e in subscriber.events if e.kind == "reset"]
            assert len(resets) == 1 and resets[0].data["namespace"] == ns
        for writer in traffic.writers:
            after = [v for _, v in writer.acked[-20:]]
            assert after == list(range(after[0], after[0] + 20))
            stored = client.get(f"/v1/namespaces/{ns}/memory/{writer.key}").json()
            assert (stored["value"], stored["version"]) == writer.acked[-1]
            for subscriber in traffic.subscribers:
                assert subscriber.versions(writer.key) == list(range(1, writer.acked[-1][1] + 1))


@pytest.mark.parametrize("faulty_redis", [pytest.param(True, id="aof")], indirect=True)
def test_redis_frozen_under_writes_and_streams(
    faulty_redis: FaultyRedis, two_brokers: list[BrokerProcess], ns: str
) -> None:
    """SIGSTOP for three times the store timeout: writes get 503 (never a hang or a 500), and
    once Redis runs again the retried writes land once each and no stream skips or repeats."""
    traffic = Traffic(two_brokers, ns).start()
    faulty_redis.kill(signal.SIGSTOP)
    time.sleep(3)
    faulty_redis.kill(signal.SIGCONT)
    traffic.finish()
    assert all("503" in w.refusals for w in traffic.writers)
    with httpx.Client(base_url=two_brokers[1].url, headers=HEADERS, timeout=10) as client:
        traffic.check_every_write_applied_once(client)
    traffic.check_streams_gap_free()


@pytest.mark.parametrize("faulty_redis", [pytest.param(True, id="aof")], indirect=True)
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGKILL, id="kill-9"),
                                 pytest.param(signal.SIGTERM, id="sigterm")])
def test_a_broker_stopped_under_writes_and_streams(
    faulty_redis: FaultyRedis, two_brokers: list[BrokerProcess], ns: str, sig: signal.Signals
) -> None:
    """Writes cut off by the dying broker are retried on the other one and land once; its
    streams resume on the other one from their last event id, without a gap or a repeat.
    Stopped with SIGTERM, it first tells each of its streams where to resume (`shutdown`)."""
    leaving, staying = two_brokers
    traffic = Traffic(two_brokers, ns).start()
    leaving.process.send_signal(sig)
    assert leaving.process.wait(timeout=WAIT) is not None
    traffic.finish()
    with httpx.Client(base_url=staying.url, headers=HEADERS, timeout=10) as client:
        traffic.check_every_write_applied_once(client)
    traffic.check_streams_gap_free()
    for subscriber in traffic.subscribers:
        moved = [i for i, e in enumerate(subscriber.events)
                 if e.via == leaving.url and i + 1 < len(subscriber.events)
                 and subscriber.events[i + 1].via == staying.url]
        if subscriber.urls[0] != leaving.url:
            assert not moved
            continue
        assert len(moved) == 1
        last = subscriber.events[moved[0]]
        if sig == signal.SIGTERM:
            assert last.kind == "shutdown", last
            assert last.id == last.data["cursor"] == subscriber.events[moved[0] - 1].id
        else:
            assert last.kind == "put"
