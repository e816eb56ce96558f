"""Logging: one line per record with its time, level and request id, as text or as JSON
(`MEMP_LOG_FORMAT=json`); request ids taken from `X-Request-ID` or made, and echoed; an access
line per request; and `Throttle`, which keeps a repeating warning to one line a period.

Every record's text is escaped by the formatters themselves, whatever logger wrote it, so no
call site can let a request's bytes forge a line (docs/security.md, "Logs")."""

from __future__ import annotations

import itertools
import json
import logging
import logging.config
import re
import secrets
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module without the HTTP layer
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
FORMATS = ("text", "json")
HEADER = "X-Request-ID"
# The request being served, in every log line written while serving it and in error bodies.
request_id: ContextVar[str | None] = ContextVar("memp_request_id", default=None)
# A client's id is echoed only if it is short and plain: it goes into headers and log lines.
_ACCEPTED_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
access = logging.getLogger("memp.access")


_PREFIX = secrets.token_hex(4)  # this process's; a counter after it is cheaper than randomness
_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """16 hex digits: 8 random per process, then a counter (unique across processes, cheap)."""
    return f"{_PREFIX}{next(_COUNTER) & 0xFFFFFFFF:08x}"


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record (`record.request_id`, None outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.get()
        return True


# What a text line must not hold raw: C0 controls (CR and LF forge lines, ESC drives terminals),
# DEL, C1 controls (0x9B is a CSI on 8-bit terminals), the Unicode line and paragraph
# separators, and the bidirectional controls that make a line read otherwise than it is
# (CVE-2021-42574).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
# What JSON (`json.dumps` escapes the C0 controls) still leaves raw.
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """`text` with every control, line-separating and bidirectional character written as an
    escape (`\\n`, `\\x1b`, `\\u2028`), so it stays on one line and reads as it is."""
    return _UNSAFE.sub(_escape_one, text) if _UNSAFE.search(text) else text


def _escape_json(text: str) -> str:
    return _UNSAFE_IN_JSON.sub(_escape_one, text) if _UNSAFE_IN_JSON.search(text) else text


def _indented(text: str) -> str:
    """A traceback (which may quote a request in its exception's message) under its record,
    every line escaped and indented, so none can pass for a record of its own."""
    return "\n".join(f"  {escape(line)}" for line in text.splitlines())


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """`2026-01-01T12:00:00.000Z INFO memp.hub [req=…] message`."""

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "request_id", None)
        line = (f"{_timestamp(record)} {record.levelname} {escape(record.name)}"
                f"{f' [req={escape(str(rid))}]' if rid else ''} {escape(record.getMessage())}")
        if record.exc_info:
            line += "\n" + _indented(self.formatException(record.exc_info))
        if record.stack_info:
            line += "\n" + _indented(self.formatStack(record.stack_info))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, and the error's
    traceback as `exception`. Strings are escaped as text lines are, beyond what JSON escapes."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": _timestamp(record), "level": record.levelname,
                                 "logger": record.name,
                                 "message": _escape_json(record.getMessage())}
        rid = getattr(record, "request_id", None)
        if rid:
            entry["request_id"] = rid
        for name in ("method", "path", "status", "duration_ms", "client"):
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = _escape_json(value) if isinstance(value, str) else value
        if record.exc_info:
            entry["exception"] = _escape_json(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def config(level: str, fmt: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for the broker's and uvicorn's loggers (uvicorn applies it
    in every worker process)."""
    formatter = {"()": f"broker.runtime.logs.{'Json' if fmt == 'json' else 'Text'}Formatter"}
    numeric = "DEBUG" if level == "trace" else level.upper()
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr",
               "formatter": "line", "filters": ["request_id"]}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "broker.runtime.logs.RequestIdFilter"}},
        "formatters": {"line": formatter},
        "handlers": {"stderr": handler},
        # Libraries' own loggers (mcp, sse_starlette, redis...) reach stderr through the
        # formatter too, escaped, rather than through logging's bare last-resort handler.
        "root": {"handlers": ["stderr"], "level": "WARNING"},
        "loggers": {
            "memp": {"handlers": ["stderr"], "level": numeric, "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": numeric, "propagate": False},
            "uvicorn.error": {"level": numeric},
            # The broker writes its own access line (with the request id and duration).
            "uvicorn.access": {"handlers": [], "level": "CRITICAL", "propagate": False},
        },
    }


def configure(level: str, fmt: str) -> dict[str, Any]:
    """Apply `config(level, fmt)` in this process and return it (for uvicorn's workers)."""
    settings = config(level, fmt)
    logging.config.dictConfig(settings)
    return settings


class RequestIdMiddleware:
    """Gives each HTTP request an id (the client's `X-Request-ID` when it is plain, else a
    new one), echoes it in the reply, and writes the access line when the reply has begun."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                given = value.decode("latin-1")
                break
        rid = given if given is not None and _ACCEPTED_ID.fullmatch(given) else \
            new_request_id()
        token = request_id.set(rid)
        logged = access.isEnabledFor(logging.INFO)
        started = time.perf_counter() if logged else 0.0
        header = (b"x-request-id", rid.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
                if logged:
                    _access_line(scope, message["status"], started)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)


def _access_line(scope: Scope, status: int, started: float) -> None:
    client = scope.get("client")
    path = scope.get("path", "")
    milliseconds = round((time.perf_counter() - started) * 1000, 2)
    address = f"{client[0]}:{client[1]}" if client else None
    access.info("%s %s %s %.2fms %s", scope["method"], path, status, milliseconds,
                address or "-", extra={"method": scope["method"], "path": path,
                                       "status": status, "duration_ms": milliseconds,
                                       "client": address})


class Throttle:
    """Logs a repeating condition (the store out of reach) at most once per `period`
    seconds, with how many times it recurred meanwhile, and once when it ends."""

    def __init__(self, logger: logging.Logger, period: float = 30.0) -> None:
        self.logger = logger
        self.period = period
        self.failing = False
        self.since = 0.0
        self.last = float("-inf")
        self.suppressed = 0

    def failure(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if not self.failing:
            self.failing, self.since = True, now
        if now - self.last < self.period:
            self.suppressed += 1
            return
        more = f" ({self.suppressed} more like it in the last {now - self.last:.0f} s)" \
            if self.suppressed else ""
        self.logger.warning(message + more, *args)
        self.last, self.suppressed = now, 0

    def recovered(self, message: str) -> None:
        if not self.failing:
            return
        self.logger.warning("%s after %.1f s", message, time.monotonic() - self.since)
        self.failing, self.suppressed, self.last = False, 0, float("-inf")
