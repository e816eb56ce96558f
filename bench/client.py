"""A small keep-alive HTTP/1.1 client over asyncio streams: one-off requests, the prefill, and
the Python load generator (used when `wrk` is not installed).

It speaks just enough HTTP for the servers under test, which always send Content-Length.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any


def build_request(method: str, path: str, token: str = "", body: bytes | None = None) -> bytes:
    """The bytes of one request, ready to send on a keep-alive connection."""
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


def value_json(value_bytes: int) -> bytes:
    """A JSON object of exactly `value_bytes` bytes (bench/wrk.lua builds the same one)."""
    frame = b'{"text":""}'
    return b'{"text":"' + b"x" * max(value_bytes - len(frame), 0) + b'"}'


def put_body(value_bytes: int) -> bytes:
    return b'{"value":' + value_json(value_bytes) + b"}"


class Connection:
    """One keep-alive connection; `send` writes a request and reads its whole response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def send(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        at = head.lower().find(b"\r\ncontent-length:")
        if at >= 0:
            length = int(head[at + 17:head.index(b"\r\n", at + 2)])
        elif status in (204, 304):
            length = 0
        else:
            raise ValueError("response without Content-Length")
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def request_once(host: str, port: int, request: bytes) -> tuple[int, bytes]:
    conn = await Connection.open(host, port)
    try:
        return await conn.send(request)
    finally:
        await conn.close()


async def fill(host: str, port: int, requests: Sequence[bytes], connections: int) -> None:
    """Send every request once over `connections` connections; any non-2xx is an error."""
    pending = iter(requests)
    failures: Counter[int] = Counter()

    async def worker() -> None:
        conn = await Connection.open(host, port)
        try:
            for request in pending:
                status, _ = await conn.send(request)
                if not 200 <= status < 300:
                    failures[status] += 1
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    if failures:
        raise RuntimeError(f"prefill got non-2xx responses: {dict(failures)}")


async def load(host: str, port: int, requests: Sequence[bytes], connections: int,
               seconds: float) -> dict[str, Any]:
    """Keep `connections` connections busy for `seconds` with requests picked round-robin
    (each connection starting at a different offset); returns the same fields as wrk.lua."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    stride = max(len(requests) // connections, 1)
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        try:
            conn = await Connection.open(host, port)
        except OSError:
            errors["connect"] += 1
            return
        clock = time.perf_counter
        try:
            for i in itertools.count(offset):
                started = clock()
                if started >= deadline:
                    break
                status, _ = await conn.send(requests[i % len(requests)])
                latencies.append(clock() - started)
                statuses[status] += 1
        except (OSError, asyncio.IncompleteReadError, ValueError):
            errors["read"] += 1
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(n * stride) for n in range(connections)))
    duration = time.perf_counter() - started
    return summarize(latencies, statuses, errors, duration)


def summarize(latencies: list[float], statuses: Counter[int], errors: Counter[str],
              duration: float) -> dict[str, Any]:
    ordered = sorted(latencies)

    def pct(p: float) -> int:
        if not ordered:
            return 0
        return int(ordered[min(int(len(ordered) * p / 100), len(ordered) - 1)] * 1e6)

    return {
        "requests": len(ordered),
        "duration_us": int(duration * 1e6),
        "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99),
        "max_us": int(ordered[-1] * 1e6) if ordered else 0,
        "mean_us": sum(ordered) / len(ordered) * 1e6 if ordered else 0.0,
        "socket_errors": {k: errors.get(k, 0) for k in ("connect", "read", "write", "timeout")},
        "non2xx": {str(s): n for s, n in statuses.items() if not 200 <= s < 300},
    }


def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def register_agent(host: str, port: int, admin_key: str, namespace: str) -> dict[str, Any]:
    """Register an agent named "bench" with the admin key: its credentials (api_key, key_id,
    agent_id). The broker is driven with its API key, as an agent would drive it."""
    body = json.dumps({"name": "bench", "namespace": namespace}).encode()
    status, reply = run(lambda: request_once(
        host, port, build_request("POST", "/v1/agents", admin_key, body)))
    if status != 201:
        raise RuntimeError(f"agent registration failed: {status} {reply[:300]!r}")
    credentials: dict[str, Any] = json.loads(reply)["credentials"]
    return credentials
