"""One pub/sub listener per process for what the other processes announce: a namespace's
configuration or schemas changed, or credentials were revoked. Each announcement drops what
this process cached and checks its open streams again; so does every (re)connection, since
announcements made while the listener was away are lost."""

from __future__ import annotations

import redis.asyncio as aioredis

from broker import layout
from broker.auth import Authenticator
from broker.namespaces import NamespaceRegistry
from broker.revocation import StreamGuard


class InvalidationListener:
    """Applies other processes' announcements to this process's caches and streams."""

    def __init__(self, namespaces: NamespaceRegistry, auth: Authenticator,
                 guard: StreamGuard) -> None:
        self.namespaces = namespaces
        self.auth = auth
        self.guard = guard
        self._channels = {layout.invalidations().encode(): self._namespace_changed,
                          layout.revocations().encode(): self._revoked}

    def _namespace_changed(self, namespace: str) -> None:
        self.namespaces.invalidate(namespace)
        self.guard.recheck_soon(namespace)

    def _revoked(self, what: str) -> None:
        self.auth.forget()
        self.guard.recheck_soon()

    def _caught_up(self) -> None:
        self.namespaces.forget_all()
        self.auth.forget()
        self.guard.recheck_soon()

    async def listen(self, client: aioredis.Redis) -> None:
        """Follow both channels until cancelled. A failure ends the run; the supervisor
        subscribes again, which checks everything."""
        async with client.pubsub() as pubsub:
            await pubsub.subscribe(*self._channels)
            self._caught_up()
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                channel, data = message["channel"], message["data"]
                handler = self._channels.get(
                    channel if isinstance(channel, bytes) else channel.encode())
                if handler is not None:
                    handler(data.decode() if isinstance(data, bytes) else str(data))
