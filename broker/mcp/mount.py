"""`/mcp` as the app mounts it. Requests are authenticated here, as on every other route; the
MCP server behind (`broker.mcp.server`, the `mcp` package: about 2 s of CPU to import) is
imported and started on the first authenticated request, so a broker that never serves MCP
never pays for it, and it runs until the app shuts down."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from broker.core.errors import MempError
from broker.services.auth import Authenticator
from broker.storage.client import STORE_DOWN, store_down
from broker.web.http import error_response

if TYPE_CHECKING:
    from broker.mcp.server import McpServer

SERVER_MODULE = "broker.mcp.server"
log = logging.getLogger("memp.mcp")


class McpMount:
    """The `/mcp` endpoint: authenticates, then hands the request to the MCP server, which
    `build` makes (and whose session manager this starts) on the first request."""

    def __init__(self, auth: Authenticator, build: Callable[[], McpServer]) -> None:
        self.auth = auth
        self._build = build
        self._starting: asyncio.Future[McpServer] | None = None
        self._running: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            principal = await self.auth.authenticate(request.headers.get("authorization"))
        except MempError as exc:
            await error_response(exc)(scope, receive, send)
            return
        except STORE_DOWN as exc:
            await error_response(store_down(exc))(scope, receive, send)
            return
        server = await self.server()
        await server.handle(scope, receive, send, principal)

    @property
    def started(self) -> McpServer | None:
        """The MCP server once the first request has started it."""
        starting = self._starting
        if starting is None or not starting.done() or starting.exception() is not None:
            return None
        return starting.result()

    async def server(self) -> McpServer:
        """The running MCP server, started by the first caller (the others wait for it)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            return await asyncio.shield(self._starting)
        except Exception:
            self._starting = None  # the next request tries again
            raise

    async def _start(self) -> McpServer:
        # The import runs in a thread, so the event loop keeps serving meanwhile; the server
        # is built on the loop, where its locks belong.
        await asyncio.to_thread(importlib.import_module, SERVER_MODULE)
        server = self._build()
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        running = asyncio.create_task(self._run(server, started), name="mcp sessions")
        running.add_done_callback(_log_failure)
        self._running = running
        await asyncio.wait((started, running), return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            running.result()  # raises what stopped it
            raise RuntimeError("the MCP session manager ended before it started")
        return server

    async def _run(self, server: McpServer, started: asyncio.Future[None]) -> None:
        """Holds the session manager open (its task group must start and end in one task)."""
        async with server.running():
            started.set_result(None)
            await self._stop.wait()

    async def close(self) -> None:
        """Stop the MCP server, if it was started, and end its sessions."""
        self._stop.set()
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the MCP session manager failed", exc_info=task.exception())


def route(mount: McpMount) -> Route:
    return Route("/mcp", mount, methods=["GET", "POST", "DELETE"])
