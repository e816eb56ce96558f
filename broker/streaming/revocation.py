"""Open streams (and MCP sessions) end when their right to exist does.

Every process keeps the streams it serves with the principal that opened them. When a key is
revoked or an agent removed (its keys and the JWTs naming it), anywhere (the news arrives by
pub/sub), a namespace's shares change, or the invalidation listener reconnects (news may have
been missed), the streams are checked again; a JWT's expiry is checked every second. A stream
that lost its right gets a final `revoked` event saying why, with its cursor, and is closed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from broker.core.errors import MempError
from broker.runtime.supervisor import Supervisor
from broker.services.auth import Authenticator, Principal
from broker.services.namespaces import NamespaceRegistry

log = logging.getLogger("memp.revocation")


class Guarded(Protocol):
    """What the guard ends: a stream's subscriber, or an MCP session."""

    @property
    def patterns(self) -> Mapping[str, object]:
        """The namespaces it follows (their grants and shares are checked again)."""

    @property
    def revoked(self) -> str | None: ...

    def revoke(self, reason: str) -> None: ...


class StreamGuard:
    """Knows every open stream of this process and ends those that lost their grant."""

    def __init__(self, auth: Authenticator, namespaces: NamespaceRegistry,
                 supervisor: Supervisor) -> None:
        self.auth = auth
        self.namespaces = namespaces
        self.supervisor = supervisor
        self.streams: dict[Guarded, Principal] = {}

    def watch(self, subscriber: Guarded, principal: Principal) -> None:
        self.streams[subscriber] = principal

    def forget(self, subscriber: Guarded) -> None:
        self.streams.pop(subscriber, None)

    def recheck_soon(self, namespace: str | None = None) -> None:
        """Check again in the background (called from the pub/sub listener)."""
        self.supervisor.spawn("stream recheck", self.recheck(namespace))

    async def recheck(self, namespace: str | None = None) -> None:
        """Check every stream (or those following `namespace`) against the store."""
        watched = [(s, p) for s, p in list(self.streams.items())
                   if namespace is None or namespace in s.patterns]
        if not watched:
            return
        live = await self.auth.live_keys({p.key_id for _, p in watched if p.key_id})
        removed = await self.auth.removed_agents(
            {p.agent_id for _, p in watched if p.agent_id and not p.key_id})
        for subscriber, principal in watched:
            reason = None
            if principal.key_id and principal.key_id not in live:
                reason = "the API key was revoked"
            elif not principal.key_id and principal.agent_id in removed:
                reason = "the agent was removed"
            else:
                reason = await self._lost_namespace(subscriber, principal)
            if reason is not None:
                self._end(subscriber, reason)

    async def _lost_namespace(self, subscriber: Guarded, principal: Principal
                              ) -> str | None:
        for namespace in subscriber.patterns:
            try:
                await self.namespaces.require(principal, "subscribe", namespace)
            except MempError:
                return f"the token may no longer follow namespace {namespace!r}"
        return None

    def check_expiry(self, now: float) -> None:
        """End streams opened with a JWT that has expired since."""
        for subscriber, principal in list(self.streams.items()):
            if principal.expires_at is not None and principal.expires_at <= now:
                self._end(subscriber, "the token expired")

    def _end(self, subscriber: Guarded, reason: str) -> None:
        self.forget(subscriber)
        if subscriber.revoked is None:
            log.info("ending a stream: %s", reason)
            subscriber.revoke(reason)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.check_expiry(time.time())
