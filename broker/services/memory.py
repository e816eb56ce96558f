"""Memory operations (put, get, query, delete, history), shared by REST and protocol messages."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.grammar import compile_pattern, validate_key, validate_namespace
from broker.core.models import Entry, Page, Proposal
from broker.core.uuids import uuid4
from broker.core.values import canonical, encode_value
from broker.runtime.settings import Settings
from broker.services.activity import AgentActivity
from broker.services.approval import ApprovalGate, Proposed
from broker.services.auth import Principal
from broker.services.conflicts import MISSING, Conflict, merge, merge_base, merged_into
from broker.services.fields import (
    check_limit,
    check_message_id,
    check_timestamp,
    check_ttl,
    check_value_size,
    check_version,
    decode_cursor,
    encode_cursor,
)
from broker.services.idempotency import fingerprint, reused
from broker.services.limits import FairShare
from broker.services.locks import KeyLocks
from broker.services.namespaces import NamespaceRegistry, NamespaceState
from broker.services.visibility import ReadPolicy
from broker.storage import fairshare
from broker.storage.entries import EntryStore
from broker.storage.records import WriteOutcome, WriteRequest


@dataclass(frozen=True, slots=True)
class PutOptions:
    ttl_seconds: int | None = None
    timestamp: int | None = None
    message_id: str | None = None
    if_version: int | None = None
    if_absent: bool = False
    base_version: int | None = None
    approval_required: bool = False


_MODES = {"last-write-wins": "lww", "agent-priority": "priority", "merge": "merge"}
# A merge retries its compare-and-set until it lands or the key stays contended this long.
_MERGE_BUDGET_SECONDS = 10.0


class MemoryService:
    """Checks, authorises and runs memory operations against the store."""

    def __init__(self, settings: Settings, store: EntryStore, namespaces: NamespaceRegistry,
                 activity: AgentActivity, clock: Clock, cells: ReadPolicy,
                 fair_share: FairShare, approvals: ApprovalGate | None = None) -> None:
        self.settings = settings
        self.fair_share = fair_share
        self.store = store
        self.namespaces = namespaces
        self.activity = activity
        self.clock = clock
        self.cells = cells
        self._merges = KeyLocks()
        self.approvals = approvals  # where gated writes go (broker/governance/gate.py)

    def _target(self, principal: Principal, permission: str, namespace: str, key: str
                ) -> tuple[str, str]:
        validate_namespace(namespace)
        self.cells.refuse_write(namespace)
        principal.require(permission, namespace)
        validate_key(key, self.settings.max_key_bytes)
        return namespace, key

    async def _readable(self, principal: Principal, namespace: str, key: str | None,
                        permission: str = "read", rate: bool = True) -> None:
        """Check a read: the namespace, the caller's right, the key, and the read rates (a
        stream's snapshot pages are not reads: its stream is counted instead; `rate` False:
        the caller takes the tokens itself)."""
        validate_namespace(namespace)
        await self.namespaces.require(principal, permission, namespace)
        if key is not None:
            validate_key(key, self.settings.max_key_bytes)
        if permission != "subscribe" and rate:
            limits = (await self.namespaces.state(namespace)).config.limits
            await self.fair_share.check_read(principal, namespace, limits, self.clock())

    def _write_request(self, principal: Principal, namespace: str, state: NamespaceState,
                       strategy: str, timestamp: int | None, message_id: str | None,
                       **fields: Any) -> WriteRequest:
        check_message_id(message_id)
        now = self.clock()
        check_timestamp(timestamp, now, self.settings)
        self.activity.seen(namespace, principal.agent_id, now)
        return WriteRequest(
            agent_id=principal.writer_id, now=now,
            timestamp=timestamp if timestamp is not None else now,
            timestamp_from_client=timestamp is not None, message_id=message_id,
            mode=_MODES[strategy], priority=state.priority_of(principal.writer_id),
            default_priority=state.config.default_priority,
            history_limit=state.config.history_limit, actor=principal.writer_id,
            key_id=principal.key_id or "", request_id=principal.request_id or message_id or "",
            **fields,
        )

    async def _schema_errors(self, state: NamespaceState, namespace: str, key: str, value: Any,
                             size: int) -> str:
        """Validate against every matching schema: raise for an enforcing one, else return the
        errors to store with the entry ("" when it conforms)."""
        if not state.schemas_for(key):
            return ""
        errors, enforced = await self.namespaces.validate(state, namespace, key, value, size)
        if enforced:
            raise MempError("schema_violation", "the value does not conform to an enforcing "
                            "schema; nothing was written", {"errors": errors})
        return msgspec.json.encode(errors).decode() if errors else ""

    async def check_schemas(self, namespace: str, key: str, value: bytes) -> str:
        """The schema errors to store with `value` under today's schemas (an approval writes
        against them); an enforcing schema's failure raises 422."""
        state = await self.namespaces.state(namespace)
        return await self._schema_errors(state, namespace, key, msgspec.json.decode(value),
                                         len(value))

    async def put(self, principal: Principal, namespace: str, key: str, value: msgspec.Raw,
                  options: PutOptions) -> tuple[Entry, bool]:
        """Write a value; returns the entry written and whether the write created it."""
        self._target(principal, "write", namespace, key)
        check_value_size(len(value), self.settings)
        decoded, encoded = canonical(value)
        sent = fingerprint("put", key, encoded, options.ttl_seconds, options.timestamp,
                           options.if_version, options.if_absent, options.base_version) \
            if options.message_id else ""
        check_ttl(options.ttl_seconds, self.settings)
        check_version(options.if_version)
        check_version(options.base_version)
        state = await self.namespaces.state(namespace)
        gate = self.fair_share.gate(principal, namespace, "w", state.config.limits)
        self.fair_share.check_closed(gate, self.clock(), options.message_id)
        strategy = state.strategy_for(key)
        if options.ttl_seconds is None and state.config.default_ttl_seconds is not None:
            options = replace(options, ttl_seconds=state.config.default_ttl_seconds)
        if options.approval_required or state.requires_approval(key):
            raise Proposed(await self._propose(principal, namespace, key, decoded, options,
                                               state, sent, strategy, gate))
        if strategy == "merge":
            return await self._merge_put(principal, namespace, key, decoded, options, state,
                                         sent)
        request = self._write_request(
            principal, namespace, state, strategy, options.timestamp, options.message_id,
            value=encoded, entry_id=uuid4(), ttl_seconds=options.ttl_seconds,
            if_version=options.if_version, if_absent=options.if_absent,
            schema_errors=await self._schema_errors(state, namespace, key, decoded,
                                                    len(encoded)),
            fingerprint=sent,
        )
        outcome = await self.store.put(namespace, key, request, gate)
        self.fair_share.check_write(outcome, gate, request.now)
        return _settle(outcome, namespace, key, encoded, options.message_id), outcome.created

    async def _merge_put(self, principal: Principal, namespace: str, key: str,
                         incoming: Any, options: PutOptions, state: NamespaceState,
                         sent: str) -> tuple[Entry, bool]:
        """Read, merge and write with compare-and-set on the version read. Merges of one key
        take turns within this process, so only writers on other processes can race one; a
        lost race is retried (with growing, jittered pauses) until it lands."""
        async with self._merges.hold((namespace, key)):
            return await self._merge_until_applied(principal, namespace, key, incoming,
                                                   options, state, sent)

    async def _merge_until_applied(self, principal: Principal, namespace: str, key: str,
                                   incoming: Any, options: PutOptions, state: NamespaceState,
                                   sent: str) -> tuple[Entry, bool]:
        deadline = time.monotonic() + _MERGE_BUDGET_SECONDS
        for attempt in itertools.count(1):
            current = await self.store.get(namespace, key, self.clock())
            if options.if_absent and current is not None:
                raise _precondition(current)
            if options.if_version is not None and (
                    current is None or current.version != options.if_version):
                raise _precondition(current)
            merged: Any = incoming
            conflicts: list[Conflict] = []
            if current is not None:
                merged, conflicts = await self._merge_with(namespace, key, current, incoming,
                                                           principal.writer_id, options, state)
            encoded = encode_value(merged)
            check_value_size(len(encoded), self.settings)
            request = self._write_request(
                principal, namespace, state, "merge", options.timestamp, options.message_id,
                value=encoded, entry_id=uuid4(), ttl_seconds=options.ttl_seconds,
                if_version=current.version if current else None, if_absent=current is None,
                internal_cas=True,
                schema_errors=await self._schema_errors(state, namespace, key, merged,
                                                        len(encoded)),
                conflicts=msgspec.json.encode(conflicts).decode() if conflicts else "",
                fingerprint=sent,
            )
            # A retry after a lost race is the same write: its tokens were taken once.
            gate = self.fair_share.gate(principal, namespace, "w", state.config.limits,
                                        cost=1 if attempt == 1 else 0)
            outcome = await self.store.put(namespace, key, request, gate)
            self.fair_share.check_write(outcome, gate, request.now)
            if outcome.status != "precondition_failed" or outcome.replayed:
                return _settle(outcome, namespace, key, encoded, options.message_id), \
                    outcome.created
            if time.monotonic() > deadline:
                raise MempError(
                    "write_conflict", f"the key kept changing for {_MERGE_BUDGET_SECONDS:.0f} s "
                    f"({attempt} attempts); nothing was written: retry the write",
                    {"key": key, "attempts": attempt, "retryable": True,
                     "current_version": current.version if current else 0})
            await asyncio.sleep(random.uniform(0, min(0.001 * 2 ** min(attempt, 6), 0.05)))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _merge_with(self, namespace: str, key: str, current: Entry, incoming: Any,
                          writer: str, options: PutOptions, state: NamespaceState
                          ) -> tuple[Any, list[Conflict]]:
        stored = merged_into(current.value, key)
        base: Any = MISSING
        if options.base_version is not None:
            if options.base_version == current.version:
                base = stored
            else:
                kept = await self.store.history(namespace, key, self.settings.max_history_limit)
                for version in kept:
                    if version.version == options.base_version and version.value is not None:
                        base = merge_base(version.value)
        return merge(stored, incoming, base=base, base_known=options.base_version is not None,
                     stored_agent=current.agent_id, incoming_agent=writer,
                     arrays=state.config.merge_arrays)

    async def _propose(self, principal: Principal, namespace: str, key: str, incoming: Any,
                       options: PutOptions, state: NamespaceState, sent: str, strategy: str,
                       limit: fairshare.Gate) -> Proposal:
        """Hand a gated put, merge or delete (`strategy` "delete") to the approvals, as the
        request its approval will write against the current version; making the proposal
        takes the write's tokens (`limit`)."""
        if self.approvals is None:
            raise MempError("internal", "approval is required but proposals are not served")
        current = await self.store.get(namespace, key, self.clock())
        if (options.if_absent and current is not None) or (options.if_version is not None and (
                current is None or current.version != options.if_version)):
            raise _precondition(current)
        if strategy == "delete" and current is None:
            raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
        request = await self.proposal_request(principal.writer_id, principal, namespace, key,
                                              incoming, current, options, state, strategy)
        request = replace(request, fingerprint=sent)
        operation = strategy if strategy in ("delete", "merge") else "put"
        return await self.approvals.propose(principal, namespace, key, operation, current, request,
                                       incoming, limit)

    async def proposal_request(self, writer: str, principal: Principal, namespace: str,
                               key: str, incoming: Any, current: Entry | None,
                               options: PutOptions, state: NamespaceState, strategy: str
                               ) -> WriteRequest:
        """The write a proposal stands for, against `current`: a merge is merged with it
        (conflicts flagged against `options.base_version`), values are schema-checked."""
        if strategy == "delete":
            return replace(self._write_request(principal, namespace, state, "last-write-wins",
                                               None, options.message_id), agent_id=writer)
        value: Any = incoming
        conflicts: list[Conflict] = []
        if strategy == "merge" and current is not None:
            value, conflicts = await self._merge_with(namespace, key, current, incoming, writer,
                                                      options, state)
        encoded = encode_value(value)
        check_value_size(len(encoded), self.settings)
        request = self._write_request(
            principal, namespace, state, strategy, None, options.message_id, value=encoded,
            entry_id=uuid4(), ttl_seconds=options.ttl_seconds,
            schema_errors=await self._schema_errors(state, namespace, key, value, len(encoded)),
            conflicts=msgspec.json.encode(conflicts).decode() if conflicts else "")
        return replace(request, agent_id=writer, priority=state.priority_of(writer))

    async def delete(self, principal: Principal, namespace: str, key: str, *,
                     timestamp: int | None = None, message_id: str | None = None,
                     if_version: int | None = None, approval_required: bool = False) -> Entry:
        self._target(principal, "write", namespace, key)
        check_version(if_version)
        state = await self.namespaces.state(namespace)
        sent = fingerprint("delete", key, timestamp, if_version) if message_id else ""
        gate = self.fair_share.gate(principal, namespace, "w", state.config.limits)
        self.fair_share.check_closed(gate, self.clock(), message_id)
        if approval_required or state.requires_approval(key):
            raise Proposed(await self._propose(
                principal, namespace, key, None,
                PutOptions(message_id=message_id, if_version=if_version), state, sent,
                "delete", gate))
        request = self._write_request(principal, namespace, state, state.strategy_for(key),
                                      timestamp, message_id, if_version=if_version,
                                      fingerprint=sent)
        outcome = await self.store.delete(namespace, key, request, gate)
        self.fair_share.check_write(outcome, gate, request.now)
        return _settle(outcome, namespace, key, None, message_id)

    async def get(self, principal: Principal, namespace: str, key: str) -> Entry:
        """One entry; its read rate is checked in the same script call that reads it."""
        await self._readable(principal, namespace, key, rate=False)
        now = self.clock()
        limits = (await self.namespaces.state(namespace)).config.limits
        gate = self.fair_share.read_gate(principal, namespace, limits, now)
        if gate is None:
            entry = await self.store.get(namespace, key, now)
        else:
            entry, refused = await self.store.get_held(namespace, key, now, gate)
            if refused is not None:
                raise self.fair_share.refuse_read(gate, refused, now)
        self.activity.seen(namespace, principal.agent_id, now)
        if entry is None or (self.cells.guards(namespace) and not self.cells.shows(
                self.cells.viewer(principal), entry, now)):
            raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
        return entry

    async def query(self, principal: Principal, namespace: str, pattern_text: str,
                    cursor: str | None = None, limit: int | None = None,
                    permission: str = "read") -> Page:
        await self._readable(principal, namespace, None, permission)
        pattern = compile_pattern(pattern_text, self.settings.max_key_bytes)
        limit = check_limit(limit, self.settings.default_query_limit,
                            self.settings.max_query_limit)
        after = decode_cursor(cursor)
        now = self.clock()
        self.activity.seen(namespace, principal.agent_id, now)
        matched: list[str] = []
        scanned = 0
        more = True
        while more and len(matched) < limit and scanned < self.settings.max_query_scan:
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
        if self.cells.guards(namespace):
            entries = self.cells.shown(self.cells.viewer(principal), entries, now)
        next_cursor = encode_cursor(after) if more and after is not None else None
        return Page(entries=entries, next_cursor=next_cursor)

    async def history(self, principal: Principal, namespace: str, key: str,
                      limit: int | None = None) -> list[Entry]:
        await self._readable(principal, namespace, key)
        kept = (await self.namespaces.state(namespace)).config.history_limit
        most = max(self.settings.history_limit if kept is None else kept, 1)
        limit = check_limit(limit, most, most)
        versions = await self.store.history(namespace, key, limit)
        if not self.cells.guards(namespace):
            return versions
        shown = self.cells.history(self.cells.viewer(principal), versions, self.clock())
        if shown is None:
            raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
        return shown


def entry_warnings(entry: Entry) -> list[str]:
    """What a writer should look at: schema violations and flagged merge conflicts."""
    warnings = []
    if entry.schema_violation:
        warnings.append("schema_violation")
    if entry.conflicts is not msgspec.UNSET:
        warnings.append("conflicts")
    return warnings


def _settle(outcome: WriteOutcome, namespace: str, key: str, value: bytes | None,
            message_id: str | None) -> Entry:
    """Turn a script's verdict into the entry written, or the error the client gets."""
    if outcome.status == "ok":
        return outcome.entry(namespace, key, value)
    if outcome.status == "reused":
        raise reused(message_id)
    current = outcome.entry(namespace, key)
    if outcome.status == "write_conflict":
        raise MempError(
            "write_conflict",
            "the stored entry wins (newer timestamp or higher agent priority); this write was "
            "not applied",
            {"winner": current},
        )
    if outcome.status == "not_found":
        raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
    raise _precondition(None if current.deleted else current, current.version)


def _precondition(current: Entry | None, version: int | None = None) -> MempError:
    details: dict[str, object] = {
        "current_version": version if version is not None else (current.version if current
                                                                 else 0)}
    if current is not None:
        details["current"] = current
    return MempError("precondition_failed", "the entry's version does not match the condition",
                     details)
