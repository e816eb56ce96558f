"""Sending calls: one pooled httpx client, the bearer token, and retries with backoff.

Retries resend the very same request, so a write keeps its Idempotency-Key and the broker
applies it once however often it arrives (docs/api.md, "Retries are safe")."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import ssl
import time
from dataclasses import dataclass
from typing import TypeVar

import httpx

from memp._calls import Call
from memp._version import __version__
from memp.errors import ConnectionFailed, MempError, error_from_response

T = TypeVar("T")
DEFAULT_BASE_URL = "http://127.0.0.1:8080"
# Seconds a call keeps retrying a broker that is out of reach or answers 503: longer than a
# Redis Sentinel or Cluster failover takes (typically 4-9 s; docs/scaling.md).
DEFAULT_RETRY_FOR = 20.0
log = logging.getLogger("memp")

# Errors after which the request surely did not reach the broker: any call may be resent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Errors after which it may have: only idempotent calls are resent.
_MAYBE_SENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
# Replies that say "not now", to try again after a while. A 429 did nothing; a 503 may have
# been applied (the store froze after running the write), so after one only idempotent calls
# are resent. A 429 without Retry-After is a quota, which waiting does not lift.
RETRY_STATUSES = frozenset({429, 503})


class NamespaceMissing(ValueError):
    """A call that works in a namespace was given none, and the client has no default."""



@functools.cache
def default_trust() -> ssl.SSLContext:
    """httpx's default trust, read once per process and shared by every client the SDK makes
    (reading the CA bundle costs each new client about 30 ms of CPU)."""
    return httpx.create_ssl_context()


@dataclass(slots=True)
class Config:
    """Where the broker is, who we are, and how patiently to talk to it."""

    base_url: str
    api_key: str | None
    namespace: str | None
    timeout: float = 10.0
    max_retries: int | None = None  # None: as many as fit in `retry_for`
    backoff: float = 0.2
    max_backoff: float = 5.0
    stream_timeout: float = 60.0
    ca_bundle: str | None = None
    retry_for: float = DEFAULT_RETRY_FOR

    @classmethod
    def resolve(cls, api_key: str | None, namespace: str | None, base_url: str | None, *,
                timeout: float, max_retries: int | None, stream_timeout: float,
                ca_bundle: str | os.PathLike[str] | None = None,
                retry_for: float | None = None) -> Config:
        """Arguments win over MEMP_API_KEY, MEMP_NAMESPACE, MEMP_BASE_URL, MEMP_CA_BUNDLE and
        MEMP_RETRY_FOR."""
        bundle = ca_bundle or os.environ.get("MEMP_CA_BUNDLE") or None
        return cls(
            base_url=(base_url or os.environ.get("MEMP_BASE_URL") or DEFAULT_BASE_URL
                      ).rstrip("/"),
            api_key=api_key or os.environ.get("MEMP_API_KEY") or None,
            namespace=namespace or os.environ.get("MEMP_NAMESPACE") or None,
            timeout=timeout, max_retries=max_retries, stream_timeout=stream_timeout,
            ca_bundle=os.fspath(bundle) if bundle is not None else None,
            retry_for=retry_for if retry_for is not None else retry_for_from_env(),
        )

    def verify(self) -> ssl.SSLContext | bool:
        """How the SDK's own HTTP client checks certificates: httpx's default trust (certifi,
        or SSL_CERT_FILE), or only the CAs in `ca_bundle`."""
        if self.ca_bundle is None:
            return default_trust()
        try:
            return ssl.create_default_context(cafile=self.ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            reason = exc.reason if isinstance(exc, ssl.SSLError) else exc.strerror
            raise ValueError(f"CA bundle {self.ca_bundle}: {reason or exc}") from None

    def require_namespace(self, namespace: str | None = None) -> str:
        chosen = namespace or self.namespace
        if not chosen:
            raise NamespaceMissing("no namespace: pass namespace=... or set MEMP_NAMESPACE")
        return chosen

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Exponential backoff with full jitter; a server's Retry-After is a floor."""
        delay = random.uniform(0, min(self.max_backoff, self.backoff * 2 ** attempt))
        if retry_after is not None and retry_after.isdigit():
            delay = max(delay, min(float(retry_after), self.max_backoff))
        return delay

    def url(self, path: str) -> str:
        """Absolute URLs, so a caller's own `http_client` needs no base_url."""
        return self.base_url + path

    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": f"memp-sdk-python/{__version__}", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def stream_timeouts(self, deadline: float | None = None) -> httpx.Timeout:
        """A stream waits longer between frames than a request (heartbeats come every 15 s);
        before a `deadline` (monotonic), connecting waits no longer than the time left."""
        connect = self.timeout
        if deadline is not None:
            connect = max(min(connect, deadline - time.monotonic()), 0.05)
        return httpx.Timeout(self.timeout, connect=connect, read=self.stream_timeout)


def retry_for_from_env() -> float:
    """MEMP_RETRY_FOR (seconds, 0 for no retries), else the default."""
    text = os.environ.get("MEMP_RETRY_FOR") or ""
    if not text:
        return DEFAULT_RETRY_FOR
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"MEMP_RETRY_FOR must be a number of seconds, not {text!r}")
    return seconds


def _resendable(call: Call[T], exc: httpx.TransportError) -> bool:
    if untrusted(exc) is not None:
        return False  # the same certificate would be refused again
    return isinstance(exc, _NOT_SENT) or (call.idempotent and isinstance(exc, _MAYBE_SENT))


def untrusted(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed under a connection error (httpx wraps httpcore's
    error, which wraps ssl's), if one did."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def check_trust(ca_bundle: object, http_client: object) -> None:
    """`ca_bundle` sets up the HTTP client the SDK makes; a caller's own client has `verify=`."""
    if ca_bundle is not None and http_client is not None:
        raise ValueError("ca_bundle applies to the HTTP client the SDK makes; give your own "
                         "http_client verify=ssl.create_default_context(cafile=...) instead")


def _try_again(call: Call[T], response: httpx.Response, config: Config) -> bool:
    """A 503 on an idempotent call, or a 429 rate_limited whose Retry-After is within the
    backoff cap (a longer wait is the caller's to make: RateLimited.retry_after says it)."""
    if response.status_code == 429:
        wait = response.headers.get("retry-after", "")
        return wait.isdigit() and int(wait) <= config.max_backoff
    return response.status_code == 503 and call.idempotent


def failed(exc: httpx.TransportError, config: Config) -> MempError:
    """The error to raise for a connection that failed for good."""
    refused = untrusted(exc)
    if refused is not None:
        trust = (f"the CA bundle {config.ca_bundle} does not vouch for it" if config.ca_bundle
                 else "pass ca_bundle= or set MEMP_CA_BUNDLE to the CA that signed it")
        return ConnectionFailed(
            f"could not verify the certificate of the broker at {config.base_url}: "
            f"{refused.verify_message or refused.reason}; {trust}", code="connection_error")
    reason = str(exc) or type(exc).__name__
    return ConnectionFailed(f"could not reach the broker at {config.base_url}: {reason}",
                            code="connection_error")


class Patience:
    """One call's retries: how long to wait before the next try, or None to give up. Tries go
    on, with backoff, until `retry_for` seconds have passed since the first (and at most
    `max_retries` resends, when set); the first wait is logged, saying what it waits for."""

    def __init__(self, call: Call[T], config: Config) -> None:
        self.call, self.config = call, config
        self.attempt = 0
        self.started = time.monotonic()

    def after_error(self, exc: httpx.TransportError) -> float | None:
        if not _resendable(self.call, exc):
            return None
        return self._pause(None, f"could not reach the broker at {self.config.base_url} "
                                 f"({str(exc) or type(exc).__name__})")

    def after_reply(self, response: httpx.Response) -> float | None:
        if not _try_again(self.call, response, self.config):
            return None
        what = "is rate limited" if response.status_code == 429 else "is unavailable (503)"
        return self._pause(response.headers.get("retry-after"),
                           f"the broker at {self.config.base_url} {what}")

    def _pause(self, retry_after: str | None, what: str) -> float | None:
        config = self.config
        left = config.retry_for - (time.monotonic() - self.started)
        if left <= 0 or (config.max_retries is not None and self.attempt >= config.max_retries):
            return None
        pause = min(config.delay(self.attempt, retry_after), left)
        (log.warning if self.attempt == 0 else log.debug)(
            "memp: %s; retrying %s %s for up to %s s more", what, self.call.method,
            self.call.path, f"{left:.0f}" if left >= 1 else f"{left:.1f}")
        self.attempt += 1
        return pause


class SyncTransport:
    def __init__(self, config: Config, http: httpx.Client | None = None) -> None:
        self.config = config
        self.http = http or httpx.Client(timeout=config.timeout, verify=config.verify())

    def send(self, call: Call[T]) -> T:
        patience = Patience(call, self.config)
        while True:
            try:
                response = self.http.request(
                    call.method, self.config.url(call.path), params=call.params, content=call.body,
                    headers={**self.config.headers(), **call.headers})
            except httpx.TransportError as exc:
                pause = patience.after_error(exc)
                if pause is None:
                    raise failed(exc, self.config) from exc
                time.sleep(pause)
                continue
            if response.is_success:
                return call.parse(response)
            pause = patience.after_reply(response)
            if pause is None:
                raise error_from_response(response)
            time.sleep(pause)

    def close(self) -> None:
        self.http.close()


class AsyncTransport:
    def __init__(self, config: Config, http: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.http = http or httpx.AsyncClient(timeout=config.timeout, verify=config.verify())

    async def send(self, call: Call[T]) -> T:
        patience = Patience(call, self.config)
        while True:
            try:
                response = await self.http.request(
                    call.method, self.config.url(call.path), params=call.params, content=call.body,
                    headers={**self.config.headers(), **call.headers})
            except httpx.TransportError as exc:
                pause = patience.after_error(exc)
                if pause is None:
                    raise failed(exc, self.config) from exc
                await asyncio.sleep(pause)
                continue
            if response.is_success:
                return call.parse(response)
            pause = patience.after_reply(response)
            if pause is None:
                raise error_from_response(response)
            await asyncio.sleep(pause)

    async def aclose(self) -> None:
        await self.http.aclose()
