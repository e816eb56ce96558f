"""JSON Schemas as the tests register them over HTTP."""

from __future__ import annotations

from typing import Any

import httpx


def schema_path(ns: str, schema_id: str = "") -> str:
    return f"/v1/namespaces/{ns}/schemas" + (f"/{schema_id}" if schema_id else "")


def register(client: httpx.Client, ns: str, schema_id: str, pattern: str, schema: Any,
             enforce: bool = False) -> dict[str, Any]:
    response = client.put(schema_path(ns, schema_id),
                          json={"pattern": pattern, "schema": schema, "enforce": enforce})
    assert response.status_code in (200, 201), response.text
    record: dict[str, Any] = response.json()
    return record
