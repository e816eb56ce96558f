"""The fan-out benchmark's publishing side: values that carry their send time, written on a
steady schedule through the broker's PUT or, for the floor, straight into the change log."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Protocol

import msgspec
import redis.asyncio as aioredis

from bench import client

BUCKETS = 100  # `bucket` of a value: seq % 100, what the filtered phase's filters select on


def bench_value(phase: str, seq: int, value_bytes: int) -> bytes:
    """A JSON object of `value_bytes` bytes carrying the phase, sequence number and send time,
    and a `bucket` (seq % BUCKETS) for filters."""
    head = (f'{{"bench":"{phase}:{seq}:{time.time_ns()}","bucket":{seq % BUCKETS},'
            f'"pad":"').encode()
    return head + b"x" * max(value_bytes - len(head) - 2, 0) + b'"}'


class Publisher(Protocol):
    async def open(self, lanes: int) -> None: ...

    async def write(self, lane: int, phase: str, seq: int) -> bool: ...

    async def close(self) -> None: ...


class BrokerPublisher:
    """PUTs over keep-alive connections, one per lane, taking turns over the broker processes."""

    def __init__(self, host: str, ports: list[int], namespace: str, token: str,
                 value_bytes: int) -> None:
        self.host = host
        self.ports = ports
        self.namespace = namespace
        self.token = token
        self.value_bytes = value_bytes
        self.conns: list[client.Connection] = []

    async def open(self, lanes: int) -> None:
        self.conns = [await client.Connection.open(self.host, self.ports[n % len(self.ports)])
                      for n in range(lanes)]

    async def write(self, lane: int, phase: str, seq: int) -> bool:
        path = f"/v1/namespaces/{self.namespace}/memory/fanout/k-{seq % 64}"
        body = b'{"value":' + bench_value(phase, seq, self.value_bytes) + b"}"
        status, _ = await self.conns[lane].send(
            client.build_request("PUT", path, self.token, body))
        return 200 <= status < 300

    async def close(self) -> None:
        for conn in self.conns:
            await conn.close()


class FloorPublisher:
    """XADDs to the change log a record whose `val` is as large as the broker's event data."""

    def __init__(self, redis_url: str, namespace: str, value_bytes: int) -> None:
        self.namespace = namespace
        self.redis_url = redis_url
        self.value_bytes = value_bytes
        self.agent = str(uuid.uuid4())
        self.redis: aioredis.Redis | None = None

    async def open(self, lanes: int) -> None:
        self.redis = aioredis.Redis.from_url(self.redis_url, max_connections=lanes + 1)

    async def write(self, lane: int, phase: str, seq: int) -> bool:
        if self.redis is None:
            raise RuntimeError("FloorPublisher.write before open")
        key = f"fanout/k-{seq % 64}"
        value = bench_value(phase, seq, self.value_bytes)
        now = time.time_ns() // 1_000_000
        # The same fields as the broker's event payload (broker.streaming.changes.ChangePayload).
        data = msgspec.json.encode({
            "id": str(uuid.uuid4()), "agent_id": self.agent, "namespace": self.namespace,
            "key": key, "value": msgspec.Raw(value), "ttl_seconds": None, "version": seq + 1,
            "created_at": now, "updated_at": now, "timestamp": now, "expires_at": None,
            "schema_violation": False, "deleted": False, "type": "put"})
        await self.redis.xadd(f"memp:{{{self.namespace}}}:log",
                              {"type": "put", "key": key, "val": data},
                              maxlen=100_000, approximate=True)
        return True

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()


async def publish(publisher: Publisher, phase: str, writes: int, rate: float, lanes: int
                   ) -> dict[str, Any]:
    """`writes` writes on a steady schedule of `rate` per second, over `lanes` connections."""
    await publisher.open(lanes)
    loop = asyncio.get_running_loop()
    schedule = iter(range(writes))
    failed = 0
    start, start_ns = loop.time() + 0.02, time.time_ns() + 20_000_000

    async def lane(n: int) -> None:
        nonlocal failed
        for seq in schedule:
            delay = start + seq / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if not await publisher.write(n, phase, seq):
                failed += 1

    try:
        await asyncio.gather(*(lane(n) for n in range(lanes)))
    finally:
        await publisher.close()
    return {"writes": writes, "failed": failed, "start_ns": start_ns,
            "publish_seconds": round((time.time_ns() - start_ns) / 1e9, 3)}
