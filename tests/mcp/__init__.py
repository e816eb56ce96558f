"""Tests of MCP at /mcp (tests/README.md)."""
