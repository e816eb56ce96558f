"""AMP's rules as pure functions: the decay formula, when a cell crosses the stale threshold,
and the access policy with owner and creator bypass (AMP spec sections 3 and 4)."""

from __future__ import annotations

import math

from broker.amp.cells import MemoryCell
from broker.core.grammar import glob_match

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


def writers(cell: MemoryCell) -> list[str]:
    """Globs of the agents that may write: the owner (when an agent), the creator, and
    `writable_by`. Owner and creator ids cannot hold `*`, so each matches only itself."""
    identity = cell.identity
    owner = [identity.owner_id] if identity.owner_type == "agent" else []
    creator = [identity.created_by] if identity.created_by else []
    return [*owner, *creator, *cell.access_policy.writable_by]


def readers(cell: MemoryCell) -> list[str]:
    """Globs of the agents that may read: everyone for a public cell, else the writers and
    `readable_by`. Stored in the cell's index record, so a read is counted in the same call
    that fetches the cell (`amp_read.lua`)."""
    policy = cell.access_policy
    return ["*"] if policy.public else [*writers(cell), *policy.readable_by]


def can_write(cell: MemoryCell, agent_id: str) -> bool:
    """Owner (when an agent) and creator always may; otherwise `writable_by` decides."""
    return any(glob_match(p, agent_id) for p in writers(cell))


def can_read(cell: MemoryCell, agent_id: str) -> bool:
    """Public cells, `readable_by`, and whoever may write."""
    return any(glob_match(p, agent_id) for p in readers(cell))
