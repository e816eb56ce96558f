"""Request counters in the Prometheus text format, kept by a small ASGI middleware."""

from __future__ import annotations

import time
from collections import defaultdict

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Metrics:
    """Counts requests and their total latency by method and status."""

    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.seconds: defaultdict[tuple[str, int], float] = defaultdict(float)
        self.refusals: defaultdict[tuple[str, str, str], int] = defaultdict(int)

    def count_refusal(self, code: str, limit: str, scope: str) -> None:
        """A request refused by fair share (`rate_limited` or `quota_exceeded`)."""
        self.refusals[(code, limit, scope)] += 1

    def render(self) -> str:
        lines = [
            "# HELP memp_http_requests_total HTTP requests served.",
            "# TYPE memp_http_requests_total counter",
        ]
        for (method, status), count in sorted(self.requests.items()):
            lines.append(f'memp_http_requests_total{{method="{method}",status="{status}"}} {count}')
        lines += [
            "# HELP memp_http_request_seconds_total Time spent serving HTTP requests.",
            "# TYPE memp_http_request_seconds_total counter",
        ]
        for (method, status), total in sorted(self.seconds.items()):
            labels = f'method="{method}",status="{status}"'
            lines.append(f"memp_http_request_seconds_total{{{labels}}} {total:.6f}")
        lines += [
            "# HELP memp_rate_limited_total Requests refused for going over a rate.",
            "# TYPE memp_rate_limited_total counter",
        ]
        for (code, limit, scope), count in sorted(self.refusals.items()):
            if code == "rate_limited":
                lines.append(f'memp_rate_limited_total{{limit="{limit}",scope="{scope}"}} '
                             f"{count}")
        lines += [
            "# HELP memp_quota_exceeded_total Writes and streams refused for going over a quota.",
            "# TYPE memp_quota_exceeded_total counter",
        ]
        for (code, limit, _), count in sorted(self.refusals.items()):
            if code == "quota_exceeded":
                lines.append(f'memp_quota_exceeded_total{{limit="{limit}"}} {count}')
        return "\n".join(lines) + "\n"


class MetricsMiddleware:
    """Records every HTTP request's method, status and duration."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            key = (scope["method"], status)
            self.metrics.requests[key] += 1
            self.metrics.seconds[key] += time.perf_counter() - started
