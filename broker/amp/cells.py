"""The MemoryCell wire format (AMP spec section 1), validated strictly, with ULID ids."""

from __future__ import annotations

import base64
import functools
import os
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from broker.core.errors import MempError
from broker.core.models import MAX_SAFE_INT
from broker.core.nesting import check_stored

AMP_VERSION = "0.1.0"
MemoryType = Literal["episodic", "semantic", "procedural"]
OwnerType = Literal["user", "agent", "organization"]
Status = Literal["active", "stale", "archived", "deleted"]
Score = Annotated[float, Meta(ge=0.0, le=1.0)]
Rate = Annotated[float, Meta(ge=0.0, le=1000.0)]
NAME_RE = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")
Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@+-]+\Z")]
# The owner names a MEMP key segment (`cells/<type>/<owner>/<id>`), so `.` and `..` are out.
OwnerId = Annotated[str, Meta(min_length=1, max_length=128,
                              pattern=r"^(?!\.\.?\Z)[A-Za-z0-9._:@+-]+\Z")]
# An agent id or a pattern of them: `*` stands for any run of characters (spec section 4).
AgentGlob = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@+*-]+\Z")]
Text = Annotated[str, Meta(max_length=64 * 1024)]
# Globs a request may send in each of `readable_by` and `writable_by` (docs/amp.md, "Access
# policy limits"); held by check_policy, not by AccessPolicy, which also decodes stored cells.
MAX_POLICY_GLOBS = 64

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _CROCKFORD.encode())
ULID_RE = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")


def new_ulid(now_ms: int | None = None) -> str:
    """A ULID: 48 bits of Unix milliseconds and 80 random bits, Crockford base32."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    # Base 32 of the 130 low bits of a 160-bit number is its last 26 characters.
    return base64.b32encode(value.to_bytes(20, "big"))[-26:].translate(_TO_CROCKFORD).decode()


@functools.lru_cache(maxsize=4096)
def iso(ms: int) -> str:
    """Unix ms as ISO 8601 UTC with milliseconds, the form every stored cell uses."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def parse_time(text: str, field: str) -> int:
    """ISO 8601 (with a zone, or taken as UTC) to Unix ms; `field` names it in the error."""
    try:
        return _parse_iso(text)
    except (TypeError, ValueError):
        raise MempError("invalid_request", f"{field} must be an ISO 8601 timestamp",
                        {"field": field}) from None


# A cell's timestamps are read several times each while it is looked at: parse each once.
@functools.lru_cache(maxsize=4096)
def _parse_iso(text: str) -> int:
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


class Content(Struct, forbid_unknown_fields=True):
    text: Text
    metadata: dict[str, Any] = {}


class Identity(Struct, forbid_unknown_fields=True):
    owner_id: OwnerId
    owner_type: OwnerType
    created_by: Name | None = None
    session_id: Name | None = None


class Scoring(Struct, forbid_unknown_fields=True):
    importance: Score = 0.5
    confidence: Score = 1.0
    decay_rate: Rate = 0.01
    access_count: Annotated[int, Meta(ge=0, le=MAX_SAFE_INT)] = 0


class Lifecycle(Struct, forbid_unknown_fields=True):
    created_at: str | None = None
    last_accessed_at: str | None = None
    last_updated_at: str | None = None
    expires_at: str | None = None
    status: Status = "active"
    stale_since: str | None = None
    deleted_at: str | None = None


class AccessPolicy(Struct, forbid_unknown_fields=True):
    readable_by: list[AgentGlob] = []
    writable_by: list[AgentGlob] = []
    public: bool = False


def check_policy(policy: AccessPolicy | None, where: str = "") -> None:
    """Refuse (400, naming the field) a policy sent with more than MAX_POLICY_GLOBS globs in
    a list: every one is matched for each cell a search or a MEMP view looks at. Input only
    (`where` prefixes the field): a cell stored with more is still decoded, read and found."""
    if policy is None:
        return
    for name in ("readable_by", "writable_by"):
        count = len(getattr(policy, name))
        if count > MAX_POLICY_GLOBS:
            field = f"{where}access_policy.{name}"
            raise MempError("invalid_request", f"{field} holds {count} agent patterns: at "
                            f"most {MAX_POLICY_GLOBS}", {"field": field,
                                                          "limit": MAX_POLICY_GLOBS})


class Provenance(Struct, forbid_unknown_fields=True):
    source_type: Annotated[str, Meta(max_length=128)] | None = None
    source_ref: Annotated[str, Meta(max_length=2048)] | None = None
    extraction_method: Annotated[str, Meta(max_length=128)] | None = None


class MemoryCell(Struct, forbid_unknown_fields=True, kw_only=True):
    """A full cell as stored and returned."""

    id: str
    amp_version: str = AMP_VERSION
    type: MemoryType
    content: Content
    identity: Identity
    scoring: Scoring = msgspec.field(default_factory=Scoring)
    lifecycle: Lifecycle = msgspec.field(default_factory=Lifecycle)
    access_policy: AccessPolicy = msgspec.field(default_factory=AccessPolicy)
    provenance: Provenance = msgspec.field(default_factory=Provenance)


_cell_decoder = msgspec.json.Decoder(MemoryCell)


def decode_stored_cell(value: bytes | msgspec.Raw) -> MemoryCell:
    """A stored cell: msgspec's error when it is not one, TooDeep when it nests too deep to
    look inside (stored before MEMP_MAX_JSON_DEPTH)."""
    check_stored(value)
    return _cell_decoder.decode(value)


class NewCell(Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /amp/memories`: the server assigns id, amp_version and lifecycle."""

    type: MemoryType
    content: Content
    identity: Identity
    scoring: Scoring = msgspec.field(default_factory=Scoring)
    access_policy: AccessPolicy = msgspec.field(default_factory=AccessPolicy)
    provenance: Provenance = msgspec.field(default_factory=Provenance)
    expires_at: str | None = None


class ContentPatch(Struct, forbid_unknown_fields=True):
    text: Text | None = None
    metadata: dict[str, Any] | None = None


class ScoringPatch(Struct, forbid_unknown_fields=True):
    importance: Score | None = None
    confidence: Score | None = None
    decay_rate: Rate | None = None


class LifecyclePatch(Struct, forbid_unknown_fields=True):
    expires_at: str | None = None
    status: Status | None = None


class CellPatch(Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `PATCH /amp/memories/{id}`: only what changes."""

    content: ContentPatch | None = None
    scoring: ScoringPatch | None = None
    access_policy: AccessPolicy | None = None
    lifecycle: LifecyclePatch | None = None
    expires_at: str | None = None


class ImportBody(Struct, forbid_unknown_fields=True):
    """Body of `POST /amp/import`: full cells from another system, kept as they were."""

    cells: list[MemoryCell]
