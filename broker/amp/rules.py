"""AMP's rules as pure functions: the decay formula, when a cell crosses the stale threshold,
and the access policy with owner and creator bypass (AMP spec sections 3 and 4)."""

from __future__ import annotations

import math

from broker.amp.cells import MemoryCell
from broker.keys import glob_match

DAY_MS = 86_400_000
STALE_BELOW = 0.3
ARCHIVE_AFTER_MS = 30 * DAY_MS
PURGE_AFTER_MS = 30 * DAY_MS


def decay_score(importance: float, confidence: float, decay_rate: float, elapsed_ms: int
                ) -> float:
    """importance x confidence x e^(-decay_rate x days elapsed)."""
    days = max(elapsed_ms, 0) / DAY_MS
    return importance * confidence * math.exp(-decay_rate * days)


def stale_at(importance: float, confidence: float, decay_rate: float, reference_ms: int
             ) -> float:
    """The time (ms) the score falls below the threshold; +inf if it never does."""
    weight = importance * confidence
    if weight < STALE_BELOW:
        return float(reference_ms)
    if decay_rate <= 0:
        return math.inf
    return reference_ms + math.log(weight / STALE_BELOW) / decay_rate * DAY_MS


def _agent_owned(cell: MemoryCell, agent_id: str) -> bool:
    identity = cell.identity
    return (identity.owner_type == "agent" and identity.owner_id == agent_id) or (
        identity.created_by == agent_id)


def can_write(cell: MemoryCell, agent_id: str) -> bool:
    """Owner (when an agent) and creator always may; otherwise `writable_by` decides."""
    return _agent_owned(cell, agent_id) or any(
        glob_match(p, agent_id) for p in cell.access_policy.writable_by)


def can_read(cell: MemoryCell, agent_id: str) -> bool:
    """Public cells, `readable_by`, and whoever may write."""
    policy = cell.access_policy
    return policy.public or can_write(cell, agent_id) or any(
        glob_match(p, agent_id) for p in policy.readable_by)
