"""Unauthenticated endpoints: health, readiness, metrics, the OpenAPI document and the API
reference page."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.errors import unavailable
from broker.runtime.metrics import CONTENT_TYPE
from broker.storage.client import StoreError
from broker.web import reference
from broker.web.http import error_response, json_response
from broker.web.services import services


@lru_cache(maxsize=1)
def openapi_text() -> str:
    return resources.files("broker.web").joinpath("openapi.yaml").read_text()


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


_NOT_READY: tuple[type[Exception], ...] = (*StoreError, OSError)


async def readyz(request: Request) -> Response:
    storage = services(request).storage
    try:
        whole = await storage.ping()
    except _NOT_READY:
        return error_response(unavailable("the store is not reachable"))
    kind = "embedded" if storage.embedded else {"single": "redis"}.get(storage.backend.kind,
                                                                       storage.backend.kind)
    ready: dict[str, str] = {"status": "ready", "store": kind}
    if not whole:  # a Cluster shard failing over: still ready for every other shard's keys
        ready["degraded"] = "a Cluster primary does not answer; its keys get 503 meanwhile"
    return json_response(ready)


async def metrics(request: Request) -> Response:
    return Response(services(request).metrics.render(), media_type=CONTENT_TYPE)


async def openapi_yaml(request: Request) -> Response:
    return Response(openapi_text(), media_type="application/yaml")


async def docs(request: Request) -> Response:
    # Everything is inline and from the package: nothing else may load (no CDN, no script).
    return Response(reference.page(), media_type="text/html; charset=utf-8", headers={
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                                   "img-src 'self'; base-uri 'none'; form-action 'none'"})


@lru_cache(maxsize=1)
def openapi_json_bytes() -> bytes:
    """The document as JSON, made once: parsing the YAML costs about 100 ms of CPU."""
    return json.dumps(reference.load_document(openapi_text())).encode()


async def openapi_json(request: Request) -> Response:
    return Response(openapi_json_bytes(), media_type="application/json")


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.yaml", openapi_yaml, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/docs", docs, methods=["GET"]),
]
