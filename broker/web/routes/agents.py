"""REST resources for agents: register, get one, list a namespace's agents."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.models import RegisterBody
from broker.services.fields import check_message_id
from broker.web.http import authenticate, decode_json, int_param, json_response, read_body
from broker.web.services import services


async def register_agent(request: Request) -> Response:
    principal = await authenticate(request)
    service = services(request).agents
    body = decode_json(
        await read_body(request, service.settings.max_registration_bytes), RegisterBody)
    registration = await service.register(
        principal, body.namespace, body.name, body.framework,
        check_message_id(request.headers.get("idempotency-key")), body.new,
    )
    return json_response(registration, 200 if registration.reused else 201)


async def get_agent(request: Request) -> Response:
    principal = await authenticate(request)
    agent = await services(request).agents.get(principal, request.path_params["namespace"],
                                               request.path_params["agent_id"])
    return json_response(agent)


async def remove_agent(request: Request) -> Response:
    principal = await authenticate(request)
    service = services(request).agents
    try:
        await service.remove(principal, request.path_params["namespace"],
                             request.path_params["agent_id"])
    finally:  # in effect here at once, even when replicas did not confirm it (a 503)
        services(request).auth.forget()
    return Response(status_code=204)


async def list_agents(request: Request) -> Response:
    principal = await authenticate(request)
    agents, cursor = await services(request).agents.list(
        principal, request.path_params["namespace"], request.query_params.get("cursor"),
        int_param(request, "limit"))
    return json_response({"agents": agents, "next_cursor": cursor})


routes = [
    Route("/v1/agents", register_agent, methods=["POST"]),
    Route("/v1/namespaces/{namespace}/agents", list_agents, methods=["GET"]),
    Route("/v1/namespaces/{namespace}/agents/{agent_id}", get_agent, methods=["GET"]),
    Route("/v1/namespaces/{namespace}/agents/{agent_id}", remove_agent, methods=["DELETE"]),
]
