"""The AMP API under /amp, with AMP's own paths. The acting agent comes from X-AMP-Agent-ID,
which must be the bearer token's agent unless the token may impersonate (a trusted gateway)."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.amp.acting import acting_agent, agent_id
from broker.amp.cells import CellPatch, ImportBody, NewCell, parse_time
from broker.amp.merge import MergeBody
from broker.amp.search import CellSearch, SearchBody
from broker.core.errors import MempError
from broker.services.audit import actor_fields
from broker.services.auth import Principal
from broker.web.http import authenticate, json_response, read_body
from broker.web.services import services

_AGENT_HEADER = "x-amp-agent-id"


class RunBody(msgspec.Struct, forbid_unknown_fields=True):
    """Body of `POST /amp/lifecycle/run` and `POST /amp/purge`."""

    as_of: str | None = None
    ids: list[str] | None = None


async def _acting(request: Request) -> tuple[Principal, str]:
    """The caller and the agent it acts as."""
    principal = await authenticate(request)
    return principal, acting_agent(principal, services(request).amp_cells.namespace,
                                   request.headers.get(_AGENT_HEADER))


async def _body(request: Request, kind: type[Any], limit: int | None = None) -> Any:
    """The body as `kind`, up to `limit` bytes (`MEMP_MAX_AMP_BODY_BYTES` unless given)."""
    raw = await read_body(request, limit or services(request).settings.max_amp_body_bytes)
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise MempError("invalid_request", str(exc), {"field": _field_of(str(exc))}) from None
    except msgspec.DecodeError as exc:
        raise MempError("invalid_json", f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise MempError("invalid_json", "JSON is nested too deeply") from None


_FIELD_RE = re.compile(r"(?:unknown|required) field `([^`]+)`")


def _field_of(message: str) -> str | None:
    """`... - at `$.scoring.importance`` → `scoring.importance`; an unknown or missing field
    is named with its parent path (`Object contains unknown field `x` - at `$.scoring``)."""
    path = message.rsplit("`$", 1)[1].rstrip("`").strip().lstrip(".") if "`$" in message \
        else ""
    named = _FIELD_RE.search(message)
    if named is not None:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return path or None


async def create_memory(request: Request) -> Response:
    principal, agent = await _acting(request)
    body = await _body(request, NewCell)
    return json_response(await services(request).amp_duplicates.create(principal, agent, body),
                         201)


async def merge_memories(request: Request) -> Response:
    principal, agent = await _acting(request)
    body = await _body(request, MergeBody)
    return json_response(await services(request).amp_merger.merge(principal, agent, body), 201)


async def read_memory(request: Request) -> Response:
    principal, agent = await _acting(request)
    cells = services(request).amp_cells
    return json_response(await cells.read(principal, agent, request.path_params["id"]))


async def patch_memory(request: Request) -> Response:
    principal, agent = await _acting(request)
    patch = await _body(request, CellPatch)
    return json_response(await services(request).amp_cells.patch(principal, agent,
                                                                 request.path_params["id"], patch))


async def delete_memory(request: Request) -> Response:
    principal, agent = await _acting(request)
    return json_response(await services(request).amp_cells.delete(principal, agent,
                                                                  request.path_params["id"]))


async def search_memories(request: Request) -> Response:
    principal, agent = await _acting(request)
    body = await _body(request, SearchBody)
    found = services(request)
    search = CellSearch(found.amp_cells, found.amp_recall)
    return json_response(await search.search(principal, agent, body))


def _as_of(body: RunBody) -> int | None:
    return parse_time(body.as_of, "as_of") if body.as_of else None


async def run_lifecycle(request: Request) -> Response:
    await _acting_admin(request)
    body = await _body(request, RunBody)
    engine = services(request).amp_engine
    counts = await engine.run(_as_of(body))
    return json_response({"transitions": counts})


async def purge(request: Request) -> Response:
    principal, _ = await _acting_admin(request)
    body = await _body(request, RunBody)
    purger = services(request).amp_purger
    return json_response({"purged": await purger.purge(_as_of(body), body.ids,
                                                        actor_fields(principal))})


async def import_cells(request: Request) -> Response:
    principal, agent = await _acting_admin(request)
    body = await _body(request, ImportBody, services(request).settings.max_request_bytes)
    refused = await services(request).amp_cells.import_cells(principal, agent, body.cells)
    errors = [{"index": position, "id": cell.id, **error.body()}
              for position, (cell, error) in enumerate(zip(body.cells, refused, strict=True))
              if error is not None]
    waits = [int(error.headers["Retry-After"]) for error in refused
             if error is not None and "Retry-After" in error.headers]
    return json_response({"imported": len(body.cells) - len(errors), "errors": errors},
                         headers={"Retry-After": str(max(waits))} if waits else None)


async def _acting_admin(request: Request) -> tuple[Principal, str]:
    principal = await authenticate(request)
    principal.require("admin", services(request).amp_cells.namespace)
    claimed = request.headers.get(_AGENT_HEADER)
    return principal, agent_id(claimed) if claimed else principal.writer_id


routes = [
    Route("/amp/memories", create_memory, methods=["POST"]),
    Route("/amp/memories/search", search_memories, methods=["POST"]),
    Route("/amp/memories/merge", merge_memories, methods=["POST"]),
    Route("/amp/memories/{id}", read_memory, methods=["GET"]),
    Route("/amp/memories/{id}", patch_memory, methods=["PATCH"]),
    Route("/amp/memories/{id}", delete_memory, methods=["DELETE"]),
    Route("/amp/lifecycle/run", run_lifecycle, methods=["POST"]),
    Route("/amp/purge", purge, methods=["POST"]),
    Route("/amp/import", import_cells, methods=["POST"]),
]
