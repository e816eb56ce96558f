"""The only module that talks to Redis: connection, scripts and reads, for both backends."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import msgspec
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker import layout
from broker.connection import FreshConnectionPool, HiredisPackingConnection
from broker.keys import Pattern
from broker.models import Agent, ApiKeyRecord, Entry
from broker.values import recanonical

LuaFields = dict[str, str]
RawHash = Mapping[bytes, bytes]
ScriptCall = tuple[AsyncScript, list[Any], list[Any]]  # script, keys, args
# Errors that mean the store cannot be reached (or the URL names something that is not Redis):
# answered 503 with Retry-After, never 500.
STORE_DOWN: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError,
                                           InvalidResponse)


def _lua(name: str) -> str:
    return resources.files("broker").joinpath("lua", name).read_text()


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _opt_int(value: str) -> int | None:
    return int(value) if value else None


def entry_from_fields(namespace: str, key: str, fields: Mapping[str, Any]) -> Entry:
    """Build an Entry from an entry hash or a script's record (all values are text)."""
    value = fields.get("val") or b""
    if isinstance(value, str):
        value = value.encode()
    deleted = _text(fields.get("del", "")) == "1"
    schema_errors = fields.get("sv") or b""
    conflicts = fields.get("cf") or b""
    return Entry(
        id=_text(fields.get("id", "")),
        agent_id=_text(fields.get("agent", "")),
        namespace=namespace,
        key=key,
        value=None if deleted or not value else msgspec.Raw(recanonical(value)),
        ttl_seconds=_opt_int(_text(fields.get("ttl", ""))),
        version=int(_text(fields.get("ver", "0"))),
        created_at=int(_text(fields.get("ca", "0")) or 0),
        updated_at=int(_text(fields.get("ua", "0")) or 0),
        timestamp=_opt_int(_text(fields.get("ts", ""))),
        expires_at=_opt_int(_text(fields.get("exp", ""))),
        schema_violation=bool(schema_errors),
        deleted=deleted,
        schema_errors=msgspec.Raw(schema_errors) if schema_errors else msgspec.UNSET,
        conflicts=msgspec.Raw(conflicts) if conflicts else msgspec.UNSET,
    )


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """Everything a put or delete script needs besides the namespace and key."""

    agent_id: str
    now: int
    timestamp: int
    timestamp_from_client: bool
    idempotency_key: str = ""
    value: bytes = b""
    entry_id: str = ""
    ttl_seconds: int | None = None
    if_version: int | None = None
    if_absent: bool = False
    mode: str = "lww"
    priority: int = 0
    default_priority: int = 0
    internal_cas: bool = False
    history_limit: int | None = None
    schema_errors: str = ""
    conflicts: str = ""
    fingerprint: str = ""  # of the request behind the message id: a reused id is refused


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """A script's verdict: `ok`, `precondition_failed`, `write_conflict`, `not_found`, or
    `reused` (the message id came with another request)."""

    status: str
    record: LuaFields
    replayed: bool

    @property
    def created(self) -> bool:
        """True when the write created the entry (no live entry was there before)."""
        return self.record.get("created") == "1"

    def entry(self, namespace: str, key: str, value: bytes | None = None) -> Entry:
        fields: dict[str, Any] = dict(self.record)
        if value is not None and self.status == "ok" and not fields.get("del"):
            fields["val"] = value
        return entry_from_fields(namespace, key, fields)


_outcome_decoder = msgspec.json.Decoder(tuple[str, dict[str, str]])


class Store:
    """Memory entries, agents and API keys in Redis (or the embedded fakeredis server)."""

    def __init__(self, connect: Callable[[], aioredis.Redis], *, history_limit: int,
                 changelog_maxlen: int, idempotency_window_ms: int, embedded: bool) -> None:
        self._connect = connect
        self.redis = client = connect()
        self.embedded = embedded
        self.history_limit = history_limit
        self.changelog_maxlen = changelog_maxlen
        self.idempotency_window_ms = max(idempotency_window_ms, 1)
        common = _lua("common.lua")
        self._put: AsyncScript = client.register_script(
            common + _lua("put_entry.lua") + _lua("put.lua"))
        self._delete: AsyncScript = client.register_script(common + _lua("delete.lua"))
        self._expire: AsyncScript = client.register_script(common + _lua("expire.lua"))
        self._trim: AsyncScript = client.register_script(_lua("trim.lua"))
        self._save_agent: AsyncScript = client.register_script(_lua("agent_save.lua"))
        self._known_namespaces: set[str] = set()
        self._expiry_hints: dict[str, int] = {}

    def script(self, *names: str) -> AsyncScript:
        """The Lua files of broker/lua, joined and registered on this store's client."""
        return self.redis.register_script("".join(_lua(name) for name in names))

    @classmethod
    def connect(cls, redis_url: str | None, *, timeout: float, history_limit: int,
                changelog_maxlen: int, idempotency_window_ms: int) -> Store:
        """A store on `redis_url`, or on a fresh embedded in-process server when it is None."""
        connect: Callable[[], aioredis.Redis]
        if redis_url:
            url = redis_url

            plain_tcp = url.startswith("redis://")

            def connect() -> aioredis.Redis:
                extra: dict[str, Any] = (
                    {"connection_class": HiredisPackingConnection} if plain_tcp else {})
                pool = FreshConnectionPool.from_url(
                    url, socket_timeout=timeout, socket_connect_timeout=timeout,
                    max_connections=1024, timeout=timeout, health_check_interval=10, **extra,
                )
                return aioredis.Redis.from_pool(pool)
        else:
            import fakeredis

            server = fakeredis.FakeServer()

            def connect() -> aioredis.Redis:
                return fakeredis.FakeAsyncRedis(server=server)
        return cls(connect, history_limit=history_limit, changelog_maxlen=changelog_maxlen,
                   idempotency_window_ms=idempotency_window_ms, embedded=not redis_url)

    def new_client(self) -> aioredis.Redis:
        """Another client on the same backend, with its own connections (for blocking reads)."""
        return self._connect()

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # ---- namespaces ----

    async def note_namespace(self, namespace: str) -> None:
        """Record that a namespace holds data (once per process), so the sweeper visits it."""
        if namespace not in self._known_namespaces:
            await self.redis.sadd(layout.namespaces(), namespace)
            self._known_namespaces.add(namespace)

    def take_expiry_hints(self) -> dict[str, int]:
        """Earliest expiry this process wrote per namespace since the last call."""
        hints, self._expiry_hints = self._expiry_hints, {}
        return hints

    async def next_expiry(self, namespace: str) -> int | None:
        """When the namespace's next entry is due to expire (ms), if any."""
        first = await self.redis.zrange(layout.expiries(namespace), 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    async def namespaces(self) -> list[str]:
        """Namespaces that hold data. Any this process noted that Redis has forgotten (it
        restarted empty or failed over) are noted again, or the sweeper would skip them."""
        found = {_text(n) for n in await self.redis.smembers(layout.namespaces())}
        lost = self._known_namespaces - found
        if lost:
            await self.redis.sadd(layout.namespaces(), *lost)
        return sorted(found | lost)

    # ---- memory writes ----

    def _write_keys(self, namespace: str, key: str, idempotency_key: str) -> list[str]:
        return [
            layout.entry(namespace, key), layout.history(namespace, key),
            layout.index(namespace), layout.expiries(namespace), layout.changelog(namespace),
            idempotency_key, layout.meta(namespace),
        ]

    def _history_limit(self, req: WriteRequest) -> int:
        return self.history_limit if req.history_limit is None else req.history_limit

    def put_args(self, namespace: str, key: str, req: WriteRequest) -> list[Any]:
        """The arguments of one write to `put` (broker/lua/put_entry.lua)."""
        expires_at = req.now + req.ttl_seconds * 1000 if req.ttl_seconds is not None else None
        if expires_at is not None:
            hinted = self._expiry_hints.get(namespace, expires_at)
            self._expiry_hints[namespace] = min(hinted, expires_at)
        return [
            key, req.now, req.entry_id, req.agent_id, req.value, req.timestamp,
            "" if req.ttl_seconds is None else req.ttl_seconds,
            "" if expires_at is None else expires_at,
            "" if req.if_version is None else req.if_version, "1" if req.if_absent else "0",
            self._history_limit(req), self.changelog_maxlen, self.idempotency_window_ms,
            req.schema_errors, req.conflicts, "1" if req.timestamp_from_client else "0",
            req.mode, req.priority, "1" if req.internal_cas else "0", req.default_priority,
            req.fingerprint,
        ]

    async def put(self, namespace: str, key: str, req: WriteRequest) -> WriteOutcome:
        await self.note_namespace(namespace)
        raw = await self._put(self._write_keys(namespace, key, req.idempotency_key),
                              self.put_args(namespace, key, req))
        return self.outcome(raw)

    async def run_scripts(self, calls: list[ScriptCall]) -> list[Any]:
        """Script calls in one round trip, sent by digest (a pipeline of `Script` objects asks
        Redis which scripts it knows first, a round trip of its own). Calls Redis refuses for
        an unknown script (its script cache was emptied: a restart, SCRIPT FLUSH) did not run;
        they are sent again, in order, once their scripts are loaded."""
        if len(calls) == 1:  # a call of its own costs less than a pipeline, and reloads too
            script, keys, args = calls[0]
            return [await script(keys, args)]
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for attempt in range(2):
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in pending:
                    script, keys, args = calls[i]
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                results = await pipe.execute(raise_on_error=False)
            unknown = []
            for i, result in zip(pending, results, strict=True):
                if isinstance(result, NoScriptError) and attempt == 0:
                    unknown.append(i)
                elif isinstance(result, Exception):
                    raise result
                else:
                    replies[i] = result
            if not unknown:
                break
            for script in {calls[i][0].sha: calls[i][0] for i in unknown}.values():
                await self.redis.script_load(script.script)
            pending = unknown
        return replies

    async def delete(self, namespace: str, key: str, req: WriteRequest) -> WriteOutcome:
        args: list[Any] = [
            key, req.now, req.agent_id, req.timestamp,
            "" if req.if_version is None else req.if_version,
            self._history_limit(req), self.changelog_maxlen, self.idempotency_window_ms,
            "1" if req.timestamp_from_client else "0", req.mode, req.priority,
            req.default_priority, req.fingerprint,
        ]
        raw = await self._delete(self._write_keys(namespace, key, req.idempotency_key), args)
        return self.outcome(raw)

    @staticmethod
    def outcome(raw: list[bytes]) -> WriteOutcome:
        status, payload = _text(raw[0]), raw[1]
        if status == "reused":
            return WriteOutcome("reused", {}, replayed=True)
        stored_status, record = _outcome_decoder.decode(payload)
        return WriteOutcome(stored_status, record, replayed=status == "replay")

    async def expire_due(self, namespace: str, now: int, batch: int) -> int:
        """Expire up to `batch` due entries of a namespace; returns how many it expired."""
        due = await self.redis.zrangebyscore(layout.expiries(namespace), "-inf", now, 0, batch)
        if not due:
            return 0
        keys = [layout.index(namespace), layout.expiries(namespace), layout.changelog(namespace),
                layout.meta(namespace)]
        names = [_text(k) for k in due]
        for name in names:
            keys += [layout.entry(namespace, name), layout.history(namespace, name)]
        args: list[Any] = [now, self.history_limit, self.changelog_maxlen, *names]
        return int(await self._expire(keys, args))

    async def trim_changelog(self, namespace: str, before_ms: int, batch: int) -> int:
        """Drop up to `batch` change-log records logged before `before_ms`."""
        keys = [layout.changelog(namespace), layout.meta(namespace)]
        return int(await self._trim(keys, [max(before_ms - 1, 0), batch]))

    async def erase(self, namespace: str, keys: list[str]) -> int:
        """Remove every trace of these keys: entries, history, indexes and change-log records
        (for erasure requests). Returns how many change-log records were dropped."""
        wanted = {k.encode() for k in keys}
        log_key = layout.changelog(namespace)
        doomed: list[bytes] = []
        position = b"-"
        while True:
            records: Any = await self.redis.xrange(log_key, position, "+", count=1000)
            if not records:
                break
            doomed += [rid for rid, fields in records if fields.get(b"key") in wanted]
            if len(records) < 1000:
                break
            position = b"(" + records[-1][0]
        async with self.redis.pipeline(transaction=True) as pipe:
            for key in keys:
                pipe.delete(layout.entry(namespace, key), layout.history(namespace, key))
                pipe.zrem(layout.index(namespace), key)
                pipe.zrem(layout.expiries(namespace), key)
            for start in range(0, len(doomed), 500):
                pipe.xdel(log_key, *doomed[start:start + 500])
            await pipe.execute()
        return len(doomed)

    # ---- memory reads ----

    async def get(self, namespace: str, key: str, now: int) -> Entry | None:
        fields = await self.redis.hgetall(layout.entry(namespace, key))
        return self.live_entry(namespace, key, cast(RawHash, fields), now)

    @staticmethod
    def live_entry(namespace: str, key: str, raw: RawHash, now: int
                    ) -> Entry | None:
        if not raw or raw.get(b"del") == b"1":
            return None
        expires = raw.get(b"exp")
        if expires and int(expires) <= now:
            return None
        return entry_from_fields(namespace, key, {_text(k): v for k, v in raw.items()})

    async def scan_keys(self, namespace: str, pattern: Pattern, after: str | None,
                        count: int) -> tuple[list[str], bool]:
        """Up to `count` live keys after `after` that share the pattern's literal prefix, in
        key order; the flag says whether the index may hold more."""
        prefix = pattern.literal_prefix.encode()
        if pattern.is_exact:
            if after is not None:
                return [], False
            start = stop = b"[" + prefix
        else:
            begins_after = after is not None and after.encode() >= prefix
            start = b"(" + after.encode() if after is not None and begins_after else b"[" + prefix
            # UTF-8 never contains 0xff, so prefix + 0xff bounds every key with that prefix.
            stop = b"[" + prefix + b"\xff" if prefix else b"+"
        found = await self.redis.zrangebylex(layout.index(namespace), start, stop, 0, count)
        names = [_text(k) for k in found]
        return names, len(names) == count

    async def get_many(self, namespace: str, keys: list[str], now: int) -> list[Entry]:
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(layout.entry(namespace, key))
            rows = await pipe.execute()
        entries = (self.live_entry(namespace, k, row, now) for k, row in zip(keys, rows,
                                                                               strict=True))
        return [e for e in entries if e is not None]

    async def history(self, namespace: str, key: str, limit: int) -> list[Entry]:
        rows = await self.redis.lrange(layout.history(namespace, key), 0, limit - 1)
        decode = msgspec.json.Decoder(dict[str, str]).decode
        return [entry_from_fields(namespace, key, decode(row)) for row in rows]

    # ---- idempotency for operations that are not scripts ----

    async def recall_reply(self, key: str) -> tuple[str, bytes] | None:
        """The first reply under a message id and its request's fingerprint (stored as the
        write scripts store theirs: fingerprint, newline, reply)."""
        stored = cast(bytes | None, await self.redis.get(key))
        if stored is None:
            return None
        fingerprint, cut, reply = stored.partition(b"\n")
        return (fingerprint.decode(), reply) if cut else ("", stored)

    async def remember_reply(self, key: str, fingerprint: str, reply: bytes
                             ) -> tuple[str, bytes]:
        """Keep the first reply for the window; returns whichever reply was first."""
        stored = await self.redis.set(key, fingerprint.encode() + b"\n" + reply,
                                      px=self.idempotency_window_ms, nx=True)
        if stored:
            return fingerprint, reply
        return await self.recall_reply(key) or (fingerprint, reply)

    # ---- agents ----

    async def save_agent(self, agent: Agent) -> Agent:
        """Store a new agent; returns it as stored (see agent_save.lua: its `created_at` may be
        a few ms later, so that registration order is total)."""
        await self.note_namespace(agent.namespace)
        created = await self._save_agent(
            [layout.agent(agent.namespace, agent.id), layout.agents(agent.namespace)],
            [agent.id, agent.name, agent.framework, agent.namespace, agent.created_at])
        await self.redis.hset(layout.agent_homes(), agent.id, agent.namespace)
        return msgspec.structs.replace(agent, created_at=int(created), last_seen=int(created))

    async def get_agent(self, namespace: str, agent_id: str) -> Agent | None:
        raw = await self.redis.hgetall(layout.agent(namespace, agent_id))
        return _agent(cast(RawHash, raw)) if raw else None

    async def delete_agent(self, namespace: str, agent_id: str) -> list[str]:
        """Remove a registered agent and revoke every API key bound to it; returns the ids of
        the keys revoked."""
        created = await self.redis.hget(layout.agent(namespace, agent_id), "created_at")
        bound = [r.id for r in await self.list_api_keys() if r.agent_id == agent_id]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(layout.agent(namespace, agent_id))
            if created is not None:
                pipe.zrem(layout.agents(namespace), f"{int(created):013d}:{agent_id}")
            await pipe.execute()
        await self.redis.hdel(layout.agent_homes(), agent_id)
        for key_id in bound:
            await self.delete_api_key(key_id)
        return bound

    async def agent_home(self, agent_id: str) -> str | None:
        """The namespace an agent was registered in, or None for no registered agent. Agents
        registered before homes were recorded are found by their namespace's agent hash."""
        home = await self.redis.hget(layout.agent_homes(), agent_id)
        if home is not None:
            return _text(home)
        namespaces = await self.namespaces()
        async with self.redis.pipeline(transaction=False) as pipe:
            for namespace in namespaces:
                pipe.exists(layout.agent(namespace, agent_id))
            found = await pipe.execute()
        for namespace, exists in zip(namespaces, found, strict=True):
            if exists:
                await self.redis.hset(layout.agent_homes(), agent_id, namespace)
                return namespace
        return None

    async def list_agents(self, namespace: str, after: str | None, limit: int
                          ) -> tuple[list[Agent], str | None]:
        """Agents in registration order; the cursor is the last member of the agents index."""
        start = b"(" + after.encode() if after else b"-"
        found = await self.redis.zrangebylex(layout.agents(namespace), start, b"+", 0, limit)
        members = [_text(m) for m in found]
        async with self.redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.hgetall(layout.agent(namespace, member.split(":", 1)[1]))
            rows = await pipe.execute()
        agents = [_agent(row) for row in rows if row]
        return agents, members[-1] if len(members) == limit else None

    async def touch_agents(self, seen: Mapping[tuple[str, str], int]) -> None:
        """Raise `last_seen` of the given agents (never lowers it)."""
        if not seen:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for (namespace, agent_id), when in seen.items():
                pipe.eval(_RAISE_LAST_SEEN, 1, layout.agent(namespace, agent_id), when)
            await pipe.execute()

    # ---- API keys ----

    async def save_api_key(self, digest: str, record: ApiKeyRecord) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(layout.api_key(digest), msgspec.json.encode(record))
            pipe.hset(layout.api_key_ids(), record.id, digest)
            await pipe.execute()

    async def load_api_key(self, digest: str) -> ApiKeyRecord | None:
        raw = await self.redis.get(layout.api_key(digest))
        return msgspec.json.decode(raw, type=ApiKeyRecord) if raw else None

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        digests = await self.redis.hvals(layout.api_key_ids())
        if not digests:
            return []
        rows = await self.redis.mget([layout.api_key(_text(d)) for d in digests])
        records = [msgspec.json.decode(r, type=ApiKeyRecord) for r in rows if r]
        return sorted(records, key=lambda r: (r.created_at, r.id))

    async def live_api_keys(self, key_ids: set[str]) -> set[str]:
        """Those of these key ids that still exist."""
        ids = sorted(key_ids)
        digests = await self.redis.hmget(layout.api_key_ids(), ids)
        return {key_id for key_id, digest in zip(ids, digests, strict=True) if digest}

    async def announce_revocation(self, what: str) -> None:
        """Tell every broker process that credentials were revoked (`what` names them)."""
        await self.redis.publish(layout.revocations(), what)

    async def delete_api_key(self, key_id: str) -> bool:
        digest = await self.redis.hget(layout.api_key_ids(), key_id)
        if digest is None:
            return False
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(layout.api_key(_text(digest)))
            pipe.hdel(layout.api_key_ids(), key_id)
            await pipe.execute()
        return True


_RAISE_LAST_SEEN = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local seen = tonumber(redis.call('HGET', KEYS[1], 'last_seen') or '0')
  if tonumber(ARGV[1]) > seen then redis.call('HSET', KEYS[1], 'last_seen', ARGV[1]) end
end
return 0
"""


def _agent(raw: RawHash) -> Agent:
    fields = {_text(k): _text(v) for k, v in raw.items()}
    return Agent(
        id=fields["id"], name=fields["name"], framework=fields["framework"],
        namespace=fields["namespace"], created_at=int(fields["created_at"]),
        last_seen=int(fields["last_seen"]),
    )
