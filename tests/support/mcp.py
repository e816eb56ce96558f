"""An MCP client of a broker's `/mcp` (the official `mcp` package): connect, call a tool or
see it refused, register an agent, follow a resource."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import MessageHandlerFnT
from mcp.client.streamable_http import streamable_http_client

from tests.support.brokers import Broker, BrokerProcess

WAIT = 10.0


# `resources/subscribe` is deprecated by the 2026-07-28 revision, and the client says so.
LEGACY_SUBSCRIBE = pytest.mark.filterwarnings(
    "ignore::mcp.shared.exceptions.MCPDeprecationWarning")


@contextlib.asynccontextmanager
async def connect(broker: Broker | BrokerProcess, token: str, mode: str = "auto",
                  on_message: MessageHandlerFnT | None = None) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=WAIT)
    async with http, Client(streamable_http_client(f"{broker.url}/mcp", http_client=http),
                            mode=mode, message_handler=on_message) as client:
        yield client


def run(coroutine: Awaitable[None]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coroutine, 30)

    asyncio.run(bounded())


def register(broker: Broker, namespace: str, name: str = "mcp-agent") -> tuple[str, str]:
    """A registered agent's (id, API key): read, write, subscribe on `namespace`, AMP."""
    with broker.client() as admin:
        reply = admin.post("/v1/agents", json={"name": name, "framework": "claude",
                                               "namespace": namespace})
        assert reply.status_code == 201, reply.text
        body = reply.json()
    return body["agent"]["id"], body["credentials"]["api_key"]


async def call(client: Client, name: str, **arguments: Any) -> Any:
    result = await client.call_tool(name, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def refused(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call the broker refused: its `{code, message, details}`."""
    result = await client.call_tool(name, arguments)
    assert result.is_error, result.structured_content
    error: dict[str, Any] = result.structured_content["error"]
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert text.text.startswith(f"{error['code']}: ")
    return error
