"""An agent that speaks MCP uses the broker's memory over Streamable HTTP (docs/mcp.md).

    MEMP_BASE_URL=http://127.0.0.1:8080 MEMP_API_KEY=memp_sk_live_... \
        python docs/examples/mcp_http.py
"""

from __future__ import annotations

import asyncio
import os

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    base_url = os.environ.get("MEMP_BASE_URL", "http://127.0.0.1:8080")
    headers = {"Authorization": f"Bearer {os.environ['MEMP_API_KEY']}"}
    async with httpx2.AsyncClient(headers=headers) as http, \
            Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client:
        tools = await client.list_tools()
        print("tools:", ", ".join(tool.name for tool in tools.tools))

        # The namespace defaults to the one the key's agent was registered in.
        written = await client.call_tool("memory_put", {"key": "customer/42",
                                                        "value": {"plan": "pro"}})
        print("wrote version", written.structured_content["version"])
        found = await client.call_tool("memory_query", {"pattern": "customer/*"})
        print("found:", [entry["key"] for entry in found.structured_content["entries"]])

        # Every entry is a resource; a listen stream hears when another agent changes it.
        uri = f"memp://{written.structured_content['namespace']}/customer/42"
        async with client.listen(resource_subscriptions=[uri]) as events:
            await client.call_tool("memory_put", {"key": "customer/42",
                                                  "value": {"plan": "team"}})
            print("updated:", (await anext(events)).uri)
        print("now:", (await client.read_resource(uri)).contents[0].text)

        refused = await client.call_tool("memory_get", {"key": "customer/7"})
        print("refused:", refused.content[0].text)


if __name__ == "__main__":
    asyncio.run(main())
