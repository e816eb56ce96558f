"""Globs as tenants write them: the matcher's definition, generated globs and texts, and globs
that make a backtracking matcher take exponential time."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st


def reference_glob(glob: str, text: str) -> bool:
    """The definition, slowly: the text positions reachable after each glob character, where
    `*` reaches every position from the first reachable one and any other character itself."""
    reachable = {0}
    for char in glob:
        if char == "*":
            reachable = set(range(min(reachable), len(text) + 1)) if reachable else set()
        else:
            reachable = {i + 1 for i in reachable if i < len(text) and text[i] == char}
    return len(text) in reachable


GLOBS_SMALL = st.text(alphabet="ab*", max_size=12)
TEXTS_SMALL = st.text(alphabet="ab", max_size=12)
AGENT_CHARS = "abcxyzAZ09._:@+-"
GLOBS_WIDE = st.lists(st.one_of(st.text(AGENT_CHARS, max_size=4), st.just("*"),
                                st.just("**")), max_size=8).map("".join)


# Patterns a tenant may write (a grant, a share, an agent priority, an AMP policy) that make a
# backtracking engine take time exponential in the number of stars, against texts they miss.
HOSTILE_GLOBS = [
    pytest.param("*" * 128 + "Z", "a" * 10_000, id="128-stars-then-a-letter"),
    pytest.param("*a" * 64 + "Z", "a" * 10_000, id="star-letter-64-times"),
    pytest.param("acme-" + "*" * 120 + ".", "acme-" + "x" * 5_000, id="grant-shaped"),
    pytest.param("*********Z", "agent-" * 2_000, id="nine-stars"),
    pytest.param("*ab" * 40 + "*", "ab" * 39 + "a" * 5_000, id="one-part-short"),
]
