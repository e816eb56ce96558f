"""httpx reads its CA bundle for every new client (about 30 ms of CPU each), and the tests make
thousands of clients; in the test process they share the one default context instead. A client
given its own `verify=` (the HTTPS tests' throwaway CAs) is not touched."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from typing import Any

import httpx
from httpx._transports import default as transports


def share_default_trust() -> None:
    """Make every httpx client of this process built with the default trust use one context."""
    build: Callable[..., ssl.SSLContext] = getattr(  # noqa: B009 (not exported)
        transports, "create_ssl_context")
    if getattr(build, "shared", False):
        return
    shared_default = functools.cache(lambda: httpx.create_ssl_context())

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True
                           ) -> ssl.SSLContext:
        if verify is True and cert is None and trust_env:
            return shared_default()
        return build(verify=verify, cert=cert, trust_env=trust_env)

    create_ssl_context.shared = True  # type: ignore[attr-defined]
    setattr(transports, "create_ssl_context", create_ssl_context)  # noqa: B010
