"""Open streams counted across broker processes: each stream holds a lease in its
namespaces' sets of open streams (and its credential's, when streams per token are capped),
renewed by its process while it is open and dropped when it closes. A process that dies
stops renewing, so its streams stop counting within `MEMP_STREAM_LEASE_SECONDS`."""

from __future__ import annotations

import asyncio
import uuid

from broker.core.clock import Clock
from broker.runtime.settings import Settings
from broker.runtime.supervisor import Supervisor
from broker.services.auth import Principal
from broker.services.limits import FairShare
from broker.services.namespaces import NamespaceRegistry

Lease = tuple[str, str, str]  # (scope: "namespace" or "token", its name, the stream's id)


class StreamLeases:
    """The leases of this process's open streams."""

    def __init__(self, settings: Settings, fair_share: FairShare, registry: NamespaceRegistry,
                 supervisor: Supervisor, clock: Clock) -> None:
        self.store = fair_share.store
        self.fair_share = fair_share
        self.registry = registry
        self.supervisor = supervisor
        self.clock = clock
        self.lease_ms = int(settings.stream_lease_seconds * 1000)
        self.per_token = settings.max_streams_per_token or None
        self.held: dict[str, list[Lease]] = {}

    async def take(self, principal: Principal, namespaces: list[str]) -> str:
        """Count a new stream on its namespaces (and its credential), or raise
        `quota_exceeded` naming the cap it met; returns the stream's id for `drop`."""
        stream = uuid.uuid4().hex
        taken: list[Lease] = []
        try:
            if self.per_token is not None and not principal.superuser:
                await self._take(taken, "token", principal.key_id or principal.subject, stream,
                                 self.per_token, "max_streams_per_token")
            for namespace in namespaces:
                limits = (await self.registry.state(namespace)).config.limits
                await self._take(taken, "namespace", namespace, stream,
                                 limits.max_streams if limits else None, "max_streams")
        except BaseException:
            self.held[stream] = taken
            self.drop(stream)
            raise
        self.held[stream] = taken
        return stream

    async def _take(self, taken: list[Lease], scope: str, name: str, stream: str,
                    cap: int | None, limit: str) -> None:
        ok, count = await self.store.lease(scope, name, stream, cap, self.clock(),
                                           self.lease_ms)
        if not ok:
            raise self.fair_share.quota_exceeded(limit, cap or 0, count, 1)
        taken.append((scope, name, stream))

    def drop(self, stream: str) -> None:
        """Stop counting a stream (idempotent): it leaves the sets soon, its renewal at once."""
        leases = self.held.pop(stream, None)
        if leases:
            self.supervisor.spawn("stream lease release", self.store.release(leases))

    async def release_all(self) -> None:
        """Drop every lease at shutdown, so this process's streams stop counting at once."""
        leases = [lease for held in self.held.values() for lease in held]
        self.held.clear()
        await self.store.release(leases)

    async def run(self) -> None:
        """Renew every lease this process holds, three times per lease."""
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            leases = [lease for held in list(self.held.values()) for lease in held]
            await self.store.renew(leases, self.clock() + self.lease_ms)
