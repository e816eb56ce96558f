"""Proposals: list, show, approve and reject gated writes."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.models import ApproveBody, RejectBody
from broker.web.http import authenticate, decode_json, int_param, json_response, read_body
from broker.web.services import services

_MAX_BODY = 16 * 1024


async def list_proposals(request: Request) -> Response:
    principal = await authenticate(request)
    params = request.query_params
    page = await services(request).proposals.list(
        principal, request.path_params["namespace"], params.get("status") or None,
        params.get("key") or None, params.get("cursor") or None, int_param(request, "limit"))
    return json_response(page)


async def get_proposal(request: Request) -> Response:
    principal = await authenticate(request)
    proposal = await services(request).proposals.get(principal, request.path_params["namespace"],
                                                     request.path_params["proposal_id"])
    return json_response(proposal)


async def _body(request: Request) -> bytes:
    """An optional JSON body: none at all reads as `{}`."""
    if request.headers.get("content-length", "0") == "0" and \
            "chunked" not in request.headers.get("transfer-encoding", ""):
        return b"{}"
    return await read_body(request, _MAX_BODY) or b"{}"


async def approve_proposal(request: Request) -> Response:
    principal = await authenticate(request)
    body = decode_json(await _body(request), ApproveBody)
    proposal, entry = await services(request).proposals.approve(
        principal, request.path_params["namespace"], request.path_params["proposal_id"],
        body.base_version)
    return json_response({"proposal": proposal, "entry": entry})


async def reject_proposal(request: Request) -> Response:
    principal = await authenticate(request)
    body = decode_json(await _body(request), RejectBody)
    proposal = await services(request).proposals.reject(
        principal, request.path_params["namespace"], request.path_params["proposal_id"],
        body.reason)
    return json_response(proposal)


_BASE = "/v1/namespaces/{namespace}/proposals"
routes = [
    Route(_BASE, list_proposals, methods=["GET"]),
    Route(_BASE + "/{proposal_id}", get_proposal, methods=["GET"]),
    Route(_BASE + "/{proposal_id}/approve", approve_proposal, methods=["POST"]),
    Route(_BASE + "/{proposal_id}/reject", reject_proposal, methods=["POST"]),
]
