"""The agent a caller acts as on the AMP API: the `X-AMP-Agent-ID` header (or an MCP tool's
`agent` argument), which must be the caller's own agent unless it may impersonate."""

from __future__ import annotations

from broker.amp.cells import NAME_RE
from broker.core.errors import MempError
from broker.services.auth import Principal
from broker.services.identities import check_claimable


def acting_agent(principal: Principal, namespace: str, claimed: str | None,
                 field: str = "X-AMP-Agent-ID") -> str:
    """The agent a caller acts as on the AMP API (`claimed`, else its own). Every agent
    operation needs the `amp` permission on the AMP namespace (admin implies it); AMP's policy
    then decides, cell by cell. `field` names where the claim came from, in errors."""
    principal.require("amp", namespace)
    if claimed is None or claimed == "":
        if principal.agent_id is None:
            raise MempError("invalid_request", f"{field} is required with a token that is not "
                            "bound to an agent", {"field": field})
        return agent_id(principal.agent_id, field)
    agent_id(claimed, field)
    if claimed != principal.agent_id and not principal.can("impersonate", namespace):
        raise MempError("forbidden", f"{field} names another agent, and this token may not "
                        "act for other agents", {"agent_id": claimed})
    return claimed


def agent_id(agent: str, field: str = "X-AMP-Agent-ID") -> str:
    """The acting agent is stored in cells (`created_by`), so it must be a valid AMP name, and
    not one of the broker's own identities."""
    if not NAME_RE.fullmatch(agent):
        raise MempError("invalid_request", f"{field} is not a valid agent id (1-128 of "
                        "A-Z a-z 0-9 . _ : @ + -)", {"field": field})
    return check_claimable(agent, field)
