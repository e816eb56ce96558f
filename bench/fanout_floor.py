"""The fan-out floor: a bare sse-starlette app on the broker's stack that follows one namespace's
change log (the Redis Stream `memp:{<ns>}:log`) with one reader task and hands every record to
every subscriber through one bounded asyncio.Queue each; sse-starlette encodes each event per
subscriber. No auth, patterns, cursors or resume: the least a fan-out on this stack can do.

Run with `uvicorn --factory bench.fanout_floor:create_app`; BENCH_REDIS_URL names the Redis,
BENCH_NAMESPACE the namespace (default `bench`), BENCH_QUEUE_SIZE bounds each queue (1000).
A record's `val` field is sent as the event's data, its stream id as the event id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

Event = dict[str, str]


def create_app() -> Starlette:
    client = aioredis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379"))
    namespace = os.environ.get("BENCH_NAMESPACE", "bench")
    queue_size = int(os.environ.get("BENCH_QUEUE_SIZE", "1000"))
    stream = f"memp:{{{namespace}}}:log"
    subscribers: set[asyncio.Queue[Event | None]] = set()

    async def follow() -> None:
        """The one reader: every record, to every subscriber; a full queue ends its stream."""
        last = "$"
        while True:
            found: Any = await client.xread({stream: last}, count=1000, block=1000)
            for raw_id, fields in found[0][1] if found else []:
                last = raw_id.decode()
                event = {"id": last, "event": fields.get(b"type", b"put").decode(),
                         "data": fields.get(b"val", b"").decode()}
                for queue in list(subscribers):
                    try:
                        queue.put_nowait(event)
                    except asyncio.QueueFull:
                        subscribers.discard(queue)
                        queue.get_nowait()
                        queue.put_nowait(None)

    async def events(queue: asyncio.Queue[Event | None]) -> AsyncIterator[Event]:
        while (event := await queue.get()) is not None:
            yield event

    async def subscribe(request: Request) -> Response:
        if request.query_params.get("namespace") != namespace:
            return Response(b'{"error":"not_found"}', 404, media_type="application/json")
        queue: asyncio.Queue[Event | None] = asyncio.Queue(queue_size)
        subscribers.add(queue)
        return EventSourceResponse(events(queue), ping=15,
                                   background=BackgroundTask(subscribers.discard, queue))

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await client.ping()
        reader = asyncio.create_task(follow())
        yield
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await client.aclose()

    return Starlette(routes=[Route("/v1/subscribe", subscribe, methods=["GET"]),
                             Route("/healthz", healthz, methods=["GET"])],
                     lifespan=lifespan)
