"""Approval-gated writes as the core sees them: a write that needs approval goes to an
`ApprovalGate` that the wiring passes in (governance: broker/governance/gate.py) and ends in
`Proposed`, answered 202 with the proposal, instead of a write."""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.models import Entry, Proposal
from broker.services.auth import Principal
from broker.storage import fairshare
from broker.storage.records import WriteOutcome, WriteRequest


class Proposed(Exception):
    """A gated write became a proposal instead of a write (answered 202)."""

    def __init__(self, proposal: Proposal) -> None:
        super().__init__(proposal.id)
        self.proposal = proposal


def pending(gated: Proposed) -> dict[str, Any]:
    """What a message or an MCP tool answers for a write that became a proposal."""
    return {"status": "pending_approval", "proposal": gated.proposal}


class ApprovalGate(Protocol):
    """Where gated writes go: `request` is the write an approval would make against
    `current`; making the proposal takes the write's tokens (`limit`)."""

    async def propose(self, principal: Principal, namespace: str, key: str, operation: str,
                      current: Entry | None, request: WriteRequest, incoming: Any,
                      limit: fairshare.Gate) -> Proposal | WriteOutcome:
        """The proposal made, or the first reply to its message id: that proposal, or the
        outcome of a write when the id was first used before the key was gated."""
        ...

    async def replayed(self, namespace: str, proposal_id: str) -> Proposal:
        """The proposal a message id was first answered with."""
        ...
