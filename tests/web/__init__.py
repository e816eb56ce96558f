"""Tests of the HTTP surface: routes, SSE, messages, the contract, the console (tests/README.md)."""
