"""The wire format, defined once as msgspec Structs: entries, agents, request bodies, messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

Permission = Literal["read", "write", "subscribe", "admin", "impersonate", "amp", "review",
                     "audit"]
PERMISSIONS: tuple[str, ...] = ("read", "write", "subscribe", "admin", "impersonate", "amp",
                                "review", "audit")

MAX_SAFE_INT = 2**53 - 1
# Versions, limits and priorities a client sends fit what its JSON peers (JavaScript) and Redis's
# Lua (doubles) hold exactly; anything wider is refused with 400 rather than rounded. TTLs and
# timestamps have range checks of their own (`invalid_ttl`, `invalid_timestamp`).
WireInt = Annotated[int, Meta(ge=-MAX_SAFE_INT, le=MAX_SAFE_INT)]


class Entry(Struct, kw_only=True):
    """One version of a memory entry as clients see it; `value` is kept as raw JSON."""

    id: str
    agent_id: str
    namespace: str
    key: str
    value: Raw | None
    ttl_seconds: int | None
    version: int
    created_at: int
    updated_at: int
    timestamp: int | None
    expires_at: int | None
    schema_violation: bool = False
    deleted: bool = False
    schema_errors: Raw | UnsetType = UNSET
    conflicts: Raw | UnsetType = UNSET
    approved_by: str | UnsetType = UNSET
    proposal_id: str | UnsetType = UNSET


class Agent(Struct, kw_only=True):
    """A registered agent (MEMP draft, Data Schema)."""

    id: str
    name: str
    framework: str
    namespace: str
    created_at: int
    last_seen: int


class Grant(Struct, forbid_unknown_fields=True):
    """Permissions on the namespaces a glob names (`acme-*`, `acme-crm`, `*`)."""

    namespace: str
    permissions: list[Permission]


class ApiKeyRecord(Struct, kw_only=True):
    """What the broker stores about an API key; the key itself is stored only as a hash."""

    id: str
    name: str
    grants: list[Grant]
    agent_id: str | None = None
    created_at: int
    created_by: str


class Credentials(Struct, kw_only=True):
    """A token handed out once, at registration or key creation."""

    api_key: str
    key_id: str
    agent_id: str | None = None


class Page(Struct, kw_only=True):
    """One page of a query."""

    entries: list[Entry]
    next_cursor: str | None


class Proposal(Struct, kw_only=True):
    """A gated write awaiting review (docs/governance.md); `diff` is an RFC 6902 patch from
    the value at `base_version` to the proposed one."""

    id: str
    status: Literal["pending", "approved", "rejected", "expired"]
    namespace: str
    key: str
    operation: Literal["put", "merge", "delete"]
    value: Raw  # null for a delete
    base_version: int
    proposed_by: str
    created_at: int
    expires_at: int
    diff: Raw
    ttl_seconds: int | None = None
    conflicts: Raw | UnsetType = UNSET
    decided_by: str | None = None
    decided_at: int | None = None
    reason: str | None = None
    version: int | None = None  # the entry version an approval wrote


class ProposalPage(Struct, kw_only=True):
    proposals: list[Proposal]
    next_cursor: str | None


class ApproveBody(Struct, forbid_unknown_fields=True):
    """Body of `POST .../proposals/{id}/approve`: `base_version` approves the proposal
    rebased onto that (current) version, after a 409 showed the key had moved."""

    base_version: WireInt | None = None


class RejectBody(Struct, forbid_unknown_fields=True):
    reason: str = ""


class AuditRecord(Struct, kw_only=True):
    """One audit record (docs/governance.md): who did what to which key, the versions before
    and after, a hash of the content (never the content), and the chain link."""

    id: str  # its position in the log, also the cursor
    seq: int
    at: int
    action: str
    actor: str
    agent_id: str | None
    key_id: str | None
    key: str | None
    version_before: int | None
    version_after: int | None
    content_hash: str | None
    request_id: str | None
    details: dict[str, Any]
    prev: str
    hash: str


class AuditPage(Struct, kw_only=True):
    records: list[AuditRecord]
    next_cursor: str | None


class AuditVerdict(Struct, kw_only=True):
    """What `GET .../audit/verify` found: `broken` names the first bad record."""

    ok: bool
    records: int
    head: str
    broken: dict[str, Any] | None = None


# ---- request bodies (REST) ----


class PutBody(Struct, forbid_unknown_fields=True):
    """Body of `PUT /v1/namespaces/{ns}/memory/{key}`; conditions travel in If-Match and
    If-None-Match, the message id in Idempotency-Key."""

    value: Raw
    ttl_seconds: int | None = None
    timestamp: int | None = None
    base_version: WireInt | None = None
    approval_required: bool = False


class RegisterBody(Struct, forbid_unknown_fields=True):
    """Body of `POST /v1/agents`."""

    name: str
    namespace: str
    framework: str = "custom"
    new: bool = False  # another agent of this name, rather than the one registered before


class CreateKeyBody(Struct, forbid_unknown_fields=True):
    """Body of `POST /v1/keys`."""

    grants: list[Grant]
    name: str = ""
    agent_id: str | None = None


# ---- protocol messages ----


class Message(Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """Fields common to every protocol message."""

    memp: str = "1.0"
    id: str | None = None
    timestamp: int | None = None
    agent_id: str | None = None
    namespace: str | None = None


class RegisterMessage(Message, tag="agent.register"):
    name: str
    framework: str = "custom"
    new: bool = False


class AgentGetMessage(Message, tag="agent.get"):
    agent: str


class AgentListMessage(Message, tag="agent.list"):
    cursor: str | None = None
    limit: WireInt | None = None


class PutMessage(Message, tag="memory.put"):
    key: str
    value: Raw
    ttl_seconds: int | None = None
    if_version: WireInt | None = None
    if_absent: bool = False
    base_version: WireInt | None = None
    approval_required: bool = False


class GetMessage(Message, tag="memory.get"):
    key: str


class QueryMessage(Message, tag="memory.query"):
    pattern: str
    cursor: str | None = None
    limit: WireInt | None = None


class DeleteMessage(Message, tag="memory.delete"):
    key: str
    if_version: WireInt | None = None
    approval_required: bool = False


class ProposalListMessage(Message, tag="proposal.list"):
    status: str | None = None
    key: str | None = None
    cursor: str | None = None
    limit: WireInt | None = None


class ProposalGetMessage(Message, tag="proposal.get"):
    proposal: str


class ProposalApproveMessage(Message, tag="proposal.approve"):
    proposal: str
    base_version: WireInt | None = None


class ProposalRejectMessage(Message, tag="proposal.reject"):
    proposal: str
    reason: str = ""


class HistoryMessage(Message, tag="memory.history"):
    key: str
    limit: WireInt | None = None


AnyMessage = (
    RegisterMessage
    | AgentGetMessage
    | AgentListMessage
    | PutMessage
    | GetMessage
    | QueryMessage
    | DeleteMessage
    | HistoryMessage
    | ProposalListMessage
    | ProposalGetMessage
    | ProposalApproveMessage
    | ProposalRejectMessage
)
MESSAGE_TYPES: tuple[str, ...] = (
    "agent.register", "agent.get", "agent.list", "memory.put", "memory.get",
    "memory.query", "memory.delete", "memory.history", "proposal.list", "proposal.get",
    "proposal.approve", "proposal.reject",
)

message_decoder: msgspec.json.Decoder[AnyMessage] = msgspec.json.Decoder(AnyMessage)
encoder = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    """Encode any wire object (Structs, dicts, Raw) to JSON."""
    return encoder.encode(obj)
