"""What the AMP bridge indexes about a cell, by AMP's rules: its search terms, the decay
reference time, when each lifecycle transition falls due, and who may read it. The records
themselves are kept by broker/storage/amp.py."""

from __future__ import annotations

import math
import re

from broker.amp.cells import MemoryCell, parse_time
from broker.amp.rules import ARCHIVE_AFTER_MS, PURGE_AFTER_MS, readers, stale_at
from broker.storage.amp import IndexUpdate

_TERM_RE = re.compile(r"[a-z0-9]+")
MAX_TERMS = 200


def words_of(text: str) -> list[str]:
    """Lowercase alphanumeric words of 2-40 characters, in order, repeats kept."""
    return [w for w in _TERM_RE.findall(text.lower()) if 2 <= len(w) <= 40]


def terms_of(text: str) -> set[str]:
    """The distinct words of a text (at most MAX_TERMS per cell)."""
    return set(sorted(set(words_of(text)))[:MAX_TERMS])


def _ms(value: str | None, field: str) -> int | None:
    return parse_time(value, field) if value else None


def reference_ms(cell: MemoryCell) -> int:
    """The decay clock: the latest of created, updated and accessed."""
    life = cell.lifecycle
    times = [_ms(life.created_at, "lifecycle.created_at"),
             _ms(life.last_updated_at, "lifecycle.last_updated_at"),
             _ms(life.last_accessed_at, "lifecycle.last_accessed_at")]
    return max(t for t in times if t is not None) if any(times) else 0


def due_times(cell: MemoryCell, ref: int) -> dict[str, int]:
    """When the lifecycle engine should next look at the cell, per transition, given its decay
    reference time; a time is the earliest the transition can apply (a later read or update
    only moves it on, and the engine checks again before acting)."""
    life = cell.lifecycle
    status = life.status
    due: dict[str, int] = {}
    if status == "active":
        scoring = cell.scoring
        at = stale_at(scoring.importance, scoring.confidence, scoring.decay_rate, ref)
        if math.isfinite(at):
            due["stale"] = int(at)
    if status == "stale":
        since = _ms(life.stale_since, "lifecycle.stale_since") or ref
        due["archive"] = max(since, ref) + ARCHIVE_AFTER_MS
    if status in ("active", "stale"):
        expires = _ms(life.expires_at, "lifecycle.expires_at")
        if expires is not None:
            due["expire"] = expires
    if status == "deleted":
        due["purge"] = (_ms(life.deleted_at, "lifecycle.deleted_at") or ref) + PURGE_AFTER_MS
    return due


def index_update(cell: MemoryCell, key: str, ref: int, *, version: int | None = None,
                 count: int | None = None, created: bool = True, terms: bool = True,
                 recheck: bool = False) -> IndexUpdate:
    """What a write of `cell` (or the engine's look at it) changes in its indexes. `ref` is the
    decay reference time the writer saw; `version` the entry version the update describes when
    it comes without a write (it then applies only while the entry still holds it); `count` an
    access count to set (create, import); `created` False when the cell is known to the
    creation order; `terms` False when its text and searchability cannot have changed;
    `recheck` marks a stale cell for the engine to look at again."""
    life = cell.lifecycle
    words: list[str] | None = None
    if terms:
        words = sorted(terms_of(cell.content.text)) \
            if life.status in ("active", "stale", "archived") else []
    return IndexUpdate(
        id=cell.id, key=key, status=life.status, ref=ref, version=version, count=count,
        accessed=_ms(life.last_accessed_at, "lifecycle.last_accessed_at"),
        created=(_ms(life.created_at, "lifecycle.created_at") or ref) if created else None,
        dues=due_times(cell, ref),
        recheck=True if recheck else (None if life.status == "stale" else False),
        readers=readers(cell), expires=_ms(life.expires_at, "lifecycle.expires_at"),
        terms=words)
