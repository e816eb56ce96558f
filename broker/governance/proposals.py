"""Approval-gated writes (docs/governance.md) once proposed (broker/governance/gate.py makes
them): holders of `review` list, approve or reject them; an approval writes the proposal with
compare-and-set on the version it was made against, and expiry closes it."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec

from broker.amp.cells import CellPatch
from broker.amp.service import CellService
from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.grammar import validate_key, validate_namespace
from broker.core.models import Entry, Proposal, ProposalPage
from broker.governance.gate import NULL, decoded, load, load_stored, shown
from broker.governance.patch import MISSING, diff
from broker.services.auth import Principal
from broker.services.fields import check_limit
from broker.services.memory import MemoryService, PutOptions
from broker.storage.fairshare import open_gate
from broker.storage.proposals import ProposalStore, StoredProposal
from broker.storage.records import CorruptRecord, WriteOutcome, WriteRequest, skipped

_CURSOR_RE = re.compile(r"([0-9]{1,16}):(prop_[0-9a-f]{28})")
STATUSES = ("pending", "approved", "rejected", "expired")
MAX_REASON = 2000


def _proposed(proposal: Proposal) -> Any:
    """What a proposal would leave at its key (MISSING for a delete)."""
    return MISSING if proposal.operation == "delete" else decoded(proposal.value)


class ProposalService:
    """Lists, shows and decides proposals, and closes those whose time is up."""

    def __init__(self, store: ProposalStore, memory: MemoryService, cells: CellService,
                 clock: Clock) -> None:
        self.store = store
        self.memory = memory
        self.cells = cells
        self.clock = clock

    async def _load(self, namespace: str, proposal_id: str) -> Proposal:
        return await load(self.store, namespace, proposal_id, self.clock())

    def _shown(self, stored: StoredProposal, namespace: str) -> Proposal:
        return shown(stored, namespace, self.clock())

    @staticmethod
    def _may_see(principal: Principal, namespace: str, proposal: Proposal) -> bool:
        return principal.can("review", namespace) or proposal.proposed_by == principal.writer_id

    def _authorise(self, principal: Principal, namespace: str) -> None:
        validate_namespace(namespace)
        if not (principal.can("review", namespace) or principal.can("write", namespace)):
            principal.require("review", namespace)

    async def get(self, principal: Principal, namespace: str, proposal_id: str) -> Proposal:
        """A proposal, for reviewers and its proposer (others get 404, as for no proposal)."""
        self._authorise(principal, namespace)
        proposal = await self._load(namespace, proposal_id)
        if not self._may_see(principal, namespace, proposal):
            raise MempError("not_found", f"no proposal {proposal_id!r}",
                            {"proposal": proposal_id})
        return proposal

    async def list(self, principal: Principal, namespace: str, status: str | None,
                   key: str | None, cursor: str | None, limit: int | None) -> ProposalPage:
        """Proposals newest first; a caller without `review` sees only its own."""
        self._authorise(principal, namespace)
        if status is not None and status not in STATUSES:
            raise MempError("invalid_request", f"status must be one of {', '.join(STATUSES)}",
                            {"parameter": "status"})
        if key is not None:
            validate_key(key, self.memory.settings.max_key_bytes)
        limit = check_limit(limit, 50, 500)
        before = None
        if cursor:
            match = _CURSOR_RE.fullmatch(cursor)
            if match is None:
                raise MempError("invalid_request", "cursor is not one this broker issued",
                                {"cursor": cursor[:100]})
            before = (int(match[1]), match[2])
        found: list[Proposal] = []
        scanned = 0
        while scanned < 10_000:
            ids = await self.store.newest_first(namespace, before, 200)
            scanned += len(ids)
            loaded = await self.store.load_many(namespace, [i for i, _ in ids])
            for (proposal_id, created), stored in zip(ids, loaded, strict=True):
                before = (created, proposal_id)
                if stored is None:
                    continue
                try:
                    proposal = self._shown(stored, namespace)
                except CorruptRecord as exc:  # left out, so that it hides no other
                    skipped(exc)
                    continue
                if ((status is None or proposal.status == status)
                        and (key is None or proposal.key == key)
                        and self._may_see(principal, namespace, proposal)):
                    found.append(proposal)
                    if len(found) == limit:
                        return ProposalPage(proposals=found,
                                            next_cursor=f"{created}:{proposal_id}")
            if len(ids) < 200:
                return ProposalPage(proposals=found, next_cursor=None)
        cursor_out = f"{before[0]}:{before[1]}" if before else None
        return ProposalPage(proposals=found, next_cursor=cursor_out)

    # ---- deciding ----

    async def _pending(self, principal: Principal, namespace: str, proposal_id: str
                       ) -> tuple[Proposal, StoredProposal]:
        validate_namespace(namespace)
        principal.require("review", namespace)
        stored = await load_stored(self.store, namespace, proposal_id)
        proposal = self._shown(stored, namespace)
        if proposal.status != "pending" or stored.req is None:
            raise _decided(proposal)
        return proposal, stored

    async def approve(self, principal: Principal, namespace: str, proposal_id: str,
                      base_version: int | None = None) -> tuple[Proposal, Entry | None]:
        """Write the proposal if the key is still at its base version (or, with
        `base_version`, rebased onto that version, which must be the current one)."""
        proposal, stored = await self._pending(principal, namespace, proposal_id)
        state = await self.memory.namespaces.state(namespace)
        if proposal.proposed_by == principal.writer_id and not state.config.allow_self_approval:
            raise MempError("forbidden", "no one approves their own proposal (the namespace "
                            "configuration may allow it: allow_self_approval)",
                            {"proposal": proposal_id})
        saved = msgspec.json.decode(stored.req or b"{}")
        incoming = saved.pop("incoming", None)
        is_cell = bool(saved.pop("cell", False))
        fields = {**saved, "value": str(saved["value"]).encode()}
        now = self.clock()
        request = WriteRequest(now=now, timestamp=now, timestamp_from_client=False,
                               actor=principal.writer_id, key_id=principal.key_id or "",
                               request_id=principal.request_id, **fields)
        rebased = base_version is not None and base_version != proposal.base_version
        if rebased and not is_cell:
            proposal, request = await self._rebase(principal, proposal, request, incoming,
                                                   base_version or 0, state)
        elif rebased:
            proposal = await self._rebased_cell(proposal, base_version or 0)
        base = proposal.base_version
        request = dataclasses.replace(request, if_version=base or None, if_absent=base == 0)
        if proposal.operation != "delete" and not is_cell:  # the schemas of today
            request = dataclasses.replace(request, schema_errors=await self.memory.check_schemas(
                namespace, proposal.key, request.value))
        cell = None
        if is_cell and base and not rebased:
            current = await self.memory.store.get(namespace, proposal.key, now)
            if (current.version if current else 0) != base:
                raise await self._moved(namespace, proposal)
        if is_cell:
            patch = msgspec.convert(incoming, CellPatch) if incoming is not None else None
            value, update = await self.cells.approval(proposal.key, request.value, base, patch,
                                                      now, rebased)
            request = dataclasses.replace(request, value=value)
            if rebased:
                proposal = msgspec.structs.replace(proposal, value=msgspec.Raw(value))
                proposal.diff = await self._diff_now(proposal)
            cell = self.cells.index.blocks(update)
        decided = msgspec.structs.replace(proposal, status="approved",
                                          decided_by=principal.writer_id, decided_at=now,
                                          version=base + 1)
        # The write takes no tokens (the proposal took them) but must fit the quotas.
        limit = self.memory.fair_share.gate(principal, namespace, "w", state.config.limits,
                                            cost=0, agent=proposal.proposed_by)
        verdict, reply = await self.store.decide(
            namespace, proposal.key, request, limit, cell, id=proposal.id, decision="approve",
            operation=proposal.operation, base=str(base), decided_by=principal.writer_id,
            doc=msgspec.json.encode(decided), details="")
        if cell is not None:
            self.cells.index.marked.ring()
        if verdict == "ok":
            entry = WriteOutcome.decode(["ok", reply]).entry(namespace, proposal.key,
                                                             request.value or None)
            return decided, entry
        if verdict in ("missing", "decided"):
            raise _decided(await self._load(namespace, proposal.id))
        outcome = WriteOutcome.decode(["ok", reply])
        self.memory.fair_share.check_write(outcome, limit, now)
        if verdict == "precondition_failed":
            raise await self._moved(namespace, proposal)
        raise MempError("write_conflict", "the stored entry wins (higher agent priority); the "
                        "proposal was not applied",
                        {"winner": outcome.entry(namespace, proposal.key)})

    async def _moved(self, namespace: str, proposal: Proposal) -> MempError:
        """409 with the current entry and the proposal's diff against it."""
        current = await self.memory.store.get(namespace, proposal.key, self.clock())
        fresh = diff(decoded(current.value if current else None), _proposed(proposal))
        return MempError(
            "write_conflict", "the key changed since the proposal was made; approve it again "
            "with base_version set to the current version to apply it rebased",
            {"key": proposal.key, "current": current,
             "current_version": current.version if current else 0,
             "base_version": proposal.base_version, "diff": fresh, "retryable": False})

    async def _rebase(self, principal: Principal, proposal: Proposal, request: WriteRequest,
                      incoming: Any, base_version: int, state: Any
                      ) -> tuple[Proposal, WriteRequest]:
        current = await self.memory.store.get(proposal.namespace, proposal.key, self.clock())
        if (current.version if current else 0) != base_version:
            raise await self._moved(proposal.namespace, proposal)
        if proposal.operation == "delete" and current is None:
            raise MempError("not_found", "the key the proposal deletes is gone",
                            {"key": proposal.key})
        if proposal.operation == "merge":
            options = PutOptions(base_version=proposal.base_version or None,
                                 ttl_seconds=request.ttl_seconds)
            rebased = await self.memory.proposal_request(
                proposal.proposed_by, principal, proposal.namespace, proposal.key, incoming,
                current, options, state, "merge")
            request = dataclasses.replace(request, value=rebased.value,
                                          conflicts=rebased.conflicts,
                                          schema_errors=rebased.schema_errors)
        value = NULL if proposal.operation == "delete" else msgspec.Raw(request.value)
        rebased_proposal = msgspec.structs.replace(proposal, base_version=base_version,
                                                   value=value)
        rebased_proposal.diff = msgspec.Raw(msgspec.json.encode(diff(
            decoded(current.value if current else None), _proposed(rebased_proposal))))
        return rebased_proposal, request

    async def _rebased_cell(self, proposal: Proposal, base_version: int) -> Proposal:
        current = await self.memory.store.get(proposal.namespace, proposal.key, self.clock())
        if (current.version if current else 0) != base_version or proposal.base_version == 0:
            raise await self._moved(proposal.namespace, proposal)
        return msgspec.structs.replace(proposal, base_version=base_version)

    async def _diff_now(self, proposal: Proposal) -> msgspec.Raw:
        current = await self.memory.store.get(proposal.namespace, proposal.key, self.clock())
        return msgspec.Raw(msgspec.json.encode(diff(
            decoded(current.value if current else None), _proposed(proposal))))

    async def reject(self, principal: Principal, namespace: str, proposal_id: str,
                     reason: str) -> Proposal:
        if len(reason) > MAX_REASON:
            raise MempError("invalid_request", f"reason is over {MAX_REASON} characters")
        proposal, _ = await self._pending(principal, namespace, proposal_id)
        return await self._close(namespace, proposal, "reject", principal.writer_id, reason,
                                 principal)

    async def _close(self, namespace: str, proposal: Proposal, decision: str, by: str,
                     reason: str | None, principal: Principal | None) -> Proposal:
        now = self.clock()
        status = "rejected" if decision == "reject" else "expired"
        closed = msgspec.structs.replace(proposal, status=status,
                                         decided_by=by, decided_at=now, reason=reason or None)
        request = WriteRequest(agent_id=proposal.proposed_by, now=now, timestamp=now,
                               timestamp_from_client=False, actor=by,
                               key_id=principal.key_id or "" if principal else "",
                               request_id=principal.request_id if principal else "")
        verdict, _ = await self.store.decide(
            namespace, proposal.key, request, open_gate(namespace), id=proposal.id,
            decision=decision,
            operation=proposal.operation, base=str(proposal.base_version), decided_by=by,
            doc=msgspec.json.encode(closed),
            details=msgspec.json.encode({"reason": reason}).decode() if reason else "")
        if verdict in ("missing", "decided"):
            raise _decided(await self._load(namespace, proposal.id))
        return closed

    async def expire_due(self, namespace: str) -> int:
        """Close the namespace's pending proposals whose time is up; returns how many."""
        closed = 0
        for proposal_id in await self.store.due(namespace, self.clock(), 100):
            stored = await self.store.load(namespace, proposal_id)
            if stored is None or stored.status != "pending":
                continue
            try:
                proposal = msgspec.json.decode(stored.doc, type=Proposal)
            except (msgspec.DecodeError, RecursionError) as exc:  # never closed, in no one's way
                skipped(CorruptRecord(f"stored proposal of {namespace}: {exc}"))
                continue
            try:
                await self._close(namespace, proposal, "expire", "system", None, None)
                closed += 1
            except MempError:  # another process closed it first
                continue
        return closed


def _decided(proposal: Proposal) -> MempError:
    return MempError("write_conflict", f"the proposal is {proposal.status} already",
                     {"key": proposal.key, "proposal": proposal})
