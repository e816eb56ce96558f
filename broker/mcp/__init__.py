"""MCP for agents: the broker's tools, resources and subscriptions at `/mcp`."""
