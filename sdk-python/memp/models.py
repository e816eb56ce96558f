"""Typed results, mirroring the broker's wire format (its `broker/core/models.py`).

Unknown fields from newer brokers are ignored, so an older SDK keeps working."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypedDict

import msgspec
from msgspec import Struct

Permission = Literal["read", "write", "subscribe", "admin", "impersonate", "amp", "review",
                     "audit"]
EventType = Literal["put", "delete", "expire", "snapshot", "snapshot-end", "reset", "proposal",
                    "approved", "rejected", "expired"]
# Events that end a stream; the subscription resumes from their cursor instead of handing them
# out (after `revoked`, the reconnect is refused with the error that says why).
EndEventType = Literal["overflow", "shutdown", "revoked"]
# Events that only move the cursor (a `filter` left changes out); never handed out.
CursorEventType = Literal["progress"]
Strategy = Literal["last-write-wins", "agent-priority", "merge"]
ArrayMode = Literal["replace", "append"]
SharePermission = Literal["read", "subscribe"]


class SchemaError(Struct, kw_only=True, frozen=True):
    """Why a value does not conform: which schema, where in the value (JSON Pointer), what."""

    schema_id: str
    path: str
    message: str


class Conflict(Struct, kw_only=True, frozen=True):
    """A path both a merge write and the stored entry changed differently since its base."""

    path: str
    base: Any = None
    stored: Any = None
    incoming: Any = None
    stored_agent: str | None = None
    incoming_agent: str | None = None
    base_missing: bool = False


class Entry(Struct, kw_only=True, frozen=True):
    """One version of a memory entry; times are Unix milliseconds."""

    id: str
    agent_id: str
    namespace: str
    key: str
    value: Any
    ttl_seconds: int | None = None
    version: int
    created_at: int
    updated_at: int
    timestamp: int | None = None
    expires_at: int | None = None
    schema_violation: bool = False
    deleted: bool = False
    schema_errors: list[SchemaError] | None = None  # with schema_violation
    conflicts: list[Conflict] | None = None  # paths a merge write flagged
    approved_by: str | None = None  # on a version an approved proposal wrote
    proposal_id: str | None = None


class Agent(Struct, kw_only=True, frozen=True):
    """A registered agent (MEMP draft, Data Schema)."""

    id: str
    name: str
    framework: str
    namespace: str
    created_at: int
    last_seen: int


class Credentials(Struct, kw_only=True, frozen=True):
    """A token handed out once, at registration or key creation."""

    api_key: str
    key_id: str
    agent_id: str | None = None


class Registration(Struct, kw_only=True, frozen=True):
    """What registering an agent returns."""

    agent: Agent
    credentials: Credentials
    reused: bool = False  # the agent this token registered under this name before

class Grant(Struct, frozen=True):
    """Permissions on the namespaces a glob names (`acme-*`, `acme-crm`, `*`)."""

    namespace: str
    permissions: list[Permission]


class ApiKey(Struct, kw_only=True, frozen=True):
    """What the broker keeps about an API key (never the key itself)."""

    id: str
    name: str
    grants: list[Grant]
    agent_id: str | None = None
    created_at: int
    created_by: str


class CreatedKey(Struct, kw_only=True, frozen=True):
    """A new API key: `api_key` is shown only this once."""

    api_key: str
    key: ApiKey


class Page(Struct, kw_only=True, frozen=True):
    """One page of a query; pass `next_cursor` back until it is None."""

    entries: list[Entry]
    next_cursor: str | None = None


class Event(Struct, kw_only=True, frozen=True):
    """One subscription event.

    `put`, `delete`, `expire` and `snapshot` carry the entry version; `snapshot-end` marks the
    end of the snapshot; `reset` says the broker could not replay `namespace` from the cursor
    (it was older than the retained change log), so the caller may have missed changes there.
    `id` is the resume cursor after this event (None for snapshot entries)."""

    type: EventType
    id: str | None = None
    entry: Entry | None = None
    namespace: str | None = None
    reason: str | None = None

    @property
    def key(self) -> str | None:
        return self.entry.key if self.entry is not None else None

    @property
    def value(self) -> Any:
        """The entry's value (None for deletes, expiries and markers)."""
        return self.entry.value if self.entry is not None else None

    @property
    def version(self) -> int | None:
        return self.entry.version if self.entry is not None else None


class StrategyRule(Struct, frozen=True, omit_defaults=True):
    """For keys matching `pattern`: use `strategy`, and/or require review of every write
    (`approval="required"`); the most specific matching rule that sets either wins."""

    pattern: str
    strategy: Strategy | None = None
    approval: Literal["required", "none"] | None = None


class PriorityRule(Struct, frozen=True):
    """An agent id, or a pattern of ids with `*`, and its priority (higher wins)."""

    agent: str
    priority: int


class Share(Struct, frozen=True):
    """Lets tokens granted on namespaces matching `namespace` read and/or subscribe here."""

    namespace: str
    permissions: list[SharePermission]


class Limits(Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A namespace's fair share: write and read rates (per second, with a burst: how many at
    once; default the rate) and quotas on live keys, stored bytes and open streams. A field
    left out is no limit."""

    writes_per_second: float | None = None
    write_burst: int | None = None
    reads_per_second: float | None = None
    read_burst: int | None = None
    max_keys: int | None = None
    max_bytes: int | None = None
    max_streams: int | None = None


class Usage(Struct, frozen=True):
    """What a namespace uses: live keys, bytes of stored values, open streams, pending
    proposals, and bytes of the proposals it keeps (`max_bytes` holds both byte counts;
    0 from a broker that does not report them)."""

    keys: int
    bytes: int
    streams: int
    proposals: int = 0
    proposal_bytes: int = 0


class AgentDefaults(Struct, frozen=True):
    """The limits every agent (and credential) has from the broker's settings; None: none."""

    writes_per_second: float | None
    write_burst: int | None
    reads_per_second: float | None
    read_burst: int | None
    max_streams_per_token: int | None
    max_pending_proposals: int | None = None  # per namespace


class UsageReport(Struct, frozen=True):
    """A namespace's usage beside its limits (`namespaces.usage()`, admins only)."""

    namespace: str
    limits: Limits
    usage: Usage
    agent_defaults: AgentDefaults


class NamespaceConfig(Struct, kw_only=True, frozen=True):
    """A namespace's conflict strategies, agent priorities, retention, shares and limits; a
    field left out takes the broker's default."""

    strategy: Strategy = "last-write-wins"
    rules: list[StrategyRule] = []
    priorities: list[PriorityRule] = []
    default_priority: int = 0
    merge_arrays: ArrayMode = "replace"
    history_limit: int | None = None
    default_ttl_seconds: int | None = None
    shares: list[Share] = []
    limits: Limits = Limits()
    allow_self_approval: bool = False


class StoredConfig(NamespaceConfig, kw_only=True, frozen=True):
    """The configuration as stored: with its namespace, `revision` (pass it as `if_revision`
    to change it only if nobody else has since), and who changed it last, when (Unix ms)."""

    namespace: str = ""
    revision: int = 0
    updated_at: int | None = None
    updated_by: str | None = None


class ConfigFields(TypedDict, total=False):
    """The fields of a `NamespaceConfig`, as keyword arguments to `set_config`."""

    strategy: Strategy
    rules: Sequence[StrategyRule]
    priorities: Sequence[PriorityRule]
    default_priority: int
    merge_arrays: ArrayMode
    history_limit: int | None
    default_ttl_seconds: int | None
    shares: Sequence[Share]
    limits: Limits
    allow_self_approval: bool


class SchemaRecord(Struct, kw_only=True, frozen=True):
    """A JSON Schema registered for the keys matching `pattern`; `draft` is the `$schema` URI
    it is validated by, `created_at` Unix ms."""

    id: str
    namespace: str
    pattern: str
    schema: dict[str, Any] | bool
    enforce: bool
    draft: str
    created_at: int
    created_by: str


_entry_decoder = msgspec.json.Decoder(Entry)


def decode_entry(data: bytes | str) -> Entry:
    return _entry_decoder.decode(data)


def to_builtins(obj: Any) -> Any:
    """Plain dicts and lists, ready for `json.dumps`."""
    return msgspec.to_builtins(obj)


class AgentPage(Struct, kw_only=True, frozen=True):
    """One page of a namespace's agents, in registration order; pass `next_cursor` back."""

    agents: list[Agent]
    next_cursor: str | None = None


class ErrorBody(Struct, kw_only=True, frozen=True):
    """The broker's error: `code`, `message`, `details`."""

    code: str
    message: str
    details: dict[str, Any] = {}
    request_id: str | None = None


# ---- AMP memory cells (`/amp`) ----

MemoryType = Literal["episodic", "semantic", "procedural"]
OwnerType = Literal["user", "agent", "organization"]
CellStatus = Literal["active", "stale", "archived", "deleted"]
SearchMode = Literal["hybrid", "semantic", "keyword"]


class CellContent(Struct, kw_only=True):
    text: str
    metadata: dict[str, Any] = {}


class CellIdentity(Struct, kw_only=True):
    owner_id: str
    owner_type: OwnerType
    created_by: str | None = None
    session_id: str | None = None


class CellScoring(Struct, kw_only=True):
    importance: float = 0.5
    confidence: float = 1.0
    decay_rate: float = 0.01
    access_count: int = 0


class CellLifecycle(Struct, kw_only=True):
    """Times are ISO 8601 strings, as AMP writes them."""

    created_at: str | None = None
    last_accessed_at: str | None = None
    last_updated_at: str | None = None
    expires_at: str | None = None
    status: CellStatus = "active"
    stale_since: str | None = None
    deleted_at: str | None = None


class AccessPolicy(Struct, kw_only=True):
    """Who besides the owner and creator may read or write a cell (`*` globs)."""

    readable_by: list[str] = []
    writable_by: list[str] = []
    public: bool = False


class Provenance(Struct, kw_only=True):
    source_type: str | None = None
    source_ref: str | None = None
    extraction_method: str | None = None


class MemoryCell(Struct, kw_only=True):
    """An AMP memory cell (AMP spec section 1)."""

    id: str
    type: MemoryType
    content: CellContent
    identity: CellIdentity
    amp_version: str = "0.1.0"
    scoring: CellScoring = msgspec.field(default_factory=CellScoring)
    lifecycle: CellLifecycle = msgspec.field(default_factory=CellLifecycle)
    access_policy: AccessPolicy = msgspec.field(default_factory=AccessPolicy)
    provenance: Provenance = msgspec.field(default_factory=Provenance)


class NearDuplicate(Struct, frozen=True):
    """A cell of the same owner whose text means nearly what a new cell's does."""

    id: str
    similarity: float


class CreatedCell(MemoryCell, kw_only=True):
    """A create's reply: the cell as stored, and its near duplicates (None when the broker did
    not compute them), candidates for `amp.merge`."""

    near_duplicates: list[NearDuplicate] | None = None


class CellHit(Struct, kw_only=True, frozen=True):
    """A search result: the cell, its rank and its current decay score."""

    cell: MemoryCell
    score: float
    decay_score: float


class CellSearchPage(Struct, kw_only=True, frozen=True):
    results: list[CellHit]
    next_cursor: str | None = None
    degraded: str | None = None  # `embedder_unavailable`: a hybrid search ranked by words alone


class ImportRefusal(Struct, kw_only=True, frozen=True):
    """A cell an import refused: its place in the batch, its id, and why."""

    index: int
    id: str | None
    error: ErrorBody


class ImportResult(Struct, kw_only=True, frozen=True):
    imported: int
    errors: list[ImportRefusal] = []


# ---- governance (docs/governance.md) ----


class Proposal(Struct, kw_only=True, frozen=True):
    """A gated write awaiting review (or decided); `diff` is an RFC 6902 patch from the value
    at `base_version` to `value` (None for a delete)."""

    id: str
    status: Literal["pending", "approved", "rejected", "expired"]
    namespace: str
    key: str
    operation: Literal["put", "merge", "delete"]
    value: Any
    base_version: int
    proposed_by: str
    created_at: int
    expires_at: int
    diff: list[dict[str, Any]]
    ttl_seconds: int | None = None
    conflicts: list[Conflict] | None = None
    decided_by: str | None = None
    decided_at: int | None = None
    reason: str | None = None
    version: int | None = None


class ProposalPage(Struct, kw_only=True, frozen=True):
    proposals: list[Proposal]
    next_cursor: str | None = None


class Approval(Struct, kw_only=True, frozen=True):
    """What an approval did: the proposal, now approved, and the entry version it wrote."""

    proposal: Proposal
    entry: Entry


class AuditRecord(Struct, kw_only=True, frozen=True):
    """One audit record: who did what to which key, versions before and after, a hash of the
    content (never the content), and its link in the hash chain."""

    id: str
    seq: int
    at: int
    action: str
    actor: str
    agent_id: str | None = None
    key_id: str | None = None
    key: str | None = None
    version_before: int | None = None
    version_after: int | None = None
    content_hash: str | None = None
    request_id: str | None = None
    details: dict[str, Any] = {}
    prev: str = ""
    hash: str = ""


class AuditPage(Struct, kw_only=True, frozen=True):
    records: list[AuditRecord]
    next_cursor: str | None = None


class AuditVerdict(Struct, kw_only=True, frozen=True):
    """The audit log's hash chain walked: `broken` names the first bad record."""

    ok: bool
    records: int
    head: str
    broken: dict[str, Any] | None = None
