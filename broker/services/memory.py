"""Memory writes (put, merge, delete, and writes gated by approval), shared by REST, protocol
messages and MCP; the reads (get, query, history) are in broker/services/reads.py."""

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
from broker.core.grammar import validate_key, validate_namespace
from broker.core.models import Entry
from broker.core.uuids import uuid4
from broker.core.values import canonical, encode_value
from broker.runtime.settings import Settings
from broker.services.activity import AgentActivity
from broker.services.approval import ApprovalGate, Proposed
from broker.services.auth import Principal
from broker.services.conflicts import MISSING, Conflict, merge, merge_base, merged_into
from broker.services.fields import (
    check_message_id,
    check_timestamp,
    check_ttl,
    check_value_size,
    check_version,
)
from broker.services.idempotency import asks_approval, fingerprint
from broker.services.limits import FairShare
from broker.services.locks import KeyLocks
from broker.services.namespaces import NamespaceRegistry, NamespaceState
from broker.services.outcomes import precondition, settle
from broker.services.reads import MemoryReads
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


class MemoryService(MemoryReads):
    """Checks, authorises and runs memory operations against the store: the writes here, the
    reads in MemoryReads."""

    def __init__(self, settings: Settings, store: EntryStore, namespaces: NamespaceRegistry,
                 activity: AgentActivity, clock: Clock, cells: ReadPolicy,
                 fair_share: FairShare, approvals: ApprovalGate | None = None) -> None:
        super().__init__(settings, store, namespaces, activity, clock, cells, fair_share)
        self._merges = KeyLocks()
        self.approvals = approvals  # where gated writes go (broker/governance/gate.py)

    def _target(self, principal: Principal, permission: str, namespace: str, key: str
                ) -> tuple[str, str]:
        validate_namespace(namespace)
        self.cells.refuse_write(namespace)
        principal.require(permission, namespace)
        validate_key(key, self.settings.max_key_bytes)
        return namespace, key

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
                           options.if_version, options.if_absent, options.base_version,
                           *asks_approval(options.approval_required)) \
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
            first = await self._propose(principal, namespace, key, decoded, options, state,
                                        sent, strategy, gate)
            return await self._settle(first, namespace, key,
                                      None if strategy == "merge" else encoded,
                                      options.message_id), first.created
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
        return await self._settle(outcome, namespace, key, encoded, options.message_id), \
            outcome.created

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
                raise precondition(current)
            if options.if_version is not None and (
                    current is None or current.version != options.if_version):
                raise precondition(current)
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
                return await self._settle(outcome, namespace, key, encoded,
                                          options.message_id), outcome.created
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
                kept = await self._kept(namespace, key, options.base_version)
                if kept is not None:
                    base = merge_base(kept)
        return merge(stored, incoming, base=base, base_known=options.base_version is not None,
                     stored_agent=current.agent_id, incoming_agent=writer,
                     arrays=state.config.merge_arrays)

    async def _propose(self, principal: Principal, namespace: str, key: str, incoming: Any,
                       options: PutOptions, state: NamespaceState, sent: str, strategy: str,
                       limit: fairshare.Gate) -> WriteOutcome:
        """Hand a gated put, merge or delete (`strategy` "delete") to the approvals, as the
        request its approval will write against the current version, and raise Proposed;
        making the proposal takes the write's tokens (`limit`). Returns only the first
        outcome of a message id first used for a write, before the key was gated."""
        if self.approvals is None:
            raise MempError("internal", "approval is required but proposals are not served")
        current = await self.store.get(namespace, key, self.clock())
        if (options.if_absent and current is not None) or (options.if_version is not None and (
                current is None or current.version != options.if_version)):
            raise precondition(current)
        if strategy == "delete" and current is None:
            raise MempError("not_found", f"no entry at key {key!r}", {"key": key})
        request = await self.proposal_request(principal.writer_id, principal, namespace, key,
                                              incoming, current, options, state, strategy)
        request = replace(request, fingerprint=sent)
        operation = strategy if strategy in ("delete", "merge") else "put"
        made = await self.approvals.propose(principal, namespace, key, operation, current,
                                            request, incoming, limit)
        if isinstance(made, WriteOutcome):
            return made
        raise Proposed(made)

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
        sent = fingerprint("delete", key, timestamp, if_version,
                           *asks_approval(approval_required)) if message_id else ""
        gate = self.fair_share.gate(principal, namespace, "w", state.config.limits)
        self.fair_share.check_closed(gate, self.clock(), message_id)
        if approval_required or state.requires_approval(key):
            first = await self._propose(
                principal, namespace, key, None,
                PutOptions(message_id=message_id, if_version=if_version), state, sent,
                "delete", gate)
            return await self._settle(first, namespace, key, None, message_id)
        request = self._write_request(principal, namespace, state, state.strategy_for(key),
                                      timestamp, message_id, if_version=if_version,
                                      fingerprint=sent)
        outcome = await self.store.delete(namespace, key, request, gate)
        self.fair_share.check_write(outcome, gate, request.now)
        return await self._settle(outcome, namespace, key, None, message_id)

    async def _settle(self, outcome: WriteOutcome, namespace: str, key: str,
                      value: bytes | None, message_id: str | None) -> Entry:
        """The entry written, or the error, or the proposal (raised) that a message id was
        first answered with: a retried id gets its first reply whatever the gate says now.
        A replayed write without `value` (a merge's) is shown with the value it wrote."""
        if outcome.status == "proposed" and self.approvals is not None:
            raise Proposed(await self.approvals.replayed(namespace, outcome.record.get("id", "")))
        if value is None and outcome.replayed and outcome.status == "ok" \
                and not outcome.record.get("del"):
            kept = await self._kept(namespace, key, int(outcome.record.get("ver", 0)))
            value = None if kept is None else bytes(kept)
        return settle(outcome, namespace, key, value, message_id)

    async def _kept(self, namespace: str, key: str, version: int) -> msgspec.Raw | None:
        """The value `version` of the key wrote, while its history keeps it."""
        for kept in await self.store.history(namespace, key, self.settings.max_history_limit):
            if kept.version == version and kept.value is not None:
                return kept.value
        return None
