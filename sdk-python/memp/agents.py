"""Agents of a namespace (look up, list, remove) and protocol message batches, for `MEMP` and
`AsyncMEMP` alike."""

from __future__ import annotations

from collections.abc import Sequence

from memp import _calls
from memp._transport import AsyncTransport, SyncTransport
from memp.messages import AnyMessage, Reply
from memp.models import Agent, AgentPage


class Agents:
    """Agents registered in the client's namespace (or `namespace=`): reading needs `read`,
    removing `admin` (it revokes every key bound to the agent)."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    def get(self, agent_id: str, *, namespace: str | None = None) -> Agent:
        return self._transport.send(_calls.get_agent(
            self._config.require_namespace(namespace), agent_id))

    def list(self, *, cursor: str | None = None, limit: int | None = None,
             namespace: str | None = None) -> AgentPage:
        """One page, in registration order; pass `next_cursor` back for the next."""
        return self._transport.send(_calls.list_agents(
            self._config.require_namespace(namespace), cursor, limit))

    def remove(self, agent_id: str, *, namespace: str | None = None) -> None:
        self._transport.send(_calls.remove_agent(
            self._config.require_namespace(namespace), agent_id))


class AsyncAgents:
    """Agents of a namespace; see `Agents`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    async def get(self, agent_id: str, *, namespace: str | None = None) -> Agent:
        return await self._transport.send(_calls.get_agent(
            self._config.require_namespace(namespace), agent_id))

    async def list(self, *, cursor: str | None = None, limit: int | None = None,
                   namespace: str | None = None) -> AgentPage:
        return await self._transport.send(_calls.list_agents(
            self._config.require_namespace(namespace), cursor, limit))

    async def remove(self, agent_id: str, *, namespace: str | None = None) -> None:
        await self._transport.send(_calls.remove_agent(
            self._config.require_namespace(namespace), agent_id))


class Messages:
    """MEMP protocol messages, `POST /v1/messages`."""

    def __init__(self, transport: SyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    def batch(self, messages: Sequence[AnyMessage]) -> list[Reply]:
        """Run the messages in order, one reply each (an `error` reply does not stop the
        rest; `reply.raise_for_error()` raises it). Messages without a namespace get the
        client's, and without an id a fresh one, so a resent batch is applied once."""
        return self._transport.send(_calls.messages(messages, self._config.namespace))


class AsyncMessages:
    """MEMP protocol messages; see `Messages`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._config = transport.config

    async def batch(self, messages: Sequence[AnyMessage]) -> list[Reply]:
        return await self._transport.send(_calls.messages(messages, self._config.namespace))
