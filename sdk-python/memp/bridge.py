"""`memp mcp`: the broker's MCP server over stdio, for desktop clients that start their servers
as commands. It relays every request to the broker's `/mcp` with the configured key
(MEMP_BASE_URL, MEMP_API_KEY), so the tools, resources and rules are the broker's own, and
subscriptions become `subscriptions/listen` streams to the broker.

Needs the `mcp` package: `pip install -e './sdk-python[mcp]'` from a clone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import httpx
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY, event_to_notification

from memp._transport import Config
from memp._version import __version__
from memp.errors import ConnectionFailed, error_from_response

Context = ServerRequestContext[Any, Any]


class Bridge:
    """A stdio MCP server whose every handler asks the broker's `/mcp`."""

    def __init__(self, upstream: Client, namespace: str | None, group: anyio.abc.TaskGroup
                 ) -> None:
        self.upstream = upstream
        self.namespace = namespace
        self.group = group
        self.followed: dict[str, anyio.CancelScope] = {}
        info = upstream.server_info
        self.server: Server[Any] = Server(
            "memp", version=__version__, title="MEMP (via memp mcp)",
            instructions=upstream.instructions or
            (info.description if info is not None else None),
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe, on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=self._listen,
        )

    async def _list_tools(self, ctx: Context, params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        return await self.upstream.list_tools(cursor=params.cursor if params else None,
                                              cache_mode="bypass")

    async def _call_tool(self, ctx: Context, params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        """The broker's tool; with MEMP_NAMESPACE set, calls that name no namespace use it."""
        arguments = dict(params.arguments or {})
        if self.namespace and params.name.startswith("memory_"):
            arguments.setdefault("namespace", self.namespace)
        result = await self.upstream.call_tool(params.name, arguments)
        if not isinstance(result, types.CallToolResult):  # pragma: no cover
            raise TypeError(f"the broker answered {type(result).__name__}")
        return result

    async def _list_resources(self, ctx: Context, params: types.PaginatedRequestParams | None
                              ) -> types.ListResourcesResult:
        return await self.upstream.list_resources(cursor=params.cursor if params else None,
                                                  cache_mode="bypass")

    async def _list_templates(self, ctx: Context, params: types.PaginatedRequestParams | None
                              ) -> types.ListResourceTemplatesResult:
        return await self.upstream.list_resource_templates(
            cursor=params.cursor if params else None, cache_mode="bypass")

    async def _read_resource(self, ctx: Context, params: types.ReadResourceRequestParams
                             ) -> types.ReadResourceResult:
        return await self.upstream.read_resource(params.uri, cache_mode="bypass")

    async def _subscribe(self, ctx: Context, params: types.SubscribeRequestParams
                         ) -> types.EmptyResult:
        """A handshake-era client's subscription: a listen stream to the broker, whose
        events reach the client on its stdio stream. Open before the reply, so a refusal
        (no `subscribe` grant) is the reply."""
        if params.uri not in self.followed:
            await self.group.start(self._follow, params.uri, ctx.session)
        return types.EmptyResult()

    async def _follow(self, uri: str, session: ServerSession, *,
                      task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                      ) -> None:
        scope = anyio.CancelScope()
        try:
            with scope:
                async with self.upstream.listen(resource_subscriptions=[uri]) as events:
                    self.followed[uri] = scope
                    task_status.started()
                    async for _ in events:
                        await session.send_resource_updated(uri)
        finally:
            if self.followed.get(uri) is scope:
                del self.followed[uri]

    async def _unsubscribe(self, ctx: Context, params: types.UnsubscribeRequestParams
                           ) -> types.EmptyResult:
        scope = self.followed.pop(params.uri, None)
        if scope is not None:
            scope.cancel()
        return types.EmptyResult()

    async def _listen(self, ctx: Context, params: types.SubscriptionsListenRequestParams
                      ) -> types.SubscriptionsListenResult:
        """A 2026-07-28 client's listen stream, relayed from one to the broker."""
        wanted = params.notifications
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        async with self.upstream.listen(
                tools_list_changed=bool(wanted.tools_list_changed),
                prompts_list_changed=bool(wanted.prompts_list_changed),
                resources_list_changed=bool(wanted.resources_list_changed),
                resource_subscriptions=wanted.resource_subscriptions or ()) as events:
            await ctx.session.send_notification(
                types.SubscriptionsAcknowledgedNotification(
                    params=types.SubscriptionsAcknowledgedNotificationParams(
                        notifications=events.honored, _meta=meta)),
                related_request_id=ctx.request_id)
            async for event in events:
                await ctx.session.send_notification(event_to_notification(event, meta),
                                                    related_request_id=ctx.request_id)
        return types.SubscriptionsListenResult(_meta=meta)


@contextlib.asynccontextmanager
async def connect(config: Config) -> AsyncIterator[Client]:
    """An MCP client of the broker's `/mcp`, with the configured key and trust."""
    headers = {"User-Agent": f"memp-sdk-python/{__version__} (memp mcp)"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    http = httpx2.AsyncClient(headers=headers, verify=config.verify(),
                              timeout=httpx2.Timeout(config.timeout, read=300.0))
    async with http, Client(streamable_http_client(config.url("/mcp"), http_client=http),
                            cache=None) as client:
        yield client


async def serve(config: Config) -> None:
    """Serve the broker's MCP over this process's stdin and stdout until stdin closes."""
    async with connect(config) as upstream, anyio.create_task_group() as group:
        bridge = Bridge(upstream, config.namespace, group)
        async with stdio_server() as (read_stream, write_stream):
            await bridge.server.run(read_stream, write_stream,
                                    bridge.server.create_initialization_options())
        group.cancel_scope.cancel()


def run(config: Config) -> None:
    """`memp mcp`: serve until the client closes stdin. A broker that cannot be reached or
    refuses the key is said on stderr (as the SDK's errors) before anything is served."""
    _preflight(config)
    anyio.run(serve, config)


def _preflight(config: Config) -> None:
    probe = {"jsonrpc": "2.0", "id": 0, "method": "ping"}
    headers = {**config.headers(), "Accept": "application/json, text/event-stream"}
    try:
        with httpx.Client(verify=config.verify(), timeout=config.timeout) as http:
            response = http.post(config.url("/mcp"), json=probe, headers=headers)
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"cannot reach the broker at {config.base_url}: {exc}",
                               code="connection_error") from None
    if response.status_code in (401, 403, 404):  # a 404: a broker without /mcp
        raise error_from_response(response)
