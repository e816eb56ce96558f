"""Making proposals: the gate that gated writes go through. MEMP's puts, merges and deletes
(`ApprovalGate`, broker/services/approval.py) and AMP's cell creates and patches (`CellGate`,
broker/amp/service.py) become pending proposals with an RFC 6902 diff, each made in one script
call that takes the write's tokens."""

from __future__ import annotations

import re
import secrets
import uuid
from typing import Any

import msgspec

from broker.amp.cells import CellPatch, MemoryCell
from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.models import Entry, Proposal
from broker.core.nesting import TooDeep, decode_stored
from broker.governance.patch import MISSING, diff
from broker.services.auth import Principal
from broker.services.idempotency import reused
from broker.services.limits import FairShare
from broker.services.namespaces import NamespaceRegistry
from broker.storage.fairshare import Gate
from broker.storage.proposals import ProposalStore, StoredProposal
from broker.storage.records import CorruptRecord, WriteOutcome, WriteRequest

_ID_RE = re.compile(r"prop_[0-9a-f]{12}[0-9a-f]{16}")
_REQUEST_FIELDS = ("agent_id", "value", "entry_id", "ttl_seconds", "mode", "priority",
                   "default_priority", "history_limit", "schema_errors", "conflicts", "action")
NULL = msgspec.Raw(b"null")


def decoded(raw: msgspec.Raw | None) -> Any:
    """A stored JSON value to diff, or MISSING for none; raw when too deep to look inside, so
    the diff replaces it whole."""
    try:
        return MISSING if raw is None else decode_stored(raw)
    except TooDeep:
        return raw


def shown(stored: StoredProposal, namespace: str, now: int) -> Proposal:
    """A stored proposal as callers see it: expired once its time is up, swept or not."""
    try:
        proposal = msgspec.json.decode(stored.doc, type=Proposal)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CorruptRecord(f"stored proposal of {namespace}: {exc}",
                            f"proposal of {namespace}") from None
    if proposal.status == "pending" and proposal.expires_at <= now:
        proposal = msgspec.structs.replace(proposal, status="expired")  # not yet swept
    return proposal


async def load_stored(store: ProposalStore, namespace: str, proposal_id: str
                      ) -> StoredProposal:
    """One proposal's record by id; 404 for an id this broker never issues or one not stored
    (never made, or dropped after its retention)."""
    if not _ID_RE.fullmatch(proposal_id):
        raise MempError("not_found", f"no proposal {proposal_id[:80]!r}",
                        {"proposal": proposal_id[:80]})
    stored = await store.load(namespace, proposal_id)
    if stored is None:
        raise MempError("not_found", f"no proposal {proposal_id!r}",
                        {"proposal": proposal_id})
    return stored


async def load(store: ProposalStore, namespace: str, proposal_id: str, now: int) -> Proposal:
    """One proposal by id, as callers see it (`load_stored`, `shown`)."""
    return shown(await load_stored(store, namespace, proposal_id), namespace, now)


class ProposalGate:
    """Makes proposals of gated writes, for MemoryService and CellService alike."""

    def __init__(self, store: ProposalStore, namespaces: NamespaceRegistry,
                 fair_share: FairShare, clock: Clock, ttl_seconds: int,
                 max_pending: int = 0) -> None:
        self.store = store
        self.namespaces = namespaces
        self.fair_share = fair_share
        self.clock = clock
        self.ttl_ms = ttl_seconds * 1000
        self.max_pending = max_pending or None  # per namespace (MEMP_MAX_PENDING_PROPOSALS)

    async def requires(self, namespace: str, key: str) -> bool:
        return (await self.namespaces.state(namespace)).requires_approval(key)

    async def propose_cell(self, agent: str, namespace: str, key: str, cell: MemoryCell,
                           current: Entry | None, action: str, patch: CellPatch | None,
                           limit: Gate) -> Proposal:
        """A cell create or patch as a proposal; its approval writes the cell and indexes it."""
        now = self.clock()
        request = WriteRequest(
            agent_id=agent, now=now, timestamp=now, timestamp_from_client=False,
            value=msgspec.json.encode(cell),
            entry_id="" if current is not None else str(uuid.uuid4()), mode="merge",
            actor=agent, action=action)
        made = await self._propose(namespace, key, "put", current, request,
                                   msgspec.to_builtins(patch) if patch else None, limit,
                                   cell=True)
        if isinstance(made, WriteOutcome):  # pragma: no cover - a cell write has no message id
            raise MempError("internal", "a cell's proposal was answered as a write")
        return made

    async def propose(self, principal: Principal, namespace: str, key: str, operation: str,
                      current: Entry | None, request: WriteRequest, incoming: Any,
                      limit: Gate) -> Proposal | WriteOutcome:
        return await self._propose(namespace, key, operation, current, request,
                                   incoming if operation == "merge" else None, limit)

    async def _propose(self, namespace: str, key: str, operation: str, current: Entry | None,
                       request: WriteRequest, incoming: Any, limit: Gate, cell: bool = False
                       ) -> Proposal | WriteOutcome:
        """Store the proposal, taking the write's tokens (`limit`: the proposer's and the
        namespace's buckets) unless the namespace has `max_pending` proposals pending. A
        message id seen before gets its first reply: its proposal, or the outcome of the
        write it was first used for (before the key was gated)."""
        now = request.now
        proposal_id = f"prop_{now:012x}{secrets.token_hex(8)}"
        value = NULL if operation == "delete" else msgspec.Raw(request.value)
        proposal = Proposal(
            id=proposal_id, status="pending", namespace=namespace, key=key,
            operation=operation,  # type: ignore[arg-type]
            value=value, base_version=current.version if current else 0,
            proposed_by=request.agent_id, created_at=now, expires_at=now + self.ttl_ms,
            diff=msgspec.Raw(msgspec.json.encode(diff(
                decoded(current.value if current else None),
                MISSING if operation == "delete" else decoded(value)))),
            ttl_seconds=request.ttl_seconds,
            conflicts=msgspec.Raw(request.conflicts.encode()) if request.conflicts
            else msgspec.UNSET)
        saved = {name: getattr(request, name) for name in _REQUEST_FIELDS}
        saved["value"] = request.value.decode()
        saved["incoming"] = incoming
        saved["cell"] = cell
        verdict, reply = await self.store.propose(
            namespace, key, request, limit, id=proposal_id, base=str(proposal.base_version),
            doc=msgspec.json.encode(proposal), req=msgspec.json.encode(saved),
            by=request.agent_id, created=now, expires=proposal.expires_at,
            max_pending="" if self.max_pending is None else self.max_pending)
        if verdict == "refused":
            self.fair_share.check_write(WriteOutcome.decode(["ok", reply]), limit, now)
        if verdict == "moved":
            raise MempError("write_conflict", "the key changed while the proposal was made; "
                            "nothing was proposed: retry", {"key": key, "retryable": True})
        if verdict == "reused":
            raise reused(request.message_id)
        outcome = WriteOutcome.decode([verdict, reply])
        if outcome.status != "proposed":
            return outcome
        if outcome.replayed:
            return await self.replayed(namespace, outcome.record["id"])
        return proposal

    async def replayed(self, namespace: str, proposal_id: str) -> Proposal:
        """The proposal a message id was first answered with, as it is now."""
        return await load(self.store, namespace, proposal_id, self.clock())
