"""Every operation of openapi.yaml has a method in the SDK (`x-sdk`), on MEMP and AsyncMEMP
alike, but those listed here; sdk-js/test/parity.test.js checks the JavaScript SDK the same
way."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from memp import MEMP, AsyncMEMP
from tests.support.brokers import load_yaml

DOCUMENT = Path(__file__).resolve().parents[2] / "openapi.yaml"
METHODS = ("get", "put", "post", "delete", "patch")
# Operations no SDK method serves, and why.
EXEMPT = {
    "healthz": "system: for load balancers and probes",
    "readyz": "system: for load balancers and probes",
    "metrics": "system: for Prometheus",
    "getOpenapiYaml": "system: the contract itself",
    "getOpenapiJson": "system: the contract itself",
    "getDocs": "system: the contract as a web page, for people",
    "runCellLifecycle": "AMP admin pass: run by the broker every interval",
    "purgeMemoryCells": "AMP admin pass: erasure is an operator's decision",
    "mcpPost": "MCP: spoken by MCP clients (memp mcp relays it)",
    "mcpGet": "MCP: spoken by MCP clients",
    "mcpDelete": "MCP: spoken by MCP clients",
    "consoleRedirect": "the console: a page for browsers",
    "getConsoleFile": "the console: a page for browsers",
}


def operations() -> dict[str, dict[str, Any]]:
    document = load_yaml(DOCUMENT.read_text())
    return {operation["operationId"]: operation for item in document["paths"].values()
            for method, operation in item.items() if method in METHODS}


def resolve(client: object, path: str) -> Any:
    target = client
    for name in path.split("."):
        target = getattr(target, name)
    return target


def test_every_operation_has_a_method_or_is_listed() -> None:
    found = operations()
    assert set(EXEMPT) <= set(found), "an exemption names no operation"
    missing = sorted(op for op, spec in found.items() if op not in EXEMPT and "x-sdk" not in spec)
    assert missing == [], f"operations without an SDK method: {missing}"
    assert sorted(op for op in EXEMPT if "x-sdk" in found[op]) == []


def test_the_methods_exist_in_both_clients() -> None:
    sync, asynchronous = MEMP(api_key="k", namespace="n"), AsyncMEMP(api_key="k", namespace="n")
    try:
        for operation, spec in operations().items():
            if operation in EXEMPT:
                continue
            path = spec["x-sdk"]["python"]
            assert callable(resolve(sync, path)), (operation, path)
            method = resolve(asynchronous, path)
            assert callable(method), (operation, path)
            if path != "subscribe":  # an async iterator, not a coroutine
                assert inspect.iscoroutinefunction(method), (operation, path)
    finally:
        sync.close()
