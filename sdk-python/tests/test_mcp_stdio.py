"""`memp mcp`: the broker's MCP over stdio, as a desktop client starts it (a command with
MEMP_BASE_URL and MEMP_API_KEY in its environment), driven by the `mcp` package's own client on
both wires it speaks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from tests.support.brokers import ADMIN_KEY, Broker

WAIT = 15.0
MODES = [pytest.param("legacy", id="handshake-era"), pytest.param("auto", id="2026-07-28")]


def command(broker: Broker, token: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "memp.cli", "mcp"],
        env={**os.environ, "MEMP_BASE_URL": broker.url, "MEMP_API_KEY": token, **env})


@contextlib.asynccontextmanager
async def memp_mcp(broker: Broker, token: str, mode: str,
                   on_message: Callable[[Any], Awaitable[None]] | None = None, **env: str
                   ) -> AsyncIterator[Client]:
    async with Client(command(broker, token, **env), mode=mode,
                      message_handler=on_message) as client:
        yield client


def run(coroutine: Awaitable[None]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coroutine, 60)

    asyncio.run(bounded())


def agent(broker: Broker, namespace: str) -> str:
    with broker.client() as admin:
        reply = admin.post("/v1/agents", json={"name": "desktop", "framework": "claude",
                                               "namespace": namespace})
        assert reply.status_code == 201, reply.text
        return str(reply.json()["credentials"]["api_key"])


@pytest.fixture
def broker(server: Broker) -> Broker:
    return server


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
@pytest.mark.parametrize("mode", MODES)
def test_tools_write_read_query_and_a_subscription(broker: Broker, ns: str, mode: str
                                                   ) -> None:
    token = agent(broker, ns)
    uri = f"memp://{ns}/team/lead"
    heard: asyncio.Queue[str] = asyncio.Queue()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            heard.put_nowait(message.params.uri)

    async def main() -> None:
        async with memp_mcp(broker, token, mode, on_message) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert names[:5] == ["memory_put", "memory_get", "memory_query", "memory_delete",
                                 "memory_history"]
            assert {"amp_remember", "amp_recall", "amp_forget"} <= set(names)
            put = await client.call_tool("memory_put", {"key": "team/lead", "value": "ada"})
            assert not put.is_error and put.structured_content["namespace"] == ns
            got = await client.call_tool("memory_get", {"key": "team/lead"})
            assert got.structured_content["value"] == "ada"
            page = await client.call_tool("memory_query", {"pattern": "team/*"})
            assert [e["key"] for e in page.structured_content["entries"]] == ["team/lead"]
            read = (await client.read_resource(uri)).contents[0]
            assert isinstance(read, types.TextResourceContents) and read.text == '"ada"'

            with httpx.Client(base_url=broker.url, timeout=WAIT,
                              headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as rest:
                def write(value: str) -> None:
                    reply = rest.put(f"/v1/namespaces/{ns}/memory/team/lead",
                                     json={"value": value})
                    assert reply.status_code == 200, reply.text

                if mode == "legacy":
                    await client.subscribe_resource(uri)
                    await asyncio.to_thread(write, "grace")
                    assert await asyncio.wait_for(heard.get(), WAIT) == uri
                else:
                    async with client.listen(resource_subscriptions=[uri]) as events:
                        await asyncio.to_thread(write, "grace")
                        assert await asyncio.wait_for(anext(events), WAIT) == \
                            ResourceUpdated(uri)

    run(main())


@pytest.mark.parametrize("mode", MODES)
def test_a_token_without_the_grant_is_refused(broker: Broker, ns: str, mode: str) -> None:
    with broker.client() as admin:
        reader = admin.post("/v1/keys", json={"name": "reader", "grants": [
            {"namespace": ns, "permissions": ["read"]}]}).json()["api_key"]
        admin.put(f"/v1/namespaces/{ns}/memory/fact", json={"value": 1})

    async def main() -> None:
        async with memp_mcp(broker, reader, mode, MEMP_NAMESPACE=ns) as client:
            got = await client.call_tool("memory_get", {"key": "fact"})
            assert got.structured_content["value"] == 1
            put = await client.call_tool("memory_put", {"key": "fact", "value": 2})
            assert put.is_error
            assert put.structured_content["error"]["code"] == "forbidden"
            with pytest.raises(MCPError) as caught:
                await client.read_resource(f"memp://{ns}-elsewhere/fact")
            assert caught.value.data["code"] == "forbidden"

    run(main())


def test_a_refused_key_or_no_broker_is_said_on_stderr(broker: Broker) -> None:
    env = {**os.environ, "MEMP_BASE_URL": broker.url, "MEMP_API_KEY": "memp_sk_live_nope"}
    refused = subprocess.run([sys.executable, "-m", "memp.cli", "mcp"], input=b"",
                             capture_output=True, env=env, timeout=WAIT)
    assert refused.returncode == 1 and refused.stdout == b""
    assert refused.stderr.decode().startswith("memp: unauthorized 401")
    env["MEMP_BASE_URL"] = "http://127.0.0.1:9"
    unreachable = subprocess.run([sys.executable, "-m", "memp.cli", "mcp"], input=b"",
                                 capture_output=True, env=env, timeout=WAIT)
    assert unreachable.returncode == 3 and unreachable.stdout == b""
    assert "cannot reach the broker" in unreachable.stderr.decode()
