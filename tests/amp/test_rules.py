"""AMP's rules as pure functions (broker/amp/rules.py): the decay formula and when a cell
crosses 0.3 (spec section 3), the access policy with wildcards and the owner and creator bypass
(spec section 4); and the ULIDs the server assigns (spec section 1)."""

from __future__ import annotations

import math
import time

import msgspec
import pytest

from broker.amp.cells import ULID_RE, MemoryCell, new_ulid
from broker.amp.rules import DAY_MS, STALE_BELOW, can_read, can_write, decay_score, stale_at

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`

# ---- decay ----


@pytest.mark.parametrize(("importance", "confidence", "rate", "days", "expected"), [
    pytest.param(1.0, 1.0, 0.01, 0, 1.0, id="fresh"),
    pytest.param(0.8, 0.5, 0.01, 0, 0.4, id="product-of-scores"),
    pytest.param(1.0, 1.0, 0.01, 100, math.exp(-1), id="default-rate-100-days"),
    pytest.param(0.9, 0.7, 0.05, 10, 0.63 * math.exp(-0.5), id="faster-decay"),
    pytest.param(0.5, 1.0, 0.0, 10_000, 0.5, id="no-decay"),
    pytest.param(0.0, 1.0, 0.01, 1, 0.0, id="zero-importance"),
    pytest.param(1.0, 1.0, 0.01, 0.5, math.exp(-0.005), id="fraction-of-a-day"),
])
def test_decay_score_is_importance_times_confidence_times_exponential(
        importance: float, confidence: float, rate: float, days: float, expected: float) -> None:
    score = decay_score(importance, confidence, rate, int(days * DAY_MS))
    assert score == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_decay_never_rises_with_a_clock_that_runs_backwards() -> None:
    assert decay_score(0.7, 0.9, 0.01, -5 * DAY_MS) == pytest.approx(0.63)


@pytest.mark.parametrize(("importance", "confidence", "rate"), [
    pytest.param(1.0, 1.0, 0.01, id="default-rate"),
    pytest.param(0.6, 1.0, 0.01, id="crosses-after-ln2-over-rate"),
    pytest.param(0.9, 0.5, 0.2, id="fast"),
    pytest.param(0.31, 1.0, 0.001, id="just-above"),
])
def test_stale_at_is_where_the_score_crosses_the_threshold(
        importance: float, confidence: float, rate: float) -> None:
    reference = 1_700_000_000_000
    due = stale_at(importance, confidence, rate, reference)
    expected_days = math.log(importance * confidence / STALE_BELOW) / rate
    assert due == pytest.approx(reference + expected_days * DAY_MS)
    assert decay_score(importance, confidence, rate, math.floor(due) - reference - 1) >= 0.3
    assert decay_score(importance, confidence, rate, math.ceil(due) - reference + 1) < 0.3


def test_stale_at_for_a_cell_already_below_the_threshold_is_now() -> None:
    assert stale_at(0.5, 0.5, 0.01, 1234) == 1234


def test_a_cell_that_does_not_decay_never_goes_stale() -> None:
    assert stale_at(0.5, 1.0, 0.0, 1234) == math.inf


def test_threshold_is_inclusive_of_point_three() -> None:
    assert STALE_BELOW == 0.3
    assert stale_at(0.3, 1.0, 0.01, 0) == 0.0  # exactly 0.3 now, below from the next moment
    assert decay_score(0.3, 1.0, 0.01, 0) >= STALE_BELOW


# ---- access policy ----


def cell(owner: str = "u-1", owner_type: str = "user", created_by: str | None = "creator",
         readable_by: tuple[str, ...] = (), writable_by: tuple[str, ...] = (),
         public: bool = False) -> MemoryCell:
    return msgspec.convert({
        "id": new_ulid(), "type": "semantic", "content": {"text": "x"},
        "identity": {"owner_id": owner, "owner_type": owner_type, "created_by": created_by},
        "access_policy": {"readable_by": list(readable_by), "writable_by": list(writable_by),
                          "public": public},
    }, MemoryCell)


@pytest.mark.parametrize(("pattern", "agent", "allowed"), [
    pytest.param("agent-team-*", "agent-team-1", True, id="suffix-wildcard"),
    pytest.param("agent-team-*", "agent-team-dev", True, id="suffix-wildcard-word"),
    pytest.param("agent-team-*", "agent-team-", True, id="wildcard-matches-empty"),
    pytest.param("agent-team-*", "agent-other-1", False, id="other-prefix"),
    pytest.param("agent-team-*", "xagent-team-1", False, id="anchored-at-start"),
    pytest.param("*-reader", "billing-reader", True, id="prefix-wildcard"),
    pytest.param("*-reader", "billing-reader-2", False, id="anchored-at-end"),
    pytest.param("a*b*c", "a-1-b-2-c", True, id="several-wildcards"),
    pytest.param("*", "anyone", True, id="star-alone"),
    pytest.param("agent-7", "agent-7", True, id="exact"),
    pytest.param("agent-7", "agent-70", False, id="exact-is-not-prefix"),
    pytest.param("agent.7", "agentx7", False, id="dot-is-literal"),
])
def test_readable_by_patterns(pattern: str, agent: str, allowed: bool) -> None:
    assert can_read(cell(readable_by=(pattern,)), agent) is allowed
    assert can_write(cell(readable_by=(pattern,)), agent) is False


@pytest.mark.parametrize(("pattern", "agent", "allowed"), [
    pytest.param("ops-*", "ops-1", True, id="wildcard"),
    pytest.param("ops-*", "dev-1", False, id="no-match"),
    pytest.param("ops-2", "ops-2", True, id="exact"),
])
def test_writable_by_patterns_grant_write_and_read(pattern: str, agent: str,
                                                   allowed: bool) -> None:
    policy = cell(writable_by=(pattern,))
    assert can_write(policy, agent) is allowed
    assert can_read(policy, agent) is allowed


def test_public_lets_anyone_read_but_not_write() -> None:
    assert can_read(cell(public=True), "stranger")
    assert not can_write(cell(public=True), "stranger")


def test_nobody_else_gets_in_by_default() -> None:
    assert not can_read(cell(), "stranger")
    assert not can_write(cell(), "stranger")


def test_creator_bypasses_the_policy() -> None:
    locked = cell(created_by="creator", readable_by=("someone-else",))
    assert can_read(locked, "creator")
    assert can_write(locked, "creator")


def test_agent_owner_bypasses_the_policy() -> None:
    owned = cell(owner="agent-9", owner_type="agent", created_by="creator")
    assert can_read(owned, "agent-9")
    assert can_write(owned, "agent-9")


@pytest.mark.parametrize("owner_type", ["user", "organization"])
def test_an_owner_that_is_not_an_agent_gets_no_bypass(owner_type: str) -> None:
    owned = cell(owner="agent-9", owner_type=owner_type, created_by="creator")
    assert not can_read(owned, "agent-9")
    assert not can_write(owned, "agent-9")


def test_a_cell_without_a_creator_has_no_creator_bypass() -> None:
    assert not can_read(cell(created_by=None), "creator")


# ---- ULIDs ----


def test_ulid_is_26_crockford_characters_with_the_time_first() -> None:
    ms = 1_700_000_000_123
    ulid = new_ulid(ms)
    assert ULID_RE.fullmatch(ulid)
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    decoded = 0
    for char in ulid[:10]:
        decoded = decoded * 32 + alphabet.index(char)
    assert decoded == ms


def test_ulids_sort_by_time_and_are_unique() -> None:
    earlier = [new_ulid(1_700_000_000_000) for _ in range(200)]
    later = new_ulid(1_700_000_000_001)
    assert len(set(earlier)) == 200
    assert all(u < later for u in earlier)
    assert new_ulid()[:6] == new_ulid(time.time_ns() // 1_000_000)[:6]


@pytest.mark.parametrize("text", [
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FA", id="25-chars"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FAVX", id="27-chars"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FAI", id="letter-I"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FAU", id="letter-U"),
    pytest.param("81ARZ3NDEKTSV4RRFFQ69G5FAV", id="overflows-128-bits"),
    pytest.param("01ARZ3NDEKTSV4RRFFQ69G5FA-", id="punctuation"),
])
def test_malformed_ulids_are_not_ulids(text: str) -> None:
    assert not ULID_RE.fullmatch(text)
