"""The audit log as callers see it: records appended for events that are not entry writes,
reading with filters (newest first, or the whole selection for export), and verifying the hash
chain. Entry writes append their records inside their own script (broker/storage/lua/audit.lua)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.grammar import glob_match, validate_key, validate_namespace
from broker.core.models import AuditPage, AuditRecord, AuditVerdict, Grant
from broker.services.auth import Principal
from broker.services.fields import check_limit
from broker.storage.audit import AuditStore, StoredAudit
from broker.storage.records import CorruptRecord

_SCAN_BATCH = 500
_MAX_SCAN = 10_000  # records looked at per page at most, as for queries
_POSITION_RE = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_ID_MAX = 2**64 - 1  # each half of a stream id
_INT_FIELDS = ("seq", "at", "version_before", "version_after")
_body_decoder = msgspec.json.Decoder(dict[str, Any])


def decode_record(stored: StoredAudit) -> AuditRecord:
    """An AuditRecord from its stored JSON (string fields; '' for none)."""
    try:
        raw = _body_decoder.decode(stored.body)
        fields = {k: (None if v == "" else v) for k, v in raw.items()}
        for name in _INT_FIELDS:
            value = fields.get(name)
            fields[name] = int(value) if value is not None else None
        details = fields.pop("details", None)
        details = msgspec.json.decode(details) if isinstance(details, str) else {}
        for extra in ("conflicts", "proposal", "approved_by"):
            value = fields.pop(extra, None)
            if value is not None:
                details[extra] = msgspec.json.decode(value) if extra == "conflicts" else value
        return AuditRecord(
            id=stored.position, seq=fields["seq"] or 0, at=fields["at"] or 0,
            action=str(fields.get("action") or ""), actor=str(fields.get("actor") or ""),
            agent_id=fields.get("agent_id"), key_id=fields.get("key_id"), key=fields.get("key"),
            version_before=fields["version_before"], version_after=fields["version_after"],
            content_hash=fields.get("content_hash"), request_id=fields.get("request_id"),
            details=details if isinstance(details, dict) else {"value": details},
            prev=str(fields.get("prev") or ""), hash=stored.hash)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
        raise CorruptRecord(f"audit record {stored.position}: {exc}") from None


def _before(position: str) -> str | None:
    """The stream position just before `position` (None before the first possible one)."""
    ms, _, seq = position.partition("-")
    if int(seq) > 0:
        return f"{ms}-{int(seq) - 1}"
    return f"{int(ms) - 1}-{_ID_MAX}" if int(ms) > 0 else None


def _lowest(selection: AuditFilter) -> str:
    """The oldest position to read down to (inclusive): `since`, or just after `after`."""
    bounds: list[tuple[int, int]] = []
    if selection.since is not None:
        bounds.append((min(max(selection.since, 0), _ID_MAX), 0))
    if selection.after is not None:
        ms, seq = (int(part) for part in selection.after.split("-"))
        bounds.append((ms, seq + 1) if seq < _ID_MAX else (ms + 1, 0))
    if not bounds:
        return "-"
    low_ms, low_seq = max(bounds)
    return f"{min(low_ms, _ID_MAX)}-{low_seq}"


def _is_position(text: str) -> bool:
    match = _POSITION_RE.fullmatch(text)
    return match is not None and max(int(match[1]), int(match[2])) <= _ID_MAX


def parse_time(text: str | None, name: str) -> int | None:
    """A bound given as Unix ms or an ISO 8601 / RFC 3339 time."""
    if text is None or text == "":
        return None
    if text.isdigit() and len(text) <= 16:
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise MempError("invalid_request", f"{name} must be Unix milliseconds or an ISO 8601 "
                        "time", {"parameter": name}) from None
    if moment.tzinfo is None:
        raise MempError("invalid_request", f"{name} needs a time zone (Z or +hh:mm)",
                        {"parameter": name})
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """What a reader asks for: a time range (ms, both ends included) and exact matches."""

    since: int | None = None
    until: int | None = None
    after: str | None = None  # a record id: only records appended after it (an export's resume)
    actor: str | None = None
    key: str | None = None
    action: str | None = None

    def matches(self, record: AuditRecord) -> bool:
        return ((self.actor is None or record.actor == self.actor
                 or record.agent_id == self.actor or record.key_id == self.actor)
                and (self.key is None or record.key == self.key)
                and (self.action is None or record.action == self.action))


def actor_fields(principal: Principal) -> dict[str, str]:
    """Who acts, as an audit record names them."""
    return {"actor": principal.writer_id, "agent_id": principal.agent_id or "",
            "key_id": principal.key_id or "", "request_id": principal.request_id}


class AuditService:
    """Reads and appends the audit logs; reading needs `audit` (or admin) on the namespace."""

    def __init__(self, store: AuditStore, clock: Clock,
                 namespaces: Callable[[], Awaitable[list[str]]]) -> None:
        self.store = store
        self.clock = clock
        self.namespaces = namespaces  # every namespace holding data

    async def record_for_grants(self, grants: Sequence[Grant], action: str,
                                by: dict[str, str], details: dict[str, Any]) -> None:
        """A key's creation or revocation, in the log of every namespace its grants reach:
        those a grant names, and those holding data that a grant's glob matches."""
        named = {g.namespace for g in grants if "*" not in g.namespace}
        globs = [g.namespace for g in grants if "*" in g.namespace]
        reached = named | ({ns for ns in await self.namespaces()
                            if any(glob_match(glob, ns) for glob in globs)} if globs else set())
        for namespace in sorted(reached):
            await self.record(namespace, action, by, details=details)

    async def record(self, namespace: str, action: str, by: dict[str, str], *,
                     key: str = "", details: dict[str, Any] | None = None) -> None:
        """Append a record of an event that no entry write carries."""
        await self.store.append(namespace, {
            "at": str(self.clock()), "action": action, **by, "key": key,
            "details": msgspec.json.encode(details).decode() if details else ""})

    def _readable(self, principal: Principal, namespace: str) -> None:
        validate_namespace(namespace)
        principal.require("audit", namespace)

    @staticmethod
    def check_filter(selection: AuditFilter, max_key_bytes: int) -> AuditFilter:
        if selection.key is not None:
            validate_key(selection.key, max_key_bytes)
        if selection.after is not None and not _is_position(selection.after):
            raise MempError("invalid_request", "after must be an audit record id",
                            {"parameter": "after"})
        for name in ("actor", "action"):
            value = getattr(selection, name)
            if value is not None and not 0 < len(value) <= 200:
                raise MempError("invalid_request", f"{name} must be 1-200 characters",
                                {"parameter": name})
        return selection

    async def page(self, principal: Principal, namespace: str, selection: AuditFilter,
                   cursor: str | None, limit: int | None) -> AuditPage:
        """Records matching `selection`, newest first, from before `cursor`."""
        self._readable(principal, namespace)
        limit = check_limit(limit, 100, 1000)
        start = self._start(selection, cursor)
        downto = _lowest(selection)
        found: list[AuditRecord] = []
        if start is None:
            return AuditPage(records=found, next_cursor=None)
        upto, scanned = start, 0
        while scanned < _MAX_SCAN:
            batch = await self.store.newest_first(namespace, upto, downto, _SCAN_BATCH)
            scanned += len(batch)
            for i, stored in enumerate(batch):
                record = decode_record(stored)
                if selection.matches(record):
                    found.append(record)
                    if len(found) == limit:
                        more = i < len(batch) - 1 or len(batch) == _SCAN_BATCH
                        return AuditPage(records=found,
                                         next_cursor=stored.position if more else None)
            following = _before(batch[-1].position) if batch else None
            if len(batch) < _SCAN_BATCH or following is None:
                return AuditPage(records=found, next_cursor=None)
            upto = following
        return AuditPage(records=found, next_cursor=batch[-1].position)

    async def export(self, principal: Principal, namespace: str, selection: AuditFilter
                     ) -> AsyncIterator[AuditRecord]:
        """Every record of the selection, newest first (for NDJSON export)."""
        self._readable(principal, namespace)
        upto = self._start(selection, None)
        downto = _lowest(selection)
        while upto is not None:
            batch = await self.store.newest_first(namespace, upto, downto, _SCAN_BATCH)
            for stored in batch:
                record = decode_record(stored)
                if selection.matches(record):
                    yield record
            if len(batch) < _SCAN_BATCH:
                return
            upto = _before(batch[-1].position)

    @staticmethod
    def _start(selection: AuditFilter, cursor: str | None) -> str | None:
        """The newest position to read from (inclusive); None when nothing can match."""
        if cursor is not None:
            match = _POSITION_RE.fullmatch(cursor)
            if match is None or max(int(match[1]), int(match[2])) > _ID_MAX:
                raise MempError("invalid_request", "cursor is not one this broker issued",
                                {"cursor": cursor[:100]})
            return _before(cursor)
        if selection.until is None:
            return "+"
        return f"{min(selection.until, _ID_MAX)}-{_ID_MAX}" if selection.until >= 0 else None

    async def verify(self, principal: Principal, namespace: str) -> AuditVerdict:
        """Walk the chain from its anchor to its head: every record's hash must match its
        content, its `prev` the record before, its `seq` one more; the last must be the head."""
        self._readable(principal, namespace)
        chain = await self.store.chain(namespace)
        prev, seq, count, start = chain.anchor, chain.anchor_seq, 0, "-"
        end = chain.last_position
        while end is not None:
            batch = await self.store.oldest_first(namespace, start, end, _SCAN_BATCH)
            for stored in batch:
                broken = self._check(stored, prev, seq + 1)
                if broken is not None:
                    return AuditVerdict(ok=False, records=count, head=chain.head, broken=broken)
                prev, seq, count = stored.hash, seq + 1, count + 1
            if len(batch) < _SCAN_BATCH:
                break
            start = f"({batch[-1].position}"
        if prev != chain.head or seq != chain.seq:
            return AuditVerdict(ok=False, records=count, head=chain.head, broken={
                "id": None, "seq": seq + 1,
                "reason": f"the log ends at record {seq} but its head is record {chain.seq}: "
                          "newer records were removed"})
        return AuditVerdict(ok=True, records=count, head=chain.head)

    @staticmethod
    def _check(stored: StoredAudit, prev: str, seq: int) -> dict[str, Any] | None:
        def broken(reason: str) -> dict[str, Any]:
            return {"id": stored.position, "seq": seq, "reason": reason}

        if not stored.intact:
            return broken("its content does not match its hash (altered)")
        try:
            record = decode_record(stored)
        except CorruptRecord:
            return broken("its content is not a record")
        if record.seq != seq:
            return broken(f"expected record {seq}, found {record.seq}: records were removed "
                          "before it")
        if record.prev != prev:
            return broken("its link does not match the record before it (a record before it "
                          "was altered or removed)")
        return None
