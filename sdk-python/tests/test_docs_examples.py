"""The integration pages' examples (docs/mcp.md, docs/langgraph.md), run as a reader would:
the desktop client configuration starts `memp mcp`, and the scripts run against a broker.
(docs/examples/langgraph_team.py runs in test_langgraph.py, two processes at once.)"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
from mcp import Client, StdioServerParameters

from tests.support.brokers import ADMIN_KEY, Broker

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def agent_key(broker: Broker, namespace: str) -> str:
    reply = httpx.post(f"{broker.url}/v1/agents", timeout=15,
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                       json={"name": "docs", "framework": "claude", "namespace": namespace})
    assert reply.status_code == 201, reply.text
    return str(reply.json()["credentials"]["api_key"])


def test_the_desktop_client_configuration_starts_memp_mcp(server: Broker, ns: str) -> None:
    """docs/examples/claude_desktop_config.json, with this run's broker and key, launched as
    a desktop client launches its servers: the command, its arguments, its environment."""
    entry = json.loads((EXAMPLES / "claude_desktop_config.json").read_text())["mcpServers"][
        "memp"]
    assert (entry["command"], entry["args"]) == ("memp", ["mcp"])
    env = {**entry["env"], "MEMP_BASE_URL": server.url,
           "MEMP_API_KEY": agent_key(server, ns), "MEMP_NAMESPACE": ns}
    command = shutil.which(entry["command"], path=str(Path(sys.executable).parent))
    assert command is not None, "memp is installed beside this Python"
    params = StdioServerParameters(command=command, args=entry["args"],
                                   env={"PATH": os.environ.get("PATH", ""), **env})

    async def main() -> None:
        async with Client(params) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"memory_put", "memory_get", "amp_remember"} <= names
            put = await client.call_tool("memory_put", {"key": "note", "value": "hi"})
            assert put.structured_content["namespace"] == ns

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_mcp_http_example(server: Broker, ns: str) -> None:
    env = {**os.environ, "MEMP_BASE_URL": server.url, "MEMP_API_KEY": agent_key(server, ns)}
    run = subprocess.run([sys.executable, str(EXAMPLES / "mcp_http.py")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "tools: memory_put, memory_get, memory_query, memory_delete, memory_history, "
        "amp_remember, amp_recall, amp_merge, amp_forget",
        "wrote version 1",
        "found: ['customer/42']",
        f"updated: memp://{ns}/customer/42",
        'now: {"plan":"team"}',
        "refused: not_found: no entry at key 'customer/7'",
    ]
