"""Where Redis is: the three forms of `MEMP_REDIS_URL`.

- `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS), `unix:///path`: one server.
- `redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]`: Sentinel, as
  Celery and Kombu users write it. The credentials are the data nodes', and the sentinels are
  asked with them too unless `?sentinel_username=` / `?sentinel_password=` say otherwise (an
  empty `sentinel_password=` for sentinels without a password).
- `redis+cluster://[user:password@]host:port[,host:port...]`: Redis Cluster, from any seeds.

TLS on the last two: `redis+sentinel+tls://` / `redis+cluster+tls://`, or `?ssl=true`. TLS
options, in the query of every form: `ssl_ca_certs` (a CA bundle path), `ssl_certfile` and
`ssl_keyfile` (a client certificate), `ssl_cert_reqs` (`required`, the default, or `none`),
`ssl_check_hostname` (`true`/`false`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

Kind = Literal["single", "sentinel", "cluster"]
SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://", "redis+sentinel+tls://",
           "redis+cluster://", "redis+cluster+tls://")
_TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                "ssl_check_hostname")
_TRUE = ("1", "true", "yes", "on")


class UrlError(ValueError):
    """A Redis URL the broker cannot use; the message says why."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed `MEMP_REDIS_URL`."""

    kind: Kind
    url: str  # as given (for one server, passed to redis-py as it is)
    hosts: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False
    tls: dict[str, Any] = field(default_factory=dict)  # redis-py ssl_* options

    def connection_options(self) -> dict[str, Any]:
        """Credentials, database and TLS options for the data nodes (sentinel, cluster)."""
        options: dict[str, Any] = {"username": self.username, "password": self.password}
        if self.kind != "cluster":
            options["db"] = self.db
        if self.ssl:
            options.update(ssl=True, **self.tls)
        return options


def redacted(url: str) -> str:
    """The URL with any password replaced by `***`."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def parse(url: str) -> RedisTarget:
    if not url.startswith(SCHEMES):
        raise UrlError(f"MEMP_REDIS_URL must start with one of {', '.join(SCHEMES)}: "
                       f"{redacted(url)!r}")
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisTarget("single", url)
    kind: Kind = "sentinel" if url.startswith("redis+sentinel") else "cluster"
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = set(query) - {*_TLS_OPTIONS, "ssl", "sentinel_username", "sentinel_password"}
    if unknown:
        raise UrlError(f"MEMP_REDIS_URL has unknown options: {', '.join(sorted(unknown))}")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    hosts = tuple(_host(h) for h in hostlist.split(",") if h)
    if not hosts:
        raise UrlError("MEMP_REDIS_URL names no host:port")
    path = [unquote(p) for p in parts.path.split("/") if p]
    service, db = "", 0
    if kind == "sentinel":
        if not path or len(path) > 2:
            raise UrlError("a Sentinel URL is redis+sentinel://host:port[,host:port]/"
                           "service_name[/db]")
        service = path[0]
        db = _int(path[1], "the database") if len(path) == 2 else 0
    elif path:
        raise UrlError("a Cluster URL names no database: redis+cluster://host:port[,host:port]")
    tls: dict[str, Any] = {k: query[k] for k in _TLS_OPTIONS if k in query}
    if "ssl_check_hostname" in tls:
        tls["ssl_check_hostname"] = tls["ssl_check_hostname"].lower() in _TRUE
    ssl = parts.scheme.endswith("+tls") or query.get("ssl", "").lower() in _TRUE or bool(tls)
    user, secret = unquote(username) or None, unquote(password) or None
    sentinel_user = query.get("sentinel_username", user) or None
    sentinel_secret = query.get("sentinel_password", secret) or None
    return RedisTarget(kind, url, hosts, service, db, user, secret, sentinel_user,
                       sentinel_secret, ssl, tls)


def _host(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise UrlError(f"expected host:port in MEMP_REDIS_URL, not {text!r}")
    return host.strip("[]"), _int(port, "the port")


def _int(text: str, what: str) -> int:
    if not text.isdigit():
        raise UrlError(f"{what} in MEMP_REDIS_URL must be a number, not {text!r}")
    return int(text)
