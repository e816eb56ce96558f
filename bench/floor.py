"""The floors: the same stack as the broker (Starlette on uvicorn, redis.asyncio with hiredis,
msgspec) doing the least a versioned store can do per request.

- `create_app` decodes the JSON: PUT decodes the body and makes one script call (EVALSHA, HSET
  value + HINCRBY version) and encodes its reply; GET makes one HGETALL and encodes the entry.
- `create_blind_app` never looks inside the JSON: PUT makes one script call that bumps the
  version, writes the hash, indexes the key and appends to a stream (what a change-logged
  write must do in Redis) and answers from a byte template; GET makes one HGET of the stored
  body and sends it as it is.

Run with `uvicorn --factory bench.floor:create_app` (or `:create_blind_app`); BENCH_REDIS_URL
names the Redis.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

Endpoint = Callable[[Request], Awaitable[Response]]

_WRITE = """
redis.call('HSET', KEYS[1], 'val', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'ver', 1)
"""
# KEYS: hash, index, stream; ARGV: key, body.
_BLIND_WRITE = """
local version = redis.call('HINCRBY', KEYS[1], 'ver', 1)
redis.call('HSET', KEYS[1], 'doc', ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100000, '*', 'key', ARGV[1], 'ver', version)
return version
"""
_PATH = "/v1/namespaces/{namespace}/memory/{key:path}"


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

    return _floor(client, put, get)


def create_blind_app() -> Starlette:
    client = aioredis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379"),
                                     max_connections=512)
    write = client.register_script(_BLIND_WRITE)

    async def put(request: Request) -> Response:
        namespace, key = request.path_params["namespace"], request.path_params["key"]
        prefix = f"floor:{{{namespace}}}:"
        version = await write(keys=[f"{prefix}e:{key}", f"{prefix}index", f"{prefix}log"],
                              args=[key, await request.body()])
        return Response(b'{"key":"%s","version":%d}' % (key.encode(), int(version)),
                        media_type="application/json")

    async def get(request: Request) -> Response:
        namespace, key = request.path_params["namespace"], request.path_params["key"]
        body = await client.hget(f"floor:{{{namespace}}}:e:{key}", "doc")
        if body is None:
            return Response(b'{"error":"not_found"}', 404, media_type="application/json")
        return Response(body, media_type="application/json")

    return _floor(client, put, get)


def _floor(client: aioredis.Redis, put: Endpoint, get: Endpoint) -> Starlette:
    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await client.ping()
        yield
        await client.aclose()

    return Starlette(routes=[Route(_PATH, put, methods=["PUT"]), Route(_PATH, get, methods=["GET"]),
                             Route("/healthz", healthz, methods=["GET"])],
                     lifespan=lifespan)
