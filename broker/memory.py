"""Memory operations (put, get, query, delete, history), shared by REST and protocol messages."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import msgspec

from broker import layout
from broker.activity import AgentActivity
from broker.auth import Principal
from broker.clock import Clock
from broker.errors import MempError
from broker.keys import compile_pattern, validate_key, validate_namespace
from broker.models import Entry, Page
from broker.settings import Settings
from broker.store import Store, WriteOutcome, WriteRequest
from broker.validation import (
    check_limit,
    check_message_id,
    check_timestamp,
    check_ttl,
    check_value_size,
    check_version,
    decode_cursor,
    encode_cursor,
)

_SCAN_BUDGET = 10_000


@dataclass(frozen=True, slots=True)
class PutOptions:
    ttl_seconds: int | None = None
    timestamp: int | None = None
    message_id: str | None = None
    if_version: int | None = None
    if_absent: bool = False


class MemoryService:
    """Checks, authorises and runs memory operations against the store."""

    def __init__(self, settings: Settings, store: Store, activity: AgentActivity,
                 clock: Clock) -> None:
        self.settings = settings
        self.store = store
        self.activity = activity
        self.clock = clock

    def _target(self, principal: Principal, permission: str, namespace: str, key: str
                ) -> tuple[str, str]:
        validate_namespace(namespace)
        principal.require(permission, namespace)
        validate_key(key, self.settings.max_key_bytes)
        return namespace, key

    def _write_request(self, principal: Principal, namespace: str, now: int,
                       timestamp: int | None, message_id: str | None) -> WriteRequest:
        check_message_id(message_id)
        check_timestamp(timestamp, now, self.settings)
        self.activity.seen(namespace, principal.agent_id, now)
        idem = layout.idempotency(namespace, principal.writer_id, message_id) if message_id \
            else ""
        return WriteRequest(
            agent_id=principal.writer_id, now=now,
            timestamp=timestamp if timestamp is not None else now,
            timestamp_from_client=timestamp is not None, idempotency_key=idem,
        )

    async def put(self, principal: Principal, namespace: str, key: str, value: msgspec.Raw,
                  options: PutOptions) -> Entry:
        self._target(principal, "write", namespace, key)
        check_value_size(len(value), self.settings)
        check_ttl(options.ttl_seconds, self.settings)
        check_version(options.if_version)
        now = self.clock()
        base = self._write_request(principal, namespace, now, options.timestamp,
                                   options.message_id)
        request = WriteRequest(
            agent_id=base.agent_id, now=now, timestamp=base.timestamp,
            timestamp_from_client=base.timestamp_from_client,
            idempotency_key=base.idempotency_key, value=bytes(value),
            entry_id=str(uuid.uuid4()), ttl_seconds=options.ttl_seconds,
            if_version=options.if_version, if_absent=options.if_absent,
        )
        outcome = await self.store.put(namespace, key, request)
        return _settle(outcome, namespace, key, bytes(value))

    async def delete(self, principal: Principal, namespace: str, key: str, *,
                     timestamp: int | None = None, message_id: str | None = None,
                     if_version: int | None = None) -> Entry:
        self._target(principal, "write", namespace, key)
        check_version(if_version)
        now = self.clock()
        base = self._write_request(principal, namespace, now, timestamp, message_id)
        request = WriteRequest(
            agent_id=base.agent_id, now=now, timestamp=base.timestamp,
            timestamp_from_client=base.timestamp_from_client,
            idempotency_key=base.idempotency_key, if_version=if_version,
        )
        outcome = await self.store.delete(namespace, key, request)
        return _settle(outcome, namespace, key, None)

    async def get(self, principal: Principal, namespace: str, key: str) -> Entry:
        self._target(principal, "read", namespace, key)
        now = self.clock()
        self.activity.seen(namespace, principal.agent_id, now)
        entry = await self.store.get(namespace, key, now)
        if entry is None:
            raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
        return entry

    async def query(self, principal: Principal, namespace: str, pattern_text: str,
                    cursor: str | None = None, limit: int | None = None,
                    permission: str = "read") -> Page:
        validate_namespace(namespace)
        principal.require(permission, namespace)
        pattern = compile_pattern(pattern_text, self.settings.max_key_bytes)
        limit = check_limit(limit, self.settings.default_query_limit,
                            self.settings.max_query_limit)
        after = decode_cursor(cursor)
        now = self.clock()
        self.activity.seen(namespace, principal.agent_id, now)
        matched: list[str] = []
        scanned = 0
        more = True
        while more and len(matched) < limit and scanned < _SCAN_BUDGET:
            batch = limit - len(matched) if pattern.is_prefix or pattern.is_exact \
                else max(256, limit)
            keys, more = await self.store.scan_keys(namespace, pattern, after, batch)
            scanned += len(keys)
            for name in keys:
                after = name
                if pattern.matches(name):
                    matched.append(name)
                    if len(matched) == limit:
                        more = more or name != keys[-1]
                        break
        entries = await self.store.get_many(namespace, matched, now)
        next_cursor = encode_cursor(after) if more and after is not None else None
        return Page(entries=entries, next_cursor=next_cursor)

    async def history(self, principal: Principal, namespace: str, key: str,
                      limit: int | None = None) -> list[Entry]:
        self._target(principal, "read", namespace, key)
        limit = check_limit(limit, max(self.settings.history_limit, 1),
                            max(self.settings.history_limit, 1))
        return await self.store.history(namespace, key, limit)


def _settle(outcome: WriteOutcome, namespace: str, key: str, value: bytes | None) -> Entry:
    """Turn a script's verdict into the entry written, or the error the client gets."""
    if outcome.status == "ok":
        return outcome.entry(namespace, key, value)
    current = outcome.entry(namespace, key)
    if outcome.status == "write_conflict":
        raise MempError(
            "write_conflict",
            "a newer write is stored; this write was not applied",
            {"winner": current},
        )
    if outcome.status == "not_found":
        raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
    details: dict[str, object] = {"current_version": current.version}
    if not current.deleted:
        details["current"] = current
    raise MempError("precondition_failed", "the entry's version does not match the condition",
                    details)
