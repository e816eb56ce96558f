"""Memory entries: writes (put, delete, expiry, change-log trimming, erasure), each one atomic
script, and reads (get, key scans, history). See docs/design.md, "One write, one script"."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

import msgspec
from redis.exceptions import ResponseError

from broker.core.grammar import Pattern
from broker.core.models import Entry
from broker.storage import layout, scripts
from broker.storage.client import Backend, text
from broker.storage.fairshare import (
    GATE,
    GATE_FILES,
    GATE_KEYS,
    FairShareStore,
    Gate,
    open_gate,
)
from broker.storage.records import (
    CorruptRecord,
    WriteOutcome,
    WriteRequest,
    corrupt,
    entry_from_fields,
    live_entry,
    skipped,
)
from broker.storage.scripts import Fields

# One write's keys and arguments, shared by put.lua, delete.lua and amp_commit.lua.
WRITE_KEYS = Fields("write_keys", ("entry", "history", "index", "ttl", "log", "idem", "meta",
                                   "usage", "audit"))
WRITE = Fields("write", (
    "key", "now", "agent", "ts", "ts_from_client",  # who, when, and whose clock
    "mode", "priority", "default_priority",  # the strategy: lww, priority or merge
    "if_version", "if_absent", "internal_cas",  # conditions ('' / '0' when none)
    "entry_id", "value", "ttl", "exp", "schema_errors", "conflicts",  # what a put stores
    "history_limit", "log_maxlen", "remember", "idem_window_ms", "fingerprint",
    "actor", "key_id", "request_id", "content_hash", "action",  # for the audit log
))
NAMESPACE_KEYS = Fields("namespace_keys", ("index", "ttl", "log", "meta", "usage", "audit"))
ENTRY_KEYS = Fields("entry_keys", ("entry", "history"))
EXPIRE = Fields("expire", ("now", "history_limit", "log_maxlen"), rest="names")
LOG_KEYS = Fields("log_keys", ("log", "meta"))
TRIM = Fields("trim", ("upto", "count"))
COMMON_FILES = ("sha1.lua", "audit.lua", "stream.lua", "common.lua")
WRITE_FILES = (*COMMON_FILES, *GATE_FILES, "put_entry.lua")

_history_decoder = msgspec.json.Decoder(dict[str, str])


def _history_row(row: bytes, namespace: str, key: str) -> dict[str, str]:
    try:
        return _history_decoder.decode(row)
    except msgspec.DecodeError:
        where = f"history {namespace}/{key}"
        raise CorruptRecord(f"{where}: a version is not a JSON object", where) from None


def content_hash(value: bytes) -> str:
    """What the audit log keeps of a value: its SHA-256, never the value."""
    return f"sha256:{hashlib.sha256(value).hexdigest()}" if value else ""


def _opt(value: int | None) -> int | str:
    return "" if value is None else value


class EntryStore:
    """Entries of every namespace, on one backend."""

    def __init__(self, backend: Backend, *, history_limit: int, changelog_maxlen: int,
                 idempotency_window_ms: int) -> None:
        self.backend = backend
        self.redis = client = backend.redis
        self.history_limit = history_limit
        self.changelog_maxlen = changelog_maxlen
        self.idempotency_window_ms = max(idempotency_window_ms, 1)
        self._put = scripts.register(client, [*WRITE_FILES, "put.lua"],
                                     [WRITE_KEYS, GATE_KEYS, WRITE, GATE])
        self._delete = scripts.register(client, [*WRITE_FILES, "delete_entry.lua", "delete.lua"],
                                        [WRITE_KEYS, GATE_KEYS, WRITE, GATE])
        self._expire = scripts.register(client, [*COMMON_FILES, "expire.lua"],
                                        [NAMESPACE_KEYS, ENTRY_KEYS, EXPIRE])
        self._trim = scripts.register(client, [*COMMON_FILES, "trim.lua"], [LOG_KEYS, TRIM])
        self.fair_share = FairShareStore(backend)
        self._known_namespaces: set[str] = set()
        self._expiry_hints: dict[str, int] = {}

    # ---- namespaces in use ----

    async def note_namespace(self, namespace: str) -> None:
        """Record that a namespace holds data (once per process), so the sweeper visits it."""
        if namespace not in self._known_namespaces:
            await self.redis.sadd(layout.namespaces(), namespace)
            self._known_namespaces.add(namespace)

    async def namespaces(self) -> list[str]:
        """Namespaces that hold data. Any this process noted that Redis has forgotten (it
        restarted empty or failed over) are noted again, or the sweeper would skip them."""
        found = {text(n) for n in await self.redis.smembers(layout.namespaces())}
        lost = self._known_namespaces - found
        if lost:
            await self.redis.sadd(layout.namespaces(), *lost)
        return sorted(found | lost)

    def take_expiry_hints(self) -> dict[str, int]:
        """Earliest expiry this process wrote per namespace since the last call."""
        hints, self._expiry_hints = self._expiry_hints, {}
        return hints

    async def next_expiry(self, namespace: str) -> int | None:
        """When the namespace's next entry is due to expire (ms), if any."""
        first = await self.redis.zrange(layout.expiries(namespace), 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    # ---- writes ----

    def write_keys(self, namespace: str, key: str, message_id: str | None, agent_id: str
                   ) -> list[str]:
        return WRITE_KEYS.pack(
            entry=layout.entry(namespace, key), history=layout.history(namespace, key),
            index=layout.index(namespace), ttl=layout.expiries(namespace),
            log=layout.changelog(namespace),
            # Every key of a script shares the namespace's slot, the unused one too.
            idem=layout.idempotency(namespace, agent_id, message_id or ""),
            meta=layout.meta(namespace), usage=layout.usage(namespace),
            audit=layout.audit(namespace))

    def write_args(self, namespace: str, key: str, req: WriteRequest) -> list[Any]:
        """The arguments of one write (WRITE), for put.lua, delete.lua and amp_commit.lua."""
        expires_at = req.now + req.ttl_seconds * 1000 if req.ttl_seconds is not None else None
        if expires_at is not None:
            hinted = self._expiry_hints.get(namespace, expires_at)
            self._expiry_hints[namespace] = min(hinted, expires_at)
        return WRITE.pack(
            key=key, now=req.now, agent=req.agent_id, ts=req.timestamp,
            ts_from_client="1" if req.timestamp_from_client else "0",
            mode=req.mode, priority=req.priority, default_priority=req.default_priority,
            if_version=_opt(req.if_version), if_absent="1" if req.if_absent else "0",
            internal_cas="1" if req.internal_cas else "0",
            entry_id=req.entry_id, value=req.value, ttl=_opt(req.ttl_seconds),
            exp=_opt(expires_at), schema_errors=req.schema_errors, conflicts=req.conflicts,
            history_limit=self.history_limit if req.history_limit is None else req.history_limit,
            log_maxlen=self.changelog_maxlen, remember="1" if req.message_id else "0",
            idem_window_ms=self.idempotency_window_ms, fingerprint=req.fingerprint,
            actor=req.actor, key_id=req.key_id, request_id=req.request_id,
            content_hash=content_hash(req.value), action=req.action)

    async def put(self, namespace: str, key: str, req: WriteRequest, gate: Gate | None = None
                  ) -> WriteOutcome:
        """One put, held to `gate`. A namespace whose byte count is not exact yet is counted
        first; a write over a key or byte quota is tried once more after expiring the
        namespace's due entries (expiries free quota at once, not at the sweeper's next run),
        without taking its tokens again."""
        await self.note_namespace(namespace)
        gate = gate or open_gate(namespace)
        keys = [*self.write_keys(namespace, key, req.message_id, req.agent_id), *gate.keys]
        args = self.write_args(namespace, key, req)
        # Under a message id the script replays its first reply: safe to send again.
        replayable = bool(req.message_id)
        outcome = WriteOutcome.decode(await self.backend.call(
            self._put, keys, [*args, *gate.args], durable=True, replayable=replayable))
        if outcome.status == "uncounted":
            await self.fair_share.recount(namespace)
        elif not (outcome.status == "quota_exceeded"
                  and await self.expire_due(namespace, req.now, 1000)):
            return outcome
        retry = replace(gate, cost=0)
        return WriteOutcome.decode(await self.backend.call(
            self._put, keys, [*args, *retry.args], durable=True, replayable=replayable))

    async def delete(self, namespace: str, key: str, req: WriteRequest, gate: Gate | None = None
                     ) -> WriteOutcome:
        gate = gate or open_gate(namespace)
        raw = await self.backend.call(
            self._delete, [*self.write_keys(namespace, key, req.message_id, req.agent_id),
                           *gate.keys],
            [*self.write_args(namespace, key, req), *gate.args], durable=True,
            replayable=bool(req.message_id))
        return WriteOutcome.decode(raw)

    async def expire_due(self, namespace: str, now: int, batch: int) -> int:
        """Expire up to `batch` due entries of a namespace; returns how many it expired."""
        due = await self.redis.zrangebyscore(layout.expiries(namespace), "-inf", now, 0, batch)
        if not due:
            return 0
        names = [text(k) for k in due]
        keys = NAMESPACE_KEYS.pack(index=layout.index(namespace), ttl=layout.expiries(namespace),
                                   log=layout.changelog(namespace), meta=layout.meta(namespace),
                                   usage=layout.usage(namespace),
                                   audit=layout.audit(namespace))
        for name in names:
            keys += ENTRY_KEYS.pack(entry=layout.entry(namespace, name),
                                    history=layout.history(namespace, name))
        args = EXPIRE.pack(now=now, history_limit=self.history_limit,
                           log_maxlen=self.changelog_maxlen, names=names)
        return int(await self.backend.call(self._expire, keys, args))

    async def trim_changelog(self, namespace: str, before_ms: int, batch: int) -> int:
        """Drop up to `batch` change-log records logged before `before_ms`."""
        keys = LOG_KEYS.pack(log=layout.changelog(namespace), meta=layout.meta(namespace))
        args = TRIM.pack(upto=max(before_ms - 1, 0), count=batch)
        return int(await self.backend.call(self._trim, keys, args))

    async def erase(self, namespace: str, keys: Sequence[str]) -> int:
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
            pipe.hdel(layout.usage(namespace), "counted")  # the next quota check recounts
            await pipe.execute()
        return len(doomed)

    # ---- reads ----

    async def get(self, namespace: str, key: str, now: int) -> Entry | None:
        fields = await self.backend.hgetall(layout.entry(namespace, key))
        return live_entry(namespace, key, fields, now)

    async def get_held(self, namespace: str, key: str, now: int, gate: Gate
                       ) -> tuple[Entry | None, tuple[str, str] | None]:
        """`get` that first takes the read's tokens of `gate`, in the same script call: the
        entry, or the refusal (scope, retry_ms) and nothing read."""
        fields, refused = await self.fair_share.admit_read(gate, layout.entry(namespace, key))
        if fields is None:
            return None, refused
        return live_entry(namespace, key, fields, now), None

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
        names = [text(k) for k in found]
        return names, len(names) == count

    async def get_many(self, namespace: str, keys: list[str], now: int) -> list[Entry]:
        """The live entries of these keys; one that cannot be read is left out (and logged),
        so that it does not hide the others."""
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(layout.entry(namespace, key))
            rows = await pipe.execute(raise_on_error=False)
        entries = []
        for key, row in zip(keys, rows, strict=True):
            try:
                if isinstance(row, Exception):
                    raise corrupt(row, layout.entry(namespace, key))
                entry = live_entry(namespace, key, row, now)
            except CorruptRecord as exc:
                skipped(exc)
                continue
            if entry is not None:
                entries.append(entry)
        return entries

    async def history(self, namespace: str, key: str, limit: int) -> list[Entry]:
        """The key's recent versions, newest first; one that cannot be read is left out."""
        try:
            rows = await self.redis.lrange(layout.history(namespace, key), 0, limit - 1)
        except ResponseError as exc:
            raise corrupt(exc, layout.history(namespace, key)) from None
        versions = []
        for row in rows:
            try:
                versions.append(entry_from_fields(
                    namespace, key, _history_row(cast(bytes, row), namespace, key)))
            except CorruptRecord as exc:
                skipped(exc)
        return versions
