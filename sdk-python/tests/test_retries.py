"""Safe retries: a write whose reply is lost, or answered 503 after it landed, is resent with
the same Idempotency-Key and applied once; 503s are retried with backoff; calls that are not
idempotent are not resent once they may have arrived.

Replies are lost for real: a TCP proxy between the SDK and a real broker drops them, and a
frozen Redis (SIGSTOP) runs a write after the broker has answered 503."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memp import MEMP, AsyncMEMP, ConnectionFailed, Grant, Unavailable
from tests.support.brokers import ADMIN_KEY, Broker, RedisServer, free_port, start_broker

WAIT = 15.0


class LossyProxy:
    """Relays TCP to the broker; while `lose` > 0, the next reply is held for `hold` seconds,
    then dropped with the connection (the request itself reaches the broker)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lose = 0
        self.hold = 0.0
        self.requests: list[bytes] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def idempotency_keys(self, method: bytes) -> list[str]:
        keys = []
        for raw in self.requests:
            if raw.startswith(method + b" "):
                found = re.search(rb"(?im)^idempotency-key: *(\S+)\r$", raw)
                keys.append(found.group(1).decode() if found else "")
        return keys

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                with self.lock:
                    if re.match(rb"[A-Z]+ /", chunk):
                        self.requests.append(chunk)
                upstream.sendall(chunk)
        _close(client, upstream)

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := upstream.recv(65536):
                with self.lock:
                    lose = self.lose > 0
                    self.lose -= lose
                if lose:
                    self.closing.wait(self.hold)
                    break
                client.sendall(chunk)
        _close(client, upstream)

    def close(self) -> None:
        self.closing.set()
        self.listener.close()


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


@pytest.fixture
def proxy(server: Broker) -> Iterator[LossyProxy]:
    port = int(server.url.rsplit(":", 1)[1])
    handle = LossyProxy(port)
    yield handle
    handle.close()


@pytest.mark.parametrize("hold", [pytest.param(0.0, id="connection-dropped"),
                                  pytest.param(3.0, id="read-timeout")])
def test_a_put_whose_reply_is_lost_is_applied_once(proxy: LossyProxy, ns: str, hold: float
                                                   ) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=proxy.url, timeout=1.0) as client:
        client.memory.put("warm-up", 0)  # an open keep-alive connection, as in real use
        proxy.lose, proxy.hold = 1, hold
        entry = client.memory.put("k", {"once": True})
        assert entry.version == 1 and entry.value == {"once": True}
        assert [v.version for v in client.memory.history("k")] == [1], "applied once"
        keys = proxy.idempotency_keys(b"PUT")[1:]
        assert len(keys) == 2 and keys[0] == keys[1] != "", "resent with the same key"


def test_delete_and_register_are_retried_with_their_key(proxy: LossyProxy, ns: str) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=proxy.url) as client:
        client.memory.put("k", 1)
        proxy.lose = 1
        assert client.memory.delete("k").version == 2
        assert [v.version for v in client.memory.history("k")] == [2, 1]
        deletes = proxy.idempotency_keys(b"DELETE")
        assert len(deletes) == 2 and deletes[0] == deletes[1]

        proxy.lose = 1
        agent = client.register(name="retried")
        registrations = proxy.idempotency_keys(b"POST")
        assert len(registrations) == 2 and registrations[0] == registrations[1]
        assert client.memory.put("mine", 1).agent_id == agent.id, "the replayed key works"


def test_async_put_whose_reply_is_lost_is_applied_once(proxy: LossyProxy, ns: str) -> None:
    async def main() -> list[int]:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=proxy.url) as client:
            await client.memory.put("warm-up", 0)
            proxy.lose = 1
            entry = await client.memory.put("k", "v")
            assert entry.version == 1
            return [v.version for v in await client.memory.history("k")]

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [1]
    keys = proxy.idempotency_keys(b"PUT")[1:]
    assert len(keys) == 2 and keys[0] == keys[1]


def test_calls_without_idempotency_are_not_resent(proxy: LossyProxy, ns: str) -> None:
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=proxy.url) as client:
        proxy.lose = 1
        with pytest.raises(ConnectionFailed) as caught:
            client.keys.create([Grant(ns, ["read"])], name="lost reply")
        assert caught.value.code == "connection_error" and caught.value.status is None
        assert len([r for r in proxy.requests if r.startswith(b"POST /v1/keys")]) == 1


def test_an_unreachable_broker_is_a_connection_error() -> None:
    with MEMP(api_key=ADMIN_KEY, namespace="x", base_url=f"http://127.0.0.1:{free_port()}",
              max_retries=1) as client, pytest.raises(ConnectionFailed) as caught:
        client.memory.get("k")
    assert "could not reach the broker" in caught.value.message


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path)
    server.start()
    yield server
    server.stop()


def test_503_is_retried_until_the_store_is_back(own_redis: RedisServer, ns: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """By default a write rides out a store that is away for seconds (a failover), and the
    log says what it waits for; `retry_for=0` gives up at once."""
    broker = start_broker("redis", own_redis.url)
    try:
        with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=broker.url, retry_for=0
                  ) as impatient, MEMP(api_key=ADMIN_KEY, namespace=ns,
                                       base_url=broker.url) as patient:
            assert patient.config.retry_for == 20.0
            impatient.memory.put("k", "before")
            own_redis.stop()  # it keeps no data: "before" is gone when it is back
            with pytest.raises(Unavailable) as caught:
                impatient.memory.put("k", "while down")
            assert (caught.value.status, caught.value.code) == (503, "unavailable")

            # Longer than the three quick retries the SDK once made (at most 1.4 s in all).
            restart = threading.Timer(2.5, own_redis.start)
            restart.start()
            with caplog.at_level("WARNING", logger="memp"):
                entry = patient.memory.put("k", "after")
            restart.join(WAIT)
            assert entry.value == "after" and patient.memory.get("k") == "after"
            assert [v.value for v in patient.memory.history("k")] == ["after"]
            said = [r.getMessage() for r in caplog.records if r.name == "memp"]
            assert len(said) == 1, said
            assert said[0].startswith(f"memp: the broker at {broker.url} is unavailable (503); "
                                      f"retrying PUT /v1/namespaces/{ns}/memory/k for up to ")
    finally:
        broker.stop()


# ---- a 503 that was applied: Redis froze after running the write ----


@pytest.fixture
def frozen_store(own_redis: RedisServer) -> Iterator[tuple[LossyProxy, Callable[[float], None]]]:
    """A broker (1 s store timeout) behind a recording proxy, and `freeze(seconds)`: Redis is
    stopped (SIGSTOP) for that long, like a partition. A write the broker sent meanwhile runs
    when Redis wakes up, though the broker has already answered 503."""
    # The namespace configuration stays cached, so a write's script is all it sends Redis.
    broker = start_broker("redis", own_redis.url, redis_timeout_seconds=1.0, reader_block_ms=500,
                          namespace_cache_seconds=3600)
    proxy = LossyProxy(int(broker.url.rsplit(":", 1)[1]))
    assert own_redis.process is not None
    pid = own_redis.process.pid
    timers: list[threading.Timer] = []

    def freeze(seconds: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        timers.append(threading.Timer(seconds, os.kill, (pid, signal.SIGCONT)))
        timers[-1].start()

    try:
        yield proxy, freeze
    finally:
        for timer in timers:
            timer.join(WAIT)
        proxy.close()
        broker.stop()


def test_a_write_answered_503_that_landed_is_applied_once(
    frozen_store: tuple[LossyProxy, Callable[[float], None]], ns: str
) -> None:
    proxy, freeze = frozen_store
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=proxy.url, max_retries=5) as client:
        client.memory.put("warm-up", 0)  # the namespace noted, its configuration cached,
        client.memory.delete("warm-up")  # and both scripts loaded: Redis is sent just them
        for write in ("PUT", "DELETE"):
            frozen_at = int(time.time() * 1000)
            freeze(1.5)  # the first try gets 503 after 1 s; the retry comes 1 s after that
            if write == "PUT":
                entry = client.memory.put("k", {"once": True})
                assert (entry.version, entry.value) == (1, {"once": True})
            else:
                entry = client.memory.delete("k")
                assert entry.version == 2 and entry.deleted
            # The first try's write landed (it carries that try's time), and the retry, with
            # its key, got its reply instead of writing again.
            assert entry.updated_at < frozen_at + 1000
            keys = proxy.idempotency_keys(write.encode())[-2:]
            assert len(set(keys)) == 1 and keys[0] != ""
        assert [v.version for v in client.memory.history("k")] == [2, 1], "each applied once"


def test_a_call_without_a_key_is_not_resent_after_a_503(
    frozen_store: tuple[LossyProxy, Callable[[float], None]], ns: str
) -> None:
    proxy, freeze = frozen_store
    with MEMP(api_key=ADMIN_KEY, namespace=ns, base_url=proxy.url, max_retries=5) as client:
        # A key made first, so that Redis already holds the write's script: a first call of a
        # script Redis lacks is answered NOSCRIPT, unrun, once Redis wakes.
        client.keys.create([Grant(ns, ["read"])], name=f"warm {ns}")
        freeze(1.5)
        with pytest.raises(Unavailable):
            client.keys.create([Grant(ns, ["read"])], name=f"frozen {ns}")
        assert len([r for r in proxy.requests if r.startswith(b"POST /v1/keys")]) == 2
        # The 503 was no proof that nothing happened: the key was created once, by that try.
        deadline = time.monotonic() + WAIT
        while not [k for k in client.keys.list() if k.name == f"frozen {ns}"]:
            assert time.monotonic() < deadline, "the frozen write never landed"
            time.sleep(0.05)
        assert len([k for k in client.keys.list() if k.name == f"frozen {ns}"]) == 1


def test_async_calls_without_a_key_are_not_resent_after_a_503(
    frozen_store: tuple[LossyProxy, Callable[[float], None]], ns: str
) -> None:
    proxy, freeze = frozen_store

    async def main() -> None:
        async with AsyncMEMP(api_key=ADMIN_KEY, namespace=ns, base_url=proxy.url,
                             max_retries=5) as client:
            freeze(1.5)
            with pytest.raises(Unavailable):
                await client.keys.revoke("key_does_not_matter")

    asyncio.run(asyncio.wait_for(main(), 30))
    assert len([r for r in proxy.requests if r.startswith(b"DELETE /v1/keys/")]) == 1
