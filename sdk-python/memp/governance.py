"""Proposals (approval-gated writes) and the audit log, for `MEMP` and `AsyncMEMP` alike
(the broker's docs/governance.md)."""

from __future__ import annotations

import builtins
from datetime import datetime

from memp import _calls
from memp._transport import AsyncTransport, SyncTransport
from memp.models import Approval, AuditPage, AuditRecord, AuditVerdict, Proposal, ProposalPage

Bound = int | datetime | str | None  # Unix ms, a datetime, or an ISO 8601 time


class Proposals:
    """Gated writes of the client's namespace (or `namespace=`): holders of `review` see and
    decide all of them; a writer sees its own."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    def list(self, *, status: str | None = None, key: str | None = None,
             cursor: str | None = None, limit: int | None = None,
             namespace: str | None = None) -> ProposalPage:
        """One page, newest first; pass `next_cursor` back for the next."""
        return self._transport.send(_calls.list_proposals(
            self._config.require_namespace(namespace), status, key, cursor, limit))

    def get(self, proposal_id: str, *, namespace: str | None = None) -> Proposal:
        """A proposal with its RFC 6902 `diff`."""
        return self._transport.send(_calls.get_proposal(
            self._config.require_namespace(namespace), proposal_id))

    def approve(self, proposal_id: str, *, base_version: int | None = None,
                namespace: str | None = None) -> Approval:
        """Write the proposal. If the key moved since, ConflictError carries `current`,
        `current_version` and a fresh `diff` in its details; approve again with
        `base_version=current_version` to apply it rebased."""
        return self._transport.send(_calls.approve_proposal(
            self._config.require_namespace(namespace), proposal_id, base_version))

    def reject(self, proposal_id: str, reason: str = "", *,
               namespace: str | None = None) -> Proposal:
        return self._transport.send(_calls.reject_proposal(
            self._config.require_namespace(namespace), proposal_id, reason))


class AsyncProposals:
    """Gated writes of a namespace; see `Proposals`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    async def list(self, *, status: str | None = None, key: str | None = None,
                   cursor: str | None = None, limit: int | None = None,
                   namespace: str | None = None) -> ProposalPage:
        return await self._transport.send(_calls.list_proposals(
            self._config.require_namespace(namespace), status, key, cursor, limit))

    async def get(self, proposal_id: str, *, namespace: str | None = None) -> Proposal:
        return await self._transport.send(_calls.get_proposal(
            self._config.require_namespace(namespace), proposal_id))

    async def approve(self, proposal_id: str, *, base_version: int | None = None,
                      namespace: str | None = None) -> Approval:
        return await self._transport.send(_calls.approve_proposal(
            self._config.require_namespace(namespace), proposal_id, base_version))

    async def reject(self, proposal_id: str, reason: str = "", *,
                     namespace: str | None = None) -> Proposal:
        return await self._transport.send(_calls.reject_proposal(
            self._config.require_namespace(namespace), proposal_id, reason))


class Audit:
    """The namespace's hash-chained audit log; needs `audit` (or `admin`)."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    def list(self, *, since: Bound = None, until: Bound = None, actor: str | None = None,
             key: str | None = None, action: str | None = None, cursor: str | None = None,
             limit: int | None = None, after: str | None = None,
             namespace: str | None = None) -> AuditPage:
        """One page, newest first; pass `next_cursor` back for the next. `after`: only
        records appended after that record id."""
        return self._transport.send(_calls.list_audit(
            self._config.require_namespace(namespace), since=since, until=until, actor=actor,
            key=key, action=action, cursor=cursor, limit=limit, after=after))

    def export(self, *, since: Bound = None, until: Bound = None, actor: str | None = None,
               key: str | None = None, action: str | None = None, after: str | None = None,
               namespace: str | None = None) -> builtins.list[AuditRecord]:
        """Every record of the selection, newest first (the broker's NDJSON export). For an
        incremental export pass the newest id the last one returned as `after`."""
        return self._transport.send(_calls.export_audit(
            self._config.require_namespace(namespace), since=since, until=until, actor=actor,
            key=key, action=action, after=after))

    def verify(self, *, namespace: str | None = None) -> AuditVerdict:
        """Walk the hash chain: `ok` is False, with `broken`, if a record was tampered with."""
        return self._transport.send(_calls.verify_audit(self._config.require_namespace(namespace)))


class AsyncAudit:
    """The namespace's audit log; see `Audit`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    async def list(self, *, since: Bound = None, until: Bound = None, actor: str | None = None,
                   key: str | None = None, action: str | None = None,
                   cursor: str | None = None, limit: int | None = None,
                   after: str | None = None, namespace: str | None = None) -> AuditPage:
        return await self._transport.send(_calls.list_audit(
            self._config.require_namespace(namespace), since=since, until=until, actor=actor,
            key=key, action=action, cursor=cursor, limit=limit, after=after))

    async def export(self, *, since: Bound = None, until: Bound = None,
                     actor: str | None = None, key: str | None = None,
                     action: str | None = None, after: str | None = None,
                     namespace: str | None = None) -> builtins.list[AuditRecord]:
        return await self._transport.send(_calls.export_audit(
            self._config.require_namespace(namespace), since=since, until=until, actor=actor,
            key=key, action=action, after=after))

    async def verify(self, *, namespace: str | None = None) -> AuditVerdict:
        return await self._transport.send(_calls.verify_audit(
            self._config.require_namespace(namespace)))
