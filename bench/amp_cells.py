"""The AMP benchmark's data: memory cells with text drawn from a Zipf-distributed vocabulary
(a few very common words, a long tail of rare ones, as in real notes), spread evenly over the
owners, and the searches and creates sent against them."""

from __future__ import annotations

import itertools
import os
import random
from datetime import UTC, datetime
from typing import Any

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DAY_MS = 86_400_000
COMMON = ("the", "to", "of", "and", "in", "is", "for", "on", "with", "user", "prefers", "asked",
          "about", "their", "last", "week", "wants", "likes", "said", "team")
TYPES = ("episodic", "semantic", "procedural")
TOPICS = ("billing", "support", "onboarding", "preferences", "travel", "health", "work")


def ulid(ms: int, rng: random.Random) -> str:
    """A ULID for time `ms` (48 bits of ms, 80 random bits), as the broker's ids."""
    value = (ms << 80) | rng.getrandbits(80)
    return "".join(_CROCKFORD[(value >> (5 * i)) & 31] for i in reversed(range(26)))


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


class Corpus:
    """Words to write cells with: 5,000 made-up content words, Zipf-distributed (s = 1)."""

    def __init__(self, rng: random.Random, size: int = 5000) -> None:
        syllables = ["".join(p) for p in itertools.product("bdfgklmnprstvz", "aeiou")]
        words: set[str] = set()
        while len(words) < size:
            words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
        self.words = sorted(words)
        rng.shuffle(self.words)
        self.weights = list(itertools.accumulate(1 / rank for rank in range(1, size + 1)))

    def text(self, rng: random.Random) -> tuple[str, list[str]]:
        """A note of 12-30 words, a third of them common words; and its content words."""
        content = rng.choices(self.words, cum_weights=self.weights, k=rng.randint(8, 20))
        words = content + rng.choices(COMMON, k=len(content) // 2)
        rng.shuffle(words)
        return " ".join(words).capitalize() + ".", content


def cell(rng: random.Random, corpus: Corpus, owner: str, created_by: str, now_ms: int
         ) -> tuple[dict[str, Any], list[str]]:
    """A full MemoryCell for /amp/import, created within the last 30 days; its score stays at
    0.3 or more for weeks, so it is active throughout the run."""
    created = now_ms - rng.randrange(30 * _DAY_MS)
    text, content = corpus.text(rng)
    return {
        "id": ulid(created, rng),
        "amp_version": "0.1.0",
        "type": rng.choice(TYPES),
        "content": {"text": text, "metadata": {"topic": rng.choice(TOPICS),
                                               "source": "bench"}},
        "identity": {"owner_id": owner, "owner_type": "user", "created_by": created_by,
                     "session_id": f"s-{rng.randrange(10_000)}"},
        "scoring": {"importance": round(rng.uniform(0.5, 1.0), 3),
                    "confidence": round(rng.uniform(0.9, 1.0), 3), "decay_rate": 0.01,
                    "access_count": 0},
        "lifecycle": {"created_at": iso(created), "last_updated_at": iso(created),
                      "status": "active"},
        "access_policy": {"readable_by": [], "writable_by": [], "public": False},
        "provenance": {"source_type": "conversation", "source_ref": f"conv-{created}",
                       "extraction_method": "llm-summary"},
    }, content


def new_cell(rng: random.Random, corpus: Corpus, owner: str) -> dict[str, Any]:
    """A body for POST /amp/memories."""
    text, _ = corpus.text(rng)
    return {
        "type": rng.choice(TYPES),
        "content": {"text": text, "metadata": {"topic": rng.choice(TOPICS), "source": "bench"}},
        "identity": {"owner_id": owner, "owner_type": "user"},
        "scoring": {"importance": round(rng.uniform(0.5, 1.0), 3),
                    "confidence": round(rng.uniform(0.9, 1.0), 3)},
        "provenance": {"source_type": "conversation", "source_ref": f"conv-{os.getpid()}",
                       "extraction_method": "llm-summary"},
    }


def query(rng: random.Random, content: list[str]) -> str:
    """A text query: two or three content words of one of the owner's cells."""
    return " ".join(rng.sample(sorted(set(content)), min(len(set(content)), rng.randint(2, 3))))
