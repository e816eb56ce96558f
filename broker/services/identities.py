"""Identities the broker itself writes as; no key, token or AMP header may claim them.

Every write records its author. The admin key writes as `admin`, an API key bound to no agent as
its key id (`key_...`), a JWT without a subject as `jwt:anonymous`, and the AMP lifecycle engine
as `amp-lifecycle`. A key bound to, or a token naming, one of these would be attributed another
principal's writes and could pass another principal's agent-priority or AMP policy checks."""

from __future__ import annotations

from broker.core.errors import MempError

ADMIN = "admin"
AMP_ENGINE = "amp-lifecycle"
_RESERVED = frozenset({ADMIN, AMP_ENGINE, "anonymous", "cli", "system"})
_RESERVED_PREFIXES = ("key_", "jwt:")


def is_reserved(agent_id: str) -> bool:
    return agent_id.lower() in _RESERVED or agent_id.startswith(_RESERVED_PREFIXES)


def check_claimable(agent_id: str, field: str = "agent_id") -> str:
    """Refuse (403) an agent id that names one of the broker's own identities."""
    if is_reserved(agent_id):
        raise MempError("forbidden", f"{field} {agent_id!r} is reserved for the broker's own "
                        "identities", {"field": field, "agent_id": agent_id})
    return agent_id
