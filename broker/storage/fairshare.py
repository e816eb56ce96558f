"""Fair-share bookkeeping in Redis: rate buckets, the byte count quotas read, and leases of
open streams. Every check is one script in the namespace's slot (or the credential's), so
all broker processes sharing the store share one budget. See docs/limits.md."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.storage import layout, scripts
from broker.storage.client import Backend, text
from broker.storage.scripts import Fields

# A gate's keys and arguments, read by put.lua and delete.lua after their write, and by rate.lua.
GATE_KEYS = Fields("gate_keys", ("agent_rate", "namespace_rate"))
RATE_READ_KEYS = Fields("rate_read_keys", (), rest="entry", counted=False)  # 0 or 1 key
GATE = Fields("gate", ("agent_interval", "agent_burst", "namespace_interval", "namespace_burst",
                       "max_keys", "max_bytes", "cost"))
USAGE_KEYS = Fields("usage_keys", ("index", "usage", "proposals"))
RECOUNT = Fields("recount", ("entry_prefix", "proposal_prefix"))
LEASE_KEYS = Fields("lease_keys", ("set",))
LEASE = Fields("lease", ("now", "lease_end", "member", "cap"))
GATE_FILES = ("gate.lua",)


@dataclass(frozen=True, slots=True)
class Rate:
    """A rate in requests per second and the burst a bucket admits at once."""

    per_second: float
    burst: int

    @property
    def interval_ms(self) -> str:
        return repr(1000.0 / self.per_second)

    @property
    def terms(self) -> str:
        return f"{self.per_second!r}/{self.burst}"


@dataclass(frozen=True, slots=True)
class Gate:
    """What a request in `namespace` is held to: the agent's and the namespace's rate (None
    when off), the namespace's quotas (None when off), and the request's cost in tokens (0:
    rates skipped). Its script keys and arguments are packed once, when it is made: gates are
    reused (FairShare keeps them), so a put pays for none of this."""

    namespace: str
    agent: str
    kind: str  # "w" for writes, "r" for reads: each has buckets of its own
    agent_rate: Rate | None = None
    namespace_rate: Rate | None = None
    max_keys: int | None = None
    max_bytes: int | None = None
    cost: int = 1
    keys: tuple[str, ...] = field(init=False, repr=False, compare=False)
    args: tuple[Any, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Both buckets are in the namespace's slot; a bucket that is off is never read, and
        # names the namespace's usage hash instead of a key of its own.
        unused = layout.usage(self.namespace)

        def bucket(rate: Rate | None, who: str) -> str:
            return layout.rate(self.namespace, self.kind, rate.terms, who) if rate else unused

        def terms(rate: Rate | None) -> tuple[str, int | str]:
            return (rate.interval_ms, rate.burst) if rate else ("", "")

        object.__setattr__(self, "keys", tuple(GATE_KEYS.pack(
            agent_rate=bucket(self.agent_rate, f"a:{self.agent}"),
            namespace_rate=bucket(self.namespace_rate, ""))))
        agent_interval, agent_burst = terms(self.agent_rate)
        namespace_interval, namespace_burst = terms(self.namespace_rate)
        object.__setattr__(self, "args", tuple(GATE.pack(
            agent_interval=agent_interval, agent_burst=agent_burst,
            namespace_interval=namespace_interval, namespace_burst=namespace_burst,
            max_keys="" if self.max_keys is None else self.max_keys,
            max_bytes="" if self.max_bytes is None else self.max_bytes, cost=self.cost)))

    @property
    def binds(self) -> bool:
        """Whether the gate holds the request to anything at all."""
        return bool(self.cost and (self.agent_rate or self.namespace_rate)) \
            or self.max_keys is not None or self.max_bytes is not None


@functools.lru_cache(maxsize=4096)
def open_gate(namespace: str) -> Gate:
    """The gate of a request held to nothing: no rate, no quota."""
    return Gate(namespace=namespace, agent="", kind="w", cost=0)


@dataclass(frozen=True, slots=True)
class Usage:
    keys: int
    bytes: int  # of the values
    streams: int
    proposals: int  # pending
    proposal_bytes: int  # of every proposal kept, pending or closed


class FairShareStore:
    """Rate checks of reads, exact usage, and stream leases."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.redis = client = backend.redis
        self._rate = scripts.register(client, [*GATE_FILES, "rate.lua"],
                                      [GATE_KEYS, RATE_READ_KEYS, GATE])
        self._count = scripts.register(client, ["usage_count.lua"], [USAGE_KEYS, RECOUNT])
        self._lease = scripts.register(client, ["lease.lua"], [LEASE_KEYS, LEASE])

    async def admit(self, gate: Gate) -> tuple[str, str] | None:
        """Take a read's tokens: None when admitted, else (scope, retry_ms)."""
        reply = await self.backend.call(self._rate, list(gate.keys), list(gate.args))
        if text(reply[0]) == "ok":
            return None
        return text(reply[1]), text(reply[2])

    async def admit_read(self, gate: Gate, key: str
                         ) -> tuple[dict[bytes, bytes] | None, tuple[str, str] | None]:
        """Take a read's tokens and read the hash at `key` in the same call: its fields when
        admitted, else the refusal (scope, retry_ms)."""
        reply = await self.backend.call(self._rate, [*gate.keys, key], list(gate.args))
        if text(reply[0]) != "ok":
            return None, (text(reply[1]), text(reply[2]))
        flat = reply[1]
        return dict(zip(flat[::2], flat[1::2], strict=True)), None

    async def recount(self, namespace: str) -> None:
        """Count the namespace's stored bytes, values and proposals, exactly (one script; it
        walks the index and the proposals)."""
        keys = USAGE_KEYS.pack(index=layout.index(namespace), usage=layout.usage(namespace),
                               proposals=layout.proposals(namespace))
        await self.backend.call(self._count, keys, RECOUNT.pack(
            entry_prefix=layout.entry_prefix(namespace),
            proposal_prefix=layout.proposal_prefix(namespace)))

    async def usage(self, namespace: str, now: int) -> Usage:
        """Keys in the index, stored bytes of values and of proposals (counted first when not
        yet exact), open streams and pending proposals (those past their time not counted)."""
        async def read() -> list[Any]:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zcard(layout.index(namespace))
                pipe.hmget(layout.usage(namespace), "bytes", "counted", "pbytes")
                pipe.zcount(layout.streams(namespace), f"({now}", "+inf")
                pipe.zcount(layout.pending_proposals(namespace), f"({now}", "+inf")
                return list(await pipe.execute())

        keys, (size, counted, proposal_size), streams, proposals = await read()
        if counted is None:
            await self.recount(namespace)
            keys, (size, counted, proposal_size), streams, proposals = await read()
        return Usage(keys=int(keys), bytes=max(int(size or 0), 0), streams=int(streams),
                     proposals=int(proposals),
                     proposal_bytes=max(int(proposal_size or 0), 0))

    # ---- stream leases ----

    @staticmethod
    def _set(scope: str, name: str) -> str:
        return layout.streams(name) if scope == "namespace" else layout.token_streams(name)

    async def lease(self, scope: str, name: str, member: str, cap: int | None, now: int,
                    lease_ms: int) -> tuple[bool, int]:
        """Take a lease on a namespace's (`scope` "namespace") or a credential's ("token")
        open streams unless `cap` are open; returns whether it was taken and how many are."""
        taken, count = await self.backend.call(
            self._lease, LEASE_KEYS.pack(set=self._set(scope, name)),
            LEASE.pack(now=now, lease_end=now + lease_ms, member=member,
                       cap="" if cap is None else cap))
        return bool(int(taken)), int(count)

    async def renew(self, leases: Iterable[tuple[str, str, str]], lease_end: int) -> None:
        """Push on the end of every (scope, name, member) lease this process holds."""
        leases = list(leases)
        if not leases:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for scope, name, member in leases:
                key = self._set(scope, name)
                pipe.zadd(key, {member: lease_end})
                pipe.pexpireat(key, lease_end + 60_000)  # never before another's lease ends
            await pipe.execute()

    async def release(self, leases: Iterable[tuple[str, str, str]]) -> None:
        leases = list(leases)
        if not leases:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for scope, name, member in leases:
                pipe.zrem(self._set(scope, name), member)
            await pipe.execute()
