"""The records the store keeps for memory entries: the stored field names (the one place they
are written down; the Lua scripts get them generated), decoding a stored entry, and a write's
request and verdict."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from broker.core.models import Entry
from broker.core.nesting import balanced
from broker.core.values import recanonical

# An entry hash's fields, in the order scripts flatten them: id, author, the canonical JSON
# value, version, created and updated (ms), last-write-wins timestamp, TTL (s), expiry (ms),
# tombstone flag, schema errors (JSON), merge conflicts (JSON), the writer's priority, and for
# an approved proposal the reviewer and the proposal id.
ENTRY_FIELDS = ("id", "agent", "val", "ver", "ca", "ua", "ts", "ttl", "exp", "del", "sv", "cf",
                "pr", "apb", "pid")
# The same but the value, which a write reads only for a reply that carries it.
ENTRY_META = tuple(name for name in ENTRY_FIELDS if name != "val")

RawHash = Mapping[bytes, bytes]
log = logging.getLogger("memp.store")


class CorruptRecord(ValueError):
    """A stored record that cannot be decoded; the message names the record and the field."""

    def __init__(self, message: str, record: str = "") -> None:
        super().__init__(message)
        self.record = record  # what it is: `entry ns/key`, `agent ns/id`, ...


def corrupt(exc: Exception, key: str = "") -> Exception:
    """What a Redis error reply means: a record that cannot be read (a script's `CORRUPT`
    error, or a key of the wrong type) is CorruptRecord; anything else stays as it was."""
    message = str(exc)
    if "CORRUPT " in message:  # Redis puts it first; the embedded store after a preamble
        record = message.split("CORRUPT ", 1)[1].split(" script:", 1)[0]
        return CorruptRecord(f"stored record {record}", record.split(" ", 1)[0].rstrip(":"))
    if message.startswith("WRONGTYPE") and key:
        return CorruptRecord(f"stored record {key} has the wrong type", key)
    return exc


def skipped(exc: CorruptRecord) -> None:
    """Log a record left out of a listing because it cannot be read."""
    log.warning("left out a corrupt record: %s", exc)


_raw_json = msgspec.json.Decoder(msgspec.Raw)


def _json(raw: bytes, name: str, where: str) -> bytes:
    """Stored JSON (a value, schema errors, conflicts), checked whole: well-formed UTF-8 JSON
    (a value that is not would make the reply that carries it unreadable). JSON nested deeper
    than the decoder reaches (stored before MEMP_MAX_JSON_DEPTH) is served as stored once its
    strings and brackets are seen to close."""
    try:
        raw.decode()
        _raw_json.decode(raw)
    except (UnicodeDecodeError, msgspec.DecodeError):
        raise CorruptRecord(f"{where}: field {name!r} is not JSON", where) from None
    except RecursionError:
        if not balanced(raw):
            raise CorruptRecord(f"{where}: field {name!r} is not JSON", where) from None
    return raw


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(fields: Mapping[str, Any], name: str, default: int | None, where: str) -> int | None:
    raw = _text(fields.get(name, ""))
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise CorruptRecord(f"{where}: field {name!r} holds {raw[:40]!r}, not a number",
                            where) from None


def entry_from_fields(namespace: str, key: str, fields: Mapping[str, Any]) -> Entry:
    """An Entry from an entry hash, a history record or a script's reply (text values)."""
    try:
        return _entry(namespace, key, fields)
    except UnicodeDecodeError:
        raise CorruptRecord(f"entry {namespace}/{key}: a field is not UTF-8",
                            f"entry {namespace}/{key}") from None


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value or b"")


def _entry(namespace: str, key: str, fields: Mapping[str, Any]) -> Entry:
    where = f"entry {namespace}/{key}"
    value = _bytes(fields.get("val"))
    deleted = _text(fields.get("del", "")) == "1"
    schema_errors = _bytes(fields.get("sv"))
    conflicts = _bytes(fields.get("cf"))
    if value and not deleted:
        _json(value, "val", where)
    if schema_errors:
        _json(schema_errors, "sv", where)
    if conflicts:
        _json(conflicts, "cf", where)
    return Entry(
        id=_text(fields.get("id", "")),
        agent_id=_text(fields.get("agent", "")),
        namespace=namespace,
        key=key,
        value=None if deleted or not value else msgspec.Raw(recanonical(value)),
        ttl_seconds=_int(fields, "ttl", None, where),
        version=_int(fields, "ver", 0, where) or 0,
        created_at=_int(fields, "ca", 0, where) or 0,
        updated_at=_int(fields, "ua", 0, where) or 0,
        timestamp=_int(fields, "ts", None, where),
        expires_at=_int(fields, "exp", None, where),
        schema_violation=bool(schema_errors),
        deleted=deleted,
        schema_errors=msgspec.Raw(schema_errors) if schema_errors else msgspec.UNSET,
        conflicts=msgspec.Raw(conflicts) if conflicts else msgspec.UNSET,
        approved_by=_text(fields.get("apb") or "") or msgspec.UNSET,
        proposal_id=_text(fields.get("pid") or "") or msgspec.UNSET,
    )


def _is_live(raw: RawHash, now: int) -> bool:
    """Whether an entry hash holds a live entry: not a tombstone, not expired."""
    if not raw or raw.get(b"del") == b"1":
        return False
    expires = raw.get(b"exp")
    return not (expires and expires.isdigit() and int(expires) <= now)


def live_entry(namespace: str, key: str, raw: RawHash, now: int) -> Entry | None:
    """The entry an entry hash holds, or None when it is a tombstone or has expired."""
    if not _is_live(raw, now):
        return None
    return entry_from_fields(namespace, key, {_text(k): v for k, v in raw.items()})


def live_value(key: str, raw: RawHash, now: int) -> tuple[bytes, int] | None:
    """The stored value and version of a live entry hash, without building an Entry (the
    lifecycle engine reads thousands at a time), or None when it is gone or has expired."""
    if not _is_live(raw, now) or not raw.get(b"val"):
        return None
    version = raw.get(b"ver", b"")
    if not version.isdigit():
        raise CorruptRecord(f"stored entry {key}: field 'ver' holds {version[:40]!r}, "
                            "not a number")
    return raw[b"val"], int(version)


@dataclass(slots=True)
class WriteRequest:
    """Everything a put or delete needs besides the namespace and key, in domain terms: the
    store turns the message id into its idempotency record. (Not frozen: a frozen dataclass
    sets each of its 18 fields through object.__setattr__, a visible cost per write.)"""

    agent_id: str
    now: int
    timestamp: int
    timestamp_from_client: bool
    message_id: str | None = None
    fingerprint: str = ""  # of the request behind the message id: a reused id is refused
    value: bytes = b""
    entry_id: str = ""
    ttl_seconds: int | None = None
    if_version: int | None = None
    if_absent: bool = False
    mode: str = "lww"  # lww, priority or merge
    priority: int = 0
    default_priority: int = 0
    internal_cas: bool = False  # if_version is the broker's own merge check: not remembered
    history_limit: int | None = None
    schema_errors: str = ""
    conflicts: str = ""
    actor: str = ""  # who acts, for the audit log: an agent, a key, a token subject or admin
    key_id: str = ""
    request_id: str = ""
    action: str = ""  # the audit record's action, when not the write's own (put or merge)


_outcome_decoder = msgspec.json.Decoder(tuple[str, dict[str, str]])


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """A script's verdict: `ok`, `precondition_failed`, `write_conflict`, `not_found`, or
    `reused` (the message id came with another request), with the entry it reports."""

    status: str
    record: dict[str, str]
    replayed: bool

    @classmethod
    def decode(cls, raw: list[Any]) -> WriteOutcome:
        """From a write script's reply: {'ok'|'replay'|'reused', the encoded verdict}."""
        status, payload = _text(raw[0]), raw[1]
        if status == "reused":
            return cls("reused", {}, replayed=True)
        try:
            stored_status, record = _outcome_decoder.decode(payload)
        except msgspec.DecodeError:  # the entry it reports holds bytes that are not UTF-8
            raise CorruptRecord("the entry a write reports has a field that is not UTF-8",
                                "entry") from None
        return cls(stored_status, record, replayed=status == "replay")

    @property
    def created(self) -> bool:
        """True when the write created the entry (no live entry was there before)."""
        return self.record.get("created") == "1"

    def entry(self, namespace: str, key: str, value: bytes | None = None) -> Entry:
        fields: dict[str, Any] = dict(self.record)
        if value is not None and self.status == "ok" and not fields.get("del"):
            fields["val"] = value
        return entry_from_fields(namespace, key, fields)
