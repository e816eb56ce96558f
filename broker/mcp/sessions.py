"""Handshake-era MCP sessions end with their credential: each session this process opens is
watched by the stream guard as its opener's, and when the key is revoked, the agent removed or
the JWT expires, the session is discarded (its open streams end, its id answers 404)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Message, Send

from broker.services.auth import Principal
from broker.streaming.revocation import StreamGuard

_SESSION_HEADER = b"mcp-session-id"
_NO_NAMESPACES: Mapping[str, object] = MappingProxyType({})


class SessionTicket:
    """One open session as the stream guard sees it: it follows no namespace itself (its
    resource subscriptions are guarded subscribers of their own), so only a credential that
    lost its right ends it."""

    def __init__(self, session_id: str, sessions: OwnedSessions) -> None:
        self.session_id = session_id
        self.sessions = sessions
        self.revoked: str | None = None

    @property
    def patterns(self) -> Mapping[str, object]:
        return _NO_NAMESPACES

    def revoke(self, reason: str) -> None:
        self.revoked = reason
        self.sessions.discard(self.session_id)


class OwnedSessions:
    """The sessions this process opened, each with the principal that opened it."""

    def __init__(self, manager: StreamableHTTPSessionManager, guard: StreamGuard) -> None:
        self.manager = manager
        self.guard = guard
        self.tickets: dict[str, SessionTicket] = {}
        self.ending: set[asyncio.Task[None]] = set()

    def noting(self, send: Send, principal: Principal) -> Send:
        """`send`, watching for the response that opens a session (it names the session)."""
        async def noted(message: Message) -> None:
            if message["type"] == "http.response.start" and message.get("status", 500) < 400:
                for name, value in message.get("headers", ()):
                    if name.lower() == _SESSION_HEADER:
                        self._open(value.decode("latin-1"), principal)
            await send(message)
        return noted

    def _open(self, session_id: str, principal: Principal) -> None:
        self._prune()
        ticket = SessionTicket(session_id, self)
        self.tickets[session_id] = ticket
        self.guard.watch(ticket, principal)

    def _prune(self) -> None:
        """Forget sessions that ended by themselves (DELETE, idle timeout, refused opening)."""
        live = self.manager._server_instances  # the manager has no public session registry
        for session_id in [s for s in self.tickets if s not in live]:
            self.guard.forget(self.tickets.pop(session_id))

    def discard(self, session_id: str) -> None:
        """End a session now: its id answers 404 at once, its transport closes its streams."""
        self.tickets.pop(session_id, None)
        transport = self.manager._server_instances.get(session_id)
        if transport is None:
            return
        task = asyncio.create_task(self.manager._discard_session(session_id, transport),
                                   name="memp-mcp-session-end")
        self.ending.add(task)
        task.add_done_callback(self.ending.discard)
