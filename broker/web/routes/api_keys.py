"""Admin resources for API keys: create, list, revoke."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.core.errors import MempError
from broker.core.models import ApiKeyRecord, CreateKeyBody
from broker.services.audit import actor_fields
from broker.services.auth import Principal, check_binding, check_grants, create_api_key
from broker.storage.writes import settle
from broker.web.http import authenticate, decode_json, json_response, read_body
from broker.web.services import services


def _visible(principal: Principal, record: ApiKeyRecord) -> bool:
    return all(principal.covers(g) for g in record.grants)


async def create_key(request: Request) -> Response:
    principal = await authenticate(request)
    state = services(request)
    body = decode_json(await read_body(request, state.settings.max_key_creation_bytes),
                       CreateKeyBody)
    grants = check_grants(body.grants)
    for grant in grants:
        if not principal.covers(grant):
            raise MempError("forbidden",
                            f"creating this key needs admin permission on {grant.namespace!r}")
    if body.agent_id is not None:
        await check_binding(principal, state.storage.accounts, body.agent_id)
    api_key, record = await create_api_key(
        state.storage.accounts, state.settings.key_env, grants=grants, name=body.name,
        agent_id=body.agent_id, created_by=principal.subject, now=state.clock(),
    )
    await state.audit.record_for_grants(record.grants, "key-create", actor_fields(principal),
                                        {"key": record.id, "agent": record.agent_id})
    return json_response({"api_key": api_key, "key": record}, 201)


async def list_keys(request: Request) -> Response:
    principal = await authenticate(request)
    if not principal.superuser and not any("admin" in g.permissions for g in principal.grants):
        raise MempError("forbidden", "listing keys needs admin permission")
    records = await services(request).storage.accounts.list_api_keys()
    return json_response({"keys": [r for r in records if _visible(principal, r)]})


async def revoke_key(request: Request) -> Response:
    principal = await authenticate(request)
    store = services(request).storage.accounts
    key_id = request.path_params["key_id"]
    records = {r.id: r for r in await store.list_api_keys()}
    record = records.get(key_id)
    if record is None or not _visible(principal, record):
        raise MempError("not_found", f"no API key {key_id!r}")

    async def revoked() -> None:  # confirmed by replicas or not: announced by the store
        services(request).auth.forget()
        await services(request).audit.record_for_grants(
            record.grants, "key-revoke", actor_fields(principal), {"key": key_id})

    await settle(store.delete_api_key(key_id), revoked)
    return Response(status_code=204)


routes = [
    Route("/v1/keys", create_key, methods=["POST"]),
    Route("/v1/keys", list_keys, methods=["GET"]),
    Route("/v1/keys/{key_id}", revoke_key, methods=["DELETE"]),
]
