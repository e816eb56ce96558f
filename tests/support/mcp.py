"""An MCP client of a broker's `/mcp` (the official `mcp` package): connect, call a tool or
see it refused, register an agent, follow a resource; and a session opened by hand, for calls
the package's client would not send as written."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import httpx
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


def open_session(http: httpx.Client, token: str) -> dict[str, str]:
    """Open an MCP session by hand (initialize, then initialized); the headers of its
    requests."""
    headers = {"Accept": "application/json, text/event-stream",
               "Authorization": f"Bearer {token}"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}
    opened = http.post("/mcp", json=initialize, headers=headers)
    assert opened.status_code == 200, opened.text
    theirs = {**headers, "mcp-session-id": opened.headers["mcp-session-id"],
              "mcp-protocol-version": "2025-11-25"}
    assert http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                     headers=theirs).status_code == 202
    return theirs


def raw_tool_call(http: httpx.Client, headers: dict[str, str], name: str, arguments: str
                  ) -> dict[str, Any]:
    """A tools/call whose arguments are sent as written (the package's client would turn NaN
    into null before it left), answered with the tool's result."""
    body = ('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": '
            f'"{name}", "arguments": {arguments}}}}}')
    reply = http.post("/mcp", content=body, headers={**headers,
                                                     "Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    text = reply.text
    if reply.headers["content-type"].startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    result: dict[str, Any] = json.loads(text)["result"]
    return result
