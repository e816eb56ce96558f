"""One listener per process for what the other processes announce: a namespace's
configuration or schemas changed, or credentials were revoked. Each announcement drops what
this process cached and checks its open streams again. A listener that restarts goes on from
the last announcement it read; when what it missed is no longer kept (or it just started),
everything cached is dropped and every stream checked."""

from __future__ import annotations

from broker.services.auth import Authenticator
from broker.services.namespaces import NamespaceRegistry
from broker.storage import Storage
from broker.streaming.revocation import StreamGuard


class InvalidationListener:
    """Applies other processes' announcements to this process's caches and streams."""

    def __init__(self, namespaces: NamespaceRegistry, auth: Authenticator,
                 guard: StreamGuard, block_ms: int) -> None:
        self.namespaces = namespaces
        self.auth = auth
        self.guard = guard
        self.block_ms = block_ms
        self.position: str | None = None  # the last announcement read

    def apply(self, kind: str, subject: str) -> None:
        if kind == "namespace":
            self.namespaces.invalidate(subject)
            self.guard.recheck_soon(subject)
            return
        if kind == "subscribed":  # anything may have changed while nobody listened
            self.namespaces.forget_all()
        self.auth.forget()
        self.guard.recheck_soon()

    async def listen(self, storage: Storage) -> None:
        """Follow the announcements until cancelled. A failure ends the run; the supervisor
        starts it again, from the last announcement read."""
        async for kind, subject, position in storage.bulletins(self.position, self.block_ms):
            self.apply(kind, subject)
            self.position = position
