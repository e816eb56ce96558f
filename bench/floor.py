"""The floor: the same stack as the broker (Starlette on uvicorn, redis.asyncio with hiredis,
msgspec) doing the least a versioned store can do per request.

PUT makes one script call (EVALSHA, HSET value + HINCRBY version); GET makes one HGETALL.
Run with `uvicorn --factory bench.floor:create_app`; BENCH_REDIS_URL names the Redis.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import msgspec
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_WRITE = """
redis.call('HSET', KEYS[1], 'val', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'ver', 1)
"""


class _Body(msgspec.Struct):
    value: msgspec.Raw


class _Entry(msgspec.Struct):
    key: str
    value: msgspec.Raw | None
    version: int


def create_app() -> Starlette:
    client = aioredis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379"),
                                     max_connections=512)
    write = client.register_script(_WRITE)
    decode = msgspec.json.Decoder(_Body).decode
    encode = msgspec.json.Encoder().encode

    def _redis_key(request: Request) -> tuple[str, str]:
        key = request.path_params["key"]
        return f"floor:{{{request.path_params['namespace']}}}:{key}", key

    async def put(request: Request) -> Response:
        name, key = _redis_key(request)
        body = decode(await request.body())
        version = await write(keys=[name], args=[bytes(body.value)])
        return Response(encode(_Entry(key, body.value, int(version))),
                        media_type="application/json")

    async def get(request: Request) -> Response:
        name, key = _redis_key(request)
        fields = await client.hgetall(name)
        if not fields:
            return Response(b'{"error":"not_found"}', 404, media_type="application/json")
        entry = _Entry(key, msgspec.Raw(fields[b"val"]), int(fields[b"ver"]))
        return Response(encode(entry), media_type="application/json")

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await client.ping()
        yield
        await client.aclose()

    path = "/v1/namespaces/{namespace}/memory/{key:path}"
    return Starlette(routes=[Route(path, put, methods=["PUT"]), Route(path, get, methods=["GET"]),
                             Route("/healthz", healthz, methods=["GET"])],
                     lifespan=lifespan)
