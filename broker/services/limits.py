"""Fair share: a namespace's `limits` (rates and quotas), every agent's default rates, and the
refusals when a request goes over them. The counting happens in Redis, inside the write
scripts or one rate script (broker/storage/fairshare.py); see docs/limits.md."""

from __future__ import annotations

import math
import random
from typing import Annotated

import msgspec

from broker.core.clock import Clock
from broker.core.errors import MempError
from broker.core.models import MAX_SAFE_INT
from broker.runtime.metrics import Metrics
from broker.runtime.settings import Settings
from broker.services.auth import Principal
from broker.storage.fairshare import FairShareStore, Gate, Rate, open_gate
from broker.storage.records import WriteOutcome

# Requests per second. A bucket's interval and its key's expiry (up to burst / rate seconds,
# 31 years at the extremes) stay within what Redis and a double hold.
MIN_RATE, MAX_RATE = 0.001, 1_000_000
PerSecond = Annotated[float, msgspec.Meta(ge=MIN_RATE, le=MAX_RATE)]
Burst = Annotated[int, msgspec.Meta(ge=1, le=MAX_RATE)]
Quota = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE_INT)]
_MAX_CLOSED = 100_000  # buckets remembered as closed, per process
_MAX_GATES = 100_000  # gates kept for reuse, per process
_FLOOD = 10  # requests a bucket refused in a row before the next refusals are held
_FLOOD_GAP_MS = 500  # a bucket open longer than this before its next refusal ends a flood
_KINDS = {"w": ("writes_per_second", "write"), "r": ("reads_per_second", "read")}


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True,
             frozen=True):
    """A namespace's rates (per second, with a burst: the requests admitted at once; default
    the rate, at least 1) and quotas. Every field is optional; a missing one is no limit."""

    writes_per_second: PerSecond | None = None
    write_burst: Burst | None = None
    reads_per_second: PerSecond | None = None
    read_burst: Burst | None = None
    max_keys: Quota | None = None
    max_bytes: Quota | None = None
    max_streams: Quota | None = None


class RateLimited(MempError):
    """`rate_limited`. `hold_ms`: how long to hold the answer before sending it. A client that
    keeps sending while its bucket is closed (it ignores Retry-After: a flood) gets its
    refusals late, so each of its connections sends at most one request per hold and the
    flood stops eating the process's time (nginx's limit_req delays excess the same way)."""

    def __init__(self, message: str, details: dict[str, object], *, headers: dict[str, str],
                 hold_ms: int = 0) -> None:
        super().__init__("rate_limited", message, details, headers)
        self.hold_ms = hold_ms


def check_limits(limits: Limits | None) -> None:
    """Refuse a burst given without its rate (it would mean nothing)."""
    if limits is None:
        return
    for rate, burst in (("writes_per_second", "write_burst"), ("reads_per_second", "read_burst")):
        if getattr(limits, burst) is not None and getattr(limits, rate) is None:
            raise MempError("invalid_request", f"limits: {burst} needs {rate}",
                            {"field": f"limits.{burst}"})


def rate(per_second: float | None, burst: int | None) -> Rate | None:
    """A Rate, its burst defaulting to the rate (at least 1); None when `per_second` is off."""
    if not per_second:
        return None
    return Rate(per_second, burst or max(1, math.ceil(per_second)))


class AgentDefaults(msgspec.Struct, kw_only=True):
    """The limits every agent and credential (and, for proposals, every namespace) has from
    the broker's settings (null: none)."""

    writes_per_second: float | None
    write_burst: int | None
    reads_per_second: float | None
    read_burst: int | None
    max_streams_per_token: int | None
    max_pending_proposals: int | None


class Usage(msgspec.Struct, kw_only=True):
    """Live keys, bytes of stored values, open streams, pending proposals, and bytes of the
    proposals kept (pending or closed), on every broker process. `max_bytes` holds `bytes`
    and `proposal_bytes` together."""

    keys: int
    bytes: int
    streams: int
    proposals: int
    proposal_bytes: int


class UsageReport(msgspec.Struct, kw_only=True):
    """`GET /v1/namespaces/{ns}/usage`: what the namespace uses against its limits."""

    namespace: str
    limits: Limits
    usage: Usage
    agent_defaults: AgentDefaults


class FairShare:
    """Builds each request's gate and turns the store's refusals into errors (and metrics).
    The broker's admin key (MEMP_ADMIN_KEY) is exempt from rates; quotas hold for everyone.

    A bucket that refused a request admits nothing before the wait it named (its time only
    moves on), so this process remembers that and refuses the bucket's requests until then
    without asking Redis: a flood that is over its rate costs no round trip. The memory is
    keyed by the bucket's rate too, so a changed limit is asked about afresh."""

    def __init__(self, settings: Settings, store: FairShareStore, metrics: Metrics,
                 clock: Clock) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        # bucket -> [ms it reopens, requests refused here since it closed]
        self._closed: dict[tuple[str, str, str, Rate], list[int]] = {}
        self.hold_ms = settings.rate_limit_hold_ms
        self._gates: dict[tuple[object, ...], Gate] = {}
        self.agent_rates = {
            "w": rate(settings.agent_writes_per_second, settings.agent_write_burst),
            "r": rate(settings.agent_reads_per_second, settings.agent_read_burst),
        }
        writes, reads = self.agent_rates["w"], self.agent_rates["r"]
        self.defaults = AgentDefaults(
            writes_per_second=writes.per_second if writes else None,
            write_burst=writes.burst if writes else None,
            reads_per_second=reads.per_second if reads else None,
            read_burst=reads.burst if reads else None,
            max_streams_per_token=settings.max_streams_per_token or None,
            max_pending_proposals=settings.max_pending_proposals or None)

    async def report(self, namespace: str, limits: Limits | None, now: int) -> UsageReport:
        """The namespace's usage (keys, bytes of values, open streams) beside its limits."""
        used = await self.store.usage(namespace, now)
        return UsageReport(namespace=namespace, limits=limits or Limits(),
                           usage=Usage(keys=used.keys, bytes=used.bytes,
                                       streams=used.streams, proposals=used.proposals,
                                       proposal_bytes=used.proposal_bytes),
                           agent_defaults=self.defaults)

    def gate(self, principal: Principal, namespace: str, kind: str, limits: Limits | None,
             cost: int = 1, agent: str | None = None, quotas: bool = True) -> Gate:
        """What one request of `kind` ("w" or "r") by `principal` in `namespace` is held to;
        the same gate every time for the same terms (it packs its script arguments once).
        `agent`: whose bucket it takes from, when not the principal's own writer (an AMP
        agent); `quotas` False: rates only (a delete, which never needs room)."""
        who = principal.writer_id if agent is None else agent
        terms = (namespace, kind, who, principal.superuser, limits, cost, quotas)
        gate = self._gates.get(terms)
        if gate is None:
            if len(self._gates) >= _MAX_GATES:
                self._gates.clear()
            gate = self._gates[terms] = self._make_gate(principal.superuser, who, namespace,
                                                        kind, limits, cost, quotas)
        return gate

    def _make_gate(self, superuser: bool, agent: str, namespace: str, kind: str,
                   limits: Limits | None, cost: int, quotas: bool) -> Gate:
        agent_rate = None if superuser else self.agent_rates[kind]
        namespace_rate = None
        if limits is not None and not superuser:
            field, short = _KINDS[kind]
            namespace_rate = rate(getattr(limits, field), getattr(limits, f"{short}_burst"))
        counted = limits is not None and kind == "w" and quotas
        max_keys = limits.max_keys if counted and limits is not None else None
        max_bytes = limits.max_bytes if counted and limits is not None else None
        if agent_rate is None and namespace_rate is None and max_keys is None \
                and max_bytes is None:
            return open_gate(namespace)
        return Gate(namespace=namespace, agent=agent, kind=kind,
                    agent_rate=agent_rate, namespace_rate=namespace_rate, max_keys=max_keys,
                    max_bytes=max_bytes, cost=cost)

    async def check_read(self, principal: Principal, namespace: str, limits: Limits | None,
                         now: int) -> None:
        """Take a read's tokens (one script call, only when a read rate applies)."""
        gate = self.read_gate(principal, namespace, limits, now)
        if gate is None:
            return
        refused = await self.store.admit(gate)
        if refused is not None:
            raise self.refuse_read(gate, refused, now)

    def read_gate(self, principal: Principal, namespace: str, limits: Limits | None, now: int,
                  agent: str | None = None) -> Gate | None:
        """A read's gate when a read rate applies (None: the read takes no tokens); a bucket
        known to be closed refuses at once. `agent`: as for `gate`."""
        gate = self.gate(principal, namespace, "r", limits, agent=agent)
        if not gate.binds:
            return None
        self.check_closed(gate, now)
        return gate

    def refuse_read(self, gate: Gate, refused: tuple[str, str], now: int) -> MempError:
        """The error of a read's refusal (scope, retry_ms) by the store."""
        return self._refusal(gate, *refused, now=now)

    def check_closed(self, gate: Gate, now: int, message_id: str | None = None) -> None:
        """Refuse at once when one of the gate's buckets refused before and has not reopened.
        A request with a message id is left to its script, which replays a message already
        applied before it looks at the buckets (a retry must get its first reply)."""
        if not self._closed or not gate.cost or message_id:
            return
        for scope in ("agent", "namespace"):
            bucket = self._bucket(gate, scope)
            closed = self._closed.get(bucket) if bucket else None
            if closed is not None and closed[0] > now:
                closed[1] += 1
                raise self._rate_limited(gate, scope, str(closed[0] - now),
                                         hold_ms=self._hold(closed))

    def check_write(self, outcome: WriteOutcome, gate: Gate, now: int) -> None:
        """Raise the refusal a write script answered (nothing was written), if any."""
        error = self.refusal(outcome, gate, now)
        if error is not None:
            raise error

    def refusal(self, outcome: WriteOutcome, gate: Gate, now: int) -> MempError | None:
        """The error of a write script's refusal (`rate_limited`, `quota_exceeded`), if any."""
        if outcome.status == "rate_limited":
            return self._refusal(gate, outcome.record["scope"], outcome.record["retry_ms"],
                                 now=now)
        if outcome.status == "quota_exceeded":
            record = outcome.record
            return self.quota_exceeded(record["limit"], int(record["max"]),
                                       int(record["used"]), int(record["requested"]))
        return None

    @staticmethod
    def _bucket(gate: Gate, scope: str) -> tuple[str, str, str, Rate] | None:
        rate = gate.agent_rate if scope == "agent" else gate.namespace_rate
        if rate is None:
            return None
        return gate.namespace, gate.kind, gate.agent if scope == "agent" else "", rate

    def _refusal(self, gate: Gate, scope: str, retry_ms: str, *, now: int) -> MempError:
        """A bucket's refusal: remembered until the bucket reopens, then raised."""
        bucket = self._bucket(gate, scope)
        if bucket is not None:
            if len(self._closed) >= _MAX_CLOSED:
                self._closed = {b: c for b, c in self._closed.items() if c[0] > now}
            if len(self._closed) < _MAX_CLOSED:
                # Refusals that follow each other closely (the bucket reopened less than
                # _FLOOD_GAP_MS ago) are one flood: their count goes on.
                before = self._closed.get(bucket)
                count = before[1] + 1 if before and now - before[0] < _FLOOD_GAP_MS else 1
                closed = self._closed[bucket] = [now + int(retry_ms), count]
                return self._rate_limited(gate, scope, retry_ms, hold_ms=self._hold(closed))
        return self._rate_limited(gate, scope, retry_ms)

    def _hold(self, closed: list[int]) -> int:
        """How long to hold a refusal: none before a flood; in one, half to all of the hold,
        at random, so the flood's connections come back spread out rather than together."""
        return random.randint(self.hold_ms // 2, self.hold_ms) if closed[1] > _FLOOD else 0

    def _rate_limited(self, gate: Gate, scope: str, retry_ms: str, hold_ms: int = 0
                      ) -> MempError:
        field = _KINDS[gate.kind][0]
        limit = gate.agent_rate if scope == "agent" else gate.namespace_rate
        wait_ms = int(retry_ms)
        seconds = max(1, math.ceil(wait_ms / 1000))
        self.metrics.count_refusal("rate_limited", field, scope)
        whose = "this agent" if scope == "agent" else "the namespace"
        done = "nothing was written" if gate.kind == "w" else "nothing was read"
        details: dict[str, object] = {"limit": field, "scope": scope, "retry_after": seconds,
                                      "retry_after_ms": wait_ms}
        if limit is not None:
            details |= {"rate": limit.per_second, "burst": limit.burst}
        return RateLimited(f"{whose} is over its {field}; {done}: retry after {seconds} s",
                           details, headers={"Retry-After": str(seconds)}, hold_ms=hold_ms)

    def quota_exceeded(self, limit: str, maximum: int, used: int, requested: int
                       ) -> MempError:
        self.metrics.count_refusal("quota_exceeded", limit, "")
        return MempError("quota_exceeded", f"the namespace is at its {limit} ({used} of "
                         f"{maximum} used, {requested} more asked); nothing was written",
                         {"limit": limit, "max": maximum, "used": used,
                          "requested": requested})
