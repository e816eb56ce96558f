"""Serves the console's static files (`static/`, shipped in the package) at `/console/`.

Every file is read once when the app is built and looked up by exact name, so no part of a
request path ever reaches the filesystem. The console holds no secrets and needs no token; what
it shows comes from the public API with the key the user signs in with."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from broker.core.errors import MempError
from broker.web.http import error_response

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml",
          ".json": "application/json", ".png": "image/png", ".ico": "image/x-icon"}

# Only what the page itself ships may run or load, and it may talk only to this broker: no
# inline script or style, no eval, no third-party origin, no framing (clickjacking), and DOM
# sinks that parse HTML refused outright (Trusted Types), so a stored value can never run.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
       "require-trusted-types-for 'script'; trusted-types 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
           "Cross-Origin-Opener-Policy": "same-origin", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    media_type: str
    etag: str


def load_files(root: Traversable | None = None) -> dict[str, StaticFile]:
    """Every file under `static/` by its path relative to it ("" is index.html)."""
    root = root or resources.files("broker.web.console").joinpath("static")
    files: dict[str, StaticFile] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            name = prefix + child.name
            if child.is_dir():
                walk(child, name + "/")
                continue
            suffix = name[name.rfind("."):] if "." in name else ""
            if suffix not in _TYPES:
                continue
            body = child.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
            files[name] = StaticFile(body, _TYPES[suffix], etag)

    walk(root, "")
    if "index.html" in files:
        files[""] = files["index.html"]
    return files


def routes(files: dict[str, StaticFile] | None = None) -> list[Route]:
    """`/console` redirects to `/console/`; `/console/{file}` serves one shipped file."""
    table = load_files() if files is None else files

    async def redirect(request: Request) -> Response:
        return RedirectResponse("/console/", status_code=308, headers=HEADERS)

    async def serve(request: Request) -> Response:
        found = table.get(request.path_params["file"])
        if found is None:
            return error_response(MempError("not_found", "no such console file"))
        headers = {**HEADERS, "ETag": found.etag}
        if found.etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(found.body, media_type=found.media_type, headers=headers)

    return [Route("/console", redirect, methods=["GET"]),
            Route("/console/{file:path}", serve, methods=["GET"])]
