"""The broker's MCP server at `/mcp` (Streamable HTTP, the official `mcp` package): tools,
`memp://` resources and their subscriptions, for the caller the request's Bearer token names.

Every request to `/mcp` is authenticated as every other request is (a 401 in the broker's own
error shape otherwise: broker/mcp/mount.py), and each handler acts with that principal
through the services, so MCP opens no new way in. A handshake-era session belongs to the
credential that opened it (the session manager answers 404 to any other) and lives in the
process that opened it; a 2026-07-28 request stands alone and may reach any process."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import msgspec
from mcp.server import Server
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from broker import __version__
from broker.core.errors import MempError
from broker.core.models import encode
from broker.core.nesting import TooDeep, decode_stored
from broker.mcp.resources import TEMPLATES, Resources
from broker.mcp.sessions import OwnedSessions
from broker.mcp.tools import Toolbox
from broker.mcp.watch import Watcher, Watches, listen
from broker.services.approval import Proposed, pending
from broker.services.auth import Principal
from broker.services.failures import FAILURES, Failures

PRINCIPAL = "memp.principal"  # the scope key the endpoint leaves the caller under
_WATCHES = "memp.watches"  # a connection's followed URIs (Connection.state)

INSTRUCTIONS = """\
Shared, versioned memory that several agents read and write. Entries are JSON values under
'/'-separated keys in namespaces (memory_put, memory_get, memory_query, memory_delete,
memory_history); leave the namespace out to use your agent's own. AMP memory cells are
remembered facts and events with importance and decay (amp_remember, amp_recall, amp_merge,
amp_forget).
Every entry is also a resource, memp://{namespace}/{key}; subscribe to one to hear when another
agent changes it."""


def _plain(error: MempError) -> dict[str, Any]:
    """The error's `{code, message, details}` as plain JSON values."""
    plain: dict[str, Any] = msgspec.json.decode(encode(error.body()["error"]))
    return plain


def _protocol_error(error: MempError) -> MCPError:
    """A refusal of a non-tool request: a JSON-RPC error whose data is the broker's error."""
    code = types.INVALID_PARAMS if error.status < 500 else types.INTERNAL_ERROR
    return MCPError(code, f"{error.code}: {error.message}", _plain(error))


def _structured(text: bytes) -> dict[str, Any] | None:
    """A tool's reply as plain JSON for `structuredContent`; None (the text alone) when it holds
    a value stored before MEMP_MAX_JSON_DEPTH and nested too deep for the MCP serialiser."""
    try:
        plain = decode_stored(text)
    except TooDeep:
        return None
    return plain if isinstance(plain, dict) else None


def _principal(ctx: ServerRequestContext[Any, Any]) -> Principal:
    request = ctx.request
    principal = request.scope.get(PRINCIPAL) if isinstance(request, Request) else None
    if not isinstance(principal, Principal):
        raise _protocol_error(MempError("unauthorized", "no authenticated caller"))
    return principal


def _connection(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The handler's connection. The request context does not carry it yet (mcp's `Context`
    rework will add `ctx.connection`); its session does."""
    connection = getattr(ctx.session, "_connection", None)
    if not isinstance(connection, Connection):
        raise MCPError(types.INTERNAL_ERROR, "this transport has no connection to follow "
                       "resources on")
    return connection


class McpServer:
    """The MCP server and the session manager that serves it over Streamable HTTP."""

    def __init__(self, toolbox: Toolbox, resources: Resources, watcher: Watcher,
                 max_request_bytes: int, failures: Failures) -> None:
        self.toolbox = toolbox
        self.failures = failures
        self.resources = resources
        self.watcher = watcher
        self.server: Server[Any] = Server(
            "memp-broker", version=__version__, title="MEMP broker", instructions=INSTRUCTIONS,
            get_tool_input_schema=toolbox.schemas.get,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe, on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=self._listen,
        )
        # No DNS-rebinding checks: every request carries a Bearer token, which a page that
        # rebinds a name to this host cannot have (browsers are let in by MEMP_CORS_ORIGINS).
        self.manager = StreamableHTTPSessionManager(
            app=self.server, max_request_body_size=max_request_bytes)
        self.sessions = OwnedSessions(self.manager, watcher.guard)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def handle(self, scope: Scope, receive: Receive, send: Send,
                     principal: Principal) -> None:
        """Serve one request of an authenticated caller (broker/mcp/mount.py authenticates)."""
        scope[PRINCIPAL] = principal
        # The session manager binds a session to the credential that opened it.
        scope["user"] = AuthenticatedUser(AccessToken(
            token="", client_id=principal.subject, scopes=[], subject=principal.agent_id))
        if Headers(scope=scope).get("mcp-session-id") is None:  # may open a session
            send = self.sessions.noting(send, principal)
        await self.manager.handle_request(scope, receive, send)

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.toolbox.definitions)

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        """A refusal is a tool error (the model sees it and can correct itself) carrying the
        broker's code, message and details."""
        principal = _principal(ctx)
        try:
            result = await self.toolbox.call(principal, params.name, params.arguments)
        except Proposed as gated:  # not an error: the write awaits a reviewer
            result = pending(gated)
        except FAILURES as exc:
            error = self.failures.error(exc, "MCP tools/call")
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=f"{error.code}: {error.message}")],
                structured_content={"error": _plain(error)}, is_error=True)
        text = encode(result)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text.decode())],
                                    structured_content=_structured(text))

    async def _list_resources(self, ctx: ServerRequestContext[Any, Any],
                              params: types.PaginatedRequestParams | None
                              ) -> types.ListResourcesResult:
        principal = _principal(ctx)
        try:
            home = await self.toolbox.agents.home(principal.agent_id) \
                if principal.agent_id else None
            return await self.resources.list(principal, home, params.cursor if params else None)
        except FAILURES as exc:
            raise _protocol_error(self.failures.error(exc, "MCP resources/list")) from None

    async def _list_templates(self, ctx: ServerRequestContext[Any, Any],
                              params: types.PaginatedRequestParams | None
                              ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=TEMPLATES)

    async def _read_resource(self, ctx: ServerRequestContext[Any, Any],
                             params: types.ReadResourceRequestParams
                             ) -> types.ReadResourceResult:
        principal = _principal(ctx)
        try:
            return await self.resources.read(principal, params.uri)
        except FAILURES as exc:
            raise _protocol_error(self.failures.error(exc, "MCP resources/read")) from None

    def _watches(self, ctx: ServerRequestContext[Any, Any]) -> Watches:
        connection = _connection(ctx)
        watches = connection.state.get(_WATCHES)
        if not isinstance(watches, Watches):
            outbound = connection.outbound

            async def notify(uri: str) -> None:
                await outbound.notify("notifications/resources/updated", {"uri": uri})

            watches = Watches(self.watcher, notify)
            connection.state[_WATCHES] = watches
            connection.exit_stack.push_async_callback(watches.close)
        return watches

    async def _subscribe(self, ctx: ServerRequestContext[Any, Any],
                         params: types.SubscribeRequestParams) -> types.EmptyResult:
        principal = _principal(ctx)
        try:
            await self._watches(ctx).add(principal, params.uri)
        except FAILURES as exc:
            raise _protocol_error(self.failures.error(exc, "MCP resources/subscribe")) from None
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: ServerRequestContext[Any, Any],
                           params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        _principal(ctx)
        self._watches(ctx).remove(params.uri)
        return types.EmptyResult()

    async def _listen(self, ctx: ServerRequestContext[Any, Any],
                      params: types.SubscriptionsListenRequestParams
                      ) -> types.SubscriptionsListenResult:
        principal = _principal(ctx)
        request_id = ctx.request_id
        if request_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen needs a request id")

        async def send(notification: types.ServerNotification) -> None:
            await ctx.session.send_notification(notification, related_request_id=request_id)

        try:
            return await listen(self.watcher, principal, request_id, params, send)
        except FAILURES as exc:
            raise _protocol_error(self.failures.error(exc, "MCP subscriptions/listen")) from None
