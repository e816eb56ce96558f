"""The bad-input catalogue: malformed and hostile requests to every endpoint, over real HTTP on
both backends. Each gets its documented 4xx status and error code in the one error shape, never a
500, and what was stored before the request is still there, unchanged."""

from __future__ import annotations

import base64
import http.client
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import msgspec
import pytest

from tests.support.brokers import ADMIN_KEY, Broker, start_broker

JSON = "application/json"
SEED_KEY = "seed/item"
SEED_VALUE = {"keep": [1, 2, 3], "text": "ünïcødé ✓", "big": 12345678901234567890}
LIMITS = {"max_value_bytes": 1000, "max_request_bytes": 4000, "max_batch": 3,
          "max_registration_bytes": 1500, "max_key_creation_bytes": 1600,
          "max_config_bytes": 1700, "max_amp_body_bytes": 1800}
DEEP = 100_000
_UNSET: Any = object()

Body = bytes | Callable[[], bytes]


@dataclass(frozen=True)
class Bad:
    """One hostile request and what the broker must answer.

    `path`, header values and string fields of `json` may use {ns}, {agent} and {key_id}.
    `token` is one of: admin, none, forged, alg-none, outsider (no grant on {ns})."""

    method: str
    path: str
    status: int
    code: str
    json: Any = _UNSET
    content: Body | None = None
    content_type: str | None = JSON
    headers: dict[str, str | bytes] = field(default_factory=dict)
    token: str = "admin"
    raw_path: bool = False  # send the path byte for byte (httpx would resolve `.` and `..`)
    chunked: bool = False  # no Content-Length: the body streams in chunks
    limited: bool = False  # against the broker with small limits (LIMITS)


@dataclass
class Context:
    broker: Broker
    admin: httpx.Client
    ns: str
    agent: str
    key_id: str
    tokens: dict[str, str | None]
    baseline: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # the seed, as last read
    # The last case read the seed as it ended and found it unchanged: the next need not.
    checked: bool = False

    def fill(self, text: str) -> str:
        return (text.replace("{ns}", self.ns).replace("{agent}", self.agent)
                .replace("{key_id}", self.key_id))

    def fill_json(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.fill(obj)
        if isinstance(obj, list):
            return [self.fill_json(item) for item in obj]
        if isinstance(obj, dict):
            return {key: self.fill_json(value) for key, value in obj.items()}
        return obj


# ---- building the catalogue ----

MEM = "/v1/namespaces/{ns}/memory"
SEED = f"{MEM}/{SEED_KEY}"
HIST = "/v1/namespaces/{ns}/history"
AGENTS = "/v1/namespaces/{ns}/agents"
CONFIG = "/v1/namespaces/{ns}/config"
SCHEMAS = "/v1/namespaces/{ns}/schemas"


def msg(kind: Any, **fields: Any) -> dict[str, Any]:
    """A protocol message for the test's namespace."""
    return {"memp": "1.0", "type": kind, "namespace": "{ns}", **fields}


def put_msg(**fields: Any) -> dict[str, Any]:
    return msg("memory.put", **{"key": SEED_KEY, "value": "overwritten", **fields})


def deep(levels: int = DEEP) -> bytes:
    return b"[" * levels + b"]" * levels


def b64json(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


_ADMIN_CLAIMS = {"sub": "x", "exp": 4_000_000_000,
                 "grants": [{"namespace": "*", "permissions": ["admin"]}]}
ALG_NONE = f"{b64json({'alg': 'none', 'typ': 'JWT'})}.{b64json(_ADMIN_CLAIMS)}."

P = pytest.param


VALID_BODIES: list[tuple[str, str, str, bytes]] = [
    # name, method, path, a body that would be accepted
    ("put", "PUT", SEED, b'{"value": "overwritten"}'),
    ("message", "POST", "/v1/messages",
     b'{"memp": "1.0", "type": "memory.put", "namespace": "{ns}", "key": "seed/item", '
     b'"value": "overwritten"}'),
    ("register", "POST", "/v1/agents", b'{"name": "a", "namespace": "{ns}"}'),
    ("keys", "POST", "/v1/keys", b'{"grants": [{"namespace": "{ns}", "permissions": ["read"]}]}'),
    ("config", "PUT", CONFIG, b'{"strategy": "merge"}'),
    ("schema", "PUT", f"{SCHEMAS}/s2", b'{"pattern": "typed/*", "schema": {"type": "object"}}'),
]


def malformed_json() -> list[Any]:
    """Bodies that are not JSON or not UTF-8: invalid_json; nested deeper than
    MEMP_MAX_JSON_DEPTH: invalid_request, whether or not a decoder could have read them."""
    cases = []
    for name, method, path, valid in VALID_BODIES:
        bodies: list[tuple[str, Body]] = [
            ("truncated", valid[:-1]),
            ("trailing-garbage", valid + b" x"),
            ("two-documents", valid + valid),
            ("single-quotes", valid.replace(b'"', b"'")),
            ("empty-body", b""),
            ("whitespace-only", b"  \n "),
            ("utf8-bom", b"\xef\xbb\xbf" + valid),
            ("invalid-utf8", valid.replace(b'"', b'"\xfe', 1)),
            ("overlong-utf8", b'{"\xc0\xaf": 1}'),
            ("utf16", valid.decode().encode("utf-16")),
        ]
        for kind, body in bodies:
            if name not in ("put", "message") and kind not in (
                    "truncated", "trailing-garbage", "empty-body", "invalid-utf8", "utf16"):
                continue
            cases.append(P(Bad(method, path, 400, "invalid_json", content=body),
                           id=f"{name}-{kind}"))
    nested = [
        ("put", "PUT", SEED, lambda: b'{"value": ' + deep() + b"}"),
        ("put-objects", "PUT", SEED, lambda: b'{"value": ' + b'{"a":' * DEEP + b"1"
         + b"}" * DEEP + b"}"),
        ("message", "POST", "/v1/messages",
         lambda: b'{"memp": "1.0", "type": "memory.put", "namespace": "{ns}", "key": "k", '
                 b'"value": ' + deep() + b"}"),
        ("batch", "POST", "/v1/messages", lambda: deep()),
        ("batch-item", "POST", "/v1/messages", lambda: b"[" + b'{"a":' * DEEP + b"1"
         + b"}" * DEEP + b"]"),
        ("schema", "PUT", f"{SCHEMAS}/s2",
         lambda: b'{"pattern": "*", "schema": {"items": ' + deep(30_000) + b"}}"),
    ]
    cases += [P(Bad(method, path, 400, "invalid_request", content=body),
                id=f"{name}-deep-nesting") for name, method, path, body in nested]
    cases += [
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": NaN}'), id="put-nan"),
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": Infinity}'),
          id="put-infinity"),
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": 1 /* c */}'),
          id="put-comment"),
        P(Bad("POST", "/v1/messages", 400, "invalid_json",
              content=b'{"memp": "1.0", "type": "memory.put", "namespace": "{ns}", '
                      b'"key": "seed/item", "value": {"a": NaN}}'), id="message-nan"),
        P(Bad("POST", "/v1/messages", 400, "invalid_json",
              content=b'[{"memp": "1.0", "type": "memory.put", "namespace": "{ns}", '
                      b'"key": "seed/item", "value": -Infinity}]'), id="batch-infinity"),
        P(Bad("POST", "/amp/memories", 400, "invalid_json", headers={"X-AMP-Agent-ID": "a-1"},
              content=b'{"type": "semantic", "content": {"text": "t", "metadata": '
                      b'{"m": NaN}}}'), id="amp-create-nan-metadata"),
        P(Bad("POST", "/amp/memories", 400, "invalid_json", headers={"X-AMP-Agent-ID": "a-1"},
              content=b'{"type": "semantic", "content": {"text": "t"}, '
                      b'"scoring": {"importance": Infinity}}'), id="amp-create-infinity"),
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": "\\ud800"}'),
          id="put-lone-surrogate-escape"),
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": "\xff\xfe"}'),
          id="put-invalid-utf8-in-value"),
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": ["ok", {"k": "\x80"}]}'),
          id="put-invalid-utf8-nested-in-value"),
        P(Bad("POST", "/v1/messages", 400, "invalid_json",
              content=b'{"memp": "1.0", "type": "memory.put", "namespace": "{ns}", '
                      b'"key": "seed/item", "value": "\xc3"}'), id="message-invalid-utf8-in-value"),
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": "a\x01b"}'),
          id="put-raw-control-in-string"),
        P(Bad("PUT", SEED, 400, "invalid_json", content=b'{"value": "\xed\xa0\x80"}'),
          id="put-utf8-encoded-surrogate"),
        P(Bad("POST", "/v1/messages", 400, "invalid_json", content=b"[{"),
          id="batch-truncated"),
        P(Bad("POST", "/v1/messages", 400, "invalid_json",
              content=b'{"memp":"1.0","type":"memory.put","namespace":"{ns}",'
                      b'"key":"\\ud800","value":1}'), id="message-lone-surrogate-key"),
        P(Bad("POST", "/v1/messages", 400, "invalid_json",
              content=b'{"memp":"1.0","type":"memory.put","namespace":"{ns}",'
                      b'"key":"\xff","value":1}'), id="message-invalid-utf8-key"),
    ]
    return cases


def content_types() -> list[Any]:
    """Bodies not declared as JSON: unsupported_media_type."""
    targets = [
        ("put", "PUT", SEED, b'{"value": 1}'),
        ("message", "POST", "/v1/messages", json.dumps(put_msg()).encode()),
        ("register", "POST", "/v1/agents", b'{"name": "a", "namespace": "{ns}"}'),
        ("keys", "POST", "/v1/keys",
         b'{"grants": [{"namespace": "{ns}", "permissions": ["read"]}]}'),
        ("config", "PUT", CONFIG, b'{"strategy": "merge"}'),
        ("schema", "PUT", f"{SCHEMAS}/s2", b'{"pattern": "*", "schema": {}}'),
    ]
    kinds = [("no-content-type", None), ("text-plain", "text/plain"),
             ("form", "application/x-www-form-urlencoded"), ("jsonp", "application/jsonp"),
             ("multipart", "multipart/form-data; boundary=x")]
    cases = []
    for name, method, path, body in targets:
        for kind, content_type in kinds:
            if name != "put" and kind not in ("no-content-type", "text-plain"):
                continue
            cases.append(P(Bad(method, path, 415, "unsupported_media_type", content=body,
                               content_type=content_type), id=f"{name}-{kind}"))
    return cases


def put_bodies() -> list[Any]:
    """Well-formed JSON of the wrong shape or with bad values, on PUT of the seeded key."""
    bad: list[tuple[str, Any, int, str]] = [
        ("body-array", [], 400, "invalid_request"),
        ("body-string", "value", 400, "invalid_request"),
        ("body-number", 1, 400, "invalid_request"),
        ("body-null", None, 400, "invalid_request"),
        ("missing-value", {}, 400, "invalid_request"),
        ("missing-value-with-ttl", {"ttl_seconds": 5}, 400, "invalid_request"),
        ("unknown-field", {"value": 1, "extra": True}, 400, "invalid_request"),
        ("agent-id-in-body", {"value": 1, "agent_id": "someone"}, 400, "invalid_request"),
        ("version-in-body", {"value": 1, "version": 99}, 400, "invalid_request"),
        ("ttl-string", {"value": 1, "ttl_seconds": "10"}, 400, "invalid_request"),
        ("ttl-float", {"value": 1, "ttl_seconds": 1.5}, 400, "invalid_request"),
        ("ttl-bool", {"value": 1, "ttl_seconds": True}, 400, "invalid_request"),
        ("ttl-object", {"value": 1, "ttl_seconds": {}}, 400, "invalid_request"),
        ("timestamp-float", {"value": 1, "timestamp": 1.5}, 400, "invalid_request"),
        ("timestamp-string", {"value": 1, "timestamp": "now"}, 400, "invalid_request"),
        ("timestamp-bool", {"value": 1, "timestamp": False}, 400, "invalid_request"),
        ("base-version-string", {"value": 1, "base_version": "1"}, 400, "invalid_request"),
        ("ttl-negative", {"value": 1, "ttl_seconds": -1}, 400, "invalid_ttl"),
        ("ttl-zero", {"value": 1, "ttl_seconds": 0}, 400, "invalid_ttl"),
        ("ttl-huge", {"value": 1, "ttl_seconds": 10**12}, 400, "invalid_ttl"),
        ("ttl-huge-integer", {"value": 1, "ttl_seconds": 10**40}, 400, "invalid_ttl"),
        ("ttl-negative-huge-integer", {"value": 1, "ttl_seconds": -(10**40)}, 400,
         "invalid_ttl"),
        ("timestamp-far-future", {"value": 1, "timestamp": 10**15}, 400, "invalid_timestamp"),
        ("timestamp-huge-integer", {"value": 1, "timestamp": 10**40}, 400, "invalid_timestamp"),
        ("timestamp-zero", {"value": 1, "timestamp": 0}, 400, "invalid_timestamp"),
        ("timestamp-negative", {"value": 1, "timestamp": -5}, 400, "invalid_timestamp"),
        ("base-version-zero", {"value": 1, "base_version": 0}, 400, "invalid_request"),
        ("base-version-negative", {"value": 1, "base_version": -3}, 400, "invalid_request"),
    ]
    return [P(Bad("PUT", SEED, status, code, json=body), id=f"put-{name}")
            for name, body, status, code in bad]


def headers() -> list[Any]:
    """Conditions and message ids in headers."""
    put = {"value": "overwritten"}
    cases: list[tuple[str, str, dict[str, str | bytes], int, str]] = [
        ("if-match-word", "PUT", {"If-Match": "abc"}, 400, "invalid_request"),
        ("if-match-zero", "PUT", {"If-Match": '"0"'}, 400, "invalid_request"),
        ("if-match-negative", "PUT", {"If-Match": '"-1"'}, 400, "invalid_request"),
        ("if-match-empty", "PUT", {"If-Match": ""}, 400, "invalid_request"),
        ("if-match-list", "PUT", {"If-Match": '"1", "2"'}, 400, "invalid_request"),
        ("if-match-float", "PUT", {"If-Match": '"1.0"'}, 400, "invalid_request"),
        ("if-match-stale", "PUT", {"If-Match": '"7"'}, 412, "precondition_failed"),
        ("if-match-huge-integer", "PUT", {"If-Match": f'"{10**30}"'}, 400, "invalid_request"),
        ("if-match-past-safe-integers", "PUT", {"If-Match": f'"{2**53}"'}, 400,
         "invalid_request"),
        ("if-match-4400-digits", "PUT", {"If-Match": '"' + "9" * 4400 + '"'}, 400,
         "invalid_request"),
        ("if-match-unicode-digits", "PUT", {"If-Match": '"\u0661"'.encode()}, 400,
         "invalid_request"),
        ("if-none-match-existing", "PUT", {"If-None-Match": "*"}, 412, "precondition_failed"),
        ("idempotency-key-space", "PUT", {"Idempotency-Key": "has space"}, 400,
         "invalid_request"),
        ("idempotency-key-too-long", "PUT", {"Idempotency-Key": "k" * 129}, 400,
         "invalid_request"),
        ("idempotency-key-empty", "PUT", {"Idempotency-Key": ""}, 400, "invalid_request"),
        ("idempotency-key-latin1", "PUT", {"Idempotency-Key": b"caf\xe9"}, 400,
         "invalid_request"),
        ("delete-if-match-word", "DELETE", {"If-Match": "abc"}, 400, "invalid_request"),
        ("delete-if-match-stale", "DELETE", {"If-Match": '"9"'}, 412, "precondition_failed"),
        ("delete-idempotency-key-slash", "DELETE", {"Idempotency-Key": "a/b"}, 400,
         "invalid_request"),
        ("config-if-match-word", "PUT-CONFIG", {"If-Match": "abc"}, 400, "invalid_request"),
        ("register-idempotency-key-space", "POST-AGENT", {"Idempotency-Key": "a b"}, 400,
         "invalid_request"),
    ]
    params = []
    for name, method, extra, status, code in cases:
        if method == "PUT-CONFIG":
            bad = Bad("PUT", CONFIG, status, code, json={"strategy": "merge"}, headers=extra)
        elif method == "POST-AGENT":
            bad = Bad("POST", "/v1/agents", status, code,
                      json={"name": "a", "namespace": "{ns}"}, headers=extra)
        elif method == "DELETE":
            bad = Bad("DELETE", SEED, status, code, headers=extra)
        else:
            bad = Bad("PUT", SEED, status, code, json=put, headers=extra)
        params.append(P(bad, id=name))
    return params


BAD_KEYS = [
    ("dotdot-encoded", "%2E%2E/x"),
    ("dot-encoded", "a/%2E/b"),
    ("empty-segment", "a//b"),
    ("trailing-slash", "a/"),
    ("leading-slash", "/a"),
    ("star", "*"),
    ("segment-star", "a/*"),
    ("star-in-segment", "a/b*c"),
    ("control-01", "%01"),
    ("nul", "a%00b"),
    ("newline", "a%0Ab"),
    ("trailing-newline", "a%0A"),
    ("seed-key-trailing-newline", f"{SEED_KEY}%0A"),
    ("seed-key-trailing-cr", f"{SEED_KEY}%0D"),
    ("del", "a%7Fb"),
    ("c1-control", "a%C2%85b"),
    ("2kb", "k" * 2048),
    ("1025-bytes", "k" * 1025),
    ("multibyte-over-1024-bytes", "%C3%A9" * 513),
    ("empty", ""),
]
RAW_KEYS = [("dotdot", "../x"), ("dot", "a/./b"), ("dotdot-middle", "a/../b"),
            ("dotdot-only", "..")]


def keys() -> list[Any]:
    """Invalid keys in the path of every keyed endpoint: invalid_key."""
    cases = []
    for name, key in BAD_KEYS:
        cases.append(P(Bad("PUT", f"{MEM}/{key}", 400, "invalid_key", json={"value": 1}),
                       id=f"put-key-{name}"))
        if name in ("dotdot-encoded", "empty-segment", "star", "control-01", "2kb", "empty",
                    "seed-key-trailing-newline"):
            cases += [
                P(Bad("GET", f"{MEM}/{key}", 400, "invalid_key"), id=f"get-key-{name}"),
                P(Bad("DELETE", f"{MEM}/{key}", 400, "invalid_key"), id=f"delete-key-{name}"),
                P(Bad("GET", f"{HIST}/{key}", 400, "invalid_key"), id=f"history-key-{name}"),
            ]
    for name, key in RAW_KEYS:
        cases += [
            P(Bad("PUT", f"{MEM}/{key}", 400, "invalid_key", json={"value": 1}, raw_path=True),
              id=f"put-key-{name}-raw"),
            P(Bad("GET", f"{MEM}/{key}", 400, "invalid_key", raw_path=True),
              id=f"get-key-{name}-raw"),
            P(Bad("DELETE", f"{MEM}/{key}", 400, "invalid_key", raw_path=True),
              id=f"delete-key-{name}-raw"),
        ]
    message_keys = [("dotdot", "../x"), ("dot", "a/./b"), ("empty-segment", "a//b"),
                    ("star", "*"), ("segment-star", "a/*"), ("control", "a\x01b"),
                    ("c1-control", "a\x85b"), ("2kb", "k" * 2048), ("empty", "")]
    for name, key in message_keys:
        cases.append(P(Bad("POST", "/v1/messages", 400, "invalid_key",
                           json=put_msg(key=key)), id=f"message-put-key-{name}"))
    for kind in ("memory.get", "memory.delete", "memory.history"):
        cases.append(P(Bad("POST", "/v1/messages", 400, "invalid_key",
                           json=msg(kind, key="../x")), id=f"message-{kind}-key-dotdot"))
    cases.append(P(Bad("POST", "/v1/messages", 400, "invalid_request",
                       json=put_msg(key=5)), id="message-put-key-number"))
    return cases


BAD_NAMESPACES = [("uppercase", "ACME"), ("underscore-start", "_x"), ("64-chars", "a" * 64),
                  ("space", "a%20b"), ("dash-start", "-x"), ("unicode", "%C3%A9t%C3%A9"),
                  ("dot-start", ".x")]


def namespaces() -> list[Any]:
    """Invalid namespaces wherever a namespace goes: invalid_namespace."""
    cases = []
    for name, bad in BAD_NAMESPACES:
        cases.append(P(Bad("PUT", f"/v1/namespaces/{bad}/memory/k", 400, "invalid_namespace",
                           json={"value": 1}), id=f"put-namespace-{name}"))
    for name, bad in BAD_NAMESPACES[:3]:
        base = f"/v1/namespaces/{bad}"
        cases += [
            P(Bad("GET", f"{base}/memory/k", 400, "invalid_namespace"), id=f"get-ns-{name}"),
            P(Bad("DELETE", f"{base}/memory/k", 400, "invalid_namespace"),
              id=f"delete-ns-{name}"),
            P(Bad("GET", f"{base}/memory", 400, "invalid_namespace"), id=f"query-ns-{name}"),
            P(Bad("GET", f"{base}/history/k", 400, "invalid_namespace"),
              id=f"history-ns-{name}"),
            P(Bad("GET", f"{base}/agents", 400, "invalid_namespace"), id=f"agents-ns-{name}"),
            P(Bad("GET", f"{base}/config", 400, "invalid_namespace"), id=f"config-ns-{name}"),
            P(Bad("GET", f"{base}/schemas", 400, "invalid_namespace"),
              id=f"schemas-ns-{name}"),
            P(Bad("GET", f"/v1/subscribe?namespace={bad}", 400, "invalid_namespace"),
              id=f"subscribe-ns-{name}"),
        ]
    in_body: list[tuple[str, Any]] = [("uppercase", "ACME"), ("underscore-start", "_x"),
                                      ("64-chars", "a" * 64), ("space", "a b"), ("number", 7)]
    for name, value in in_body:
        code = "invalid_request" if name == "number" else "invalid_namespace"
        cases += [
            P(Bad("POST", "/v1/agents", 400, code, json={"name": "a", "namespace": value}),
              id=f"register-namespace-{name}"),
            P(Bad("POST", "/v1/messages", 400, code, json={**put_msg(), "namespace": value}),
              id=f"message-namespace-{name}"),
        ]
    cases.append(P(Bad("POST", "/v1/messages", 400, "invalid_namespace",
                       json={"memp": "1.0", "type": "memory.put", "key": "k", "value": 1}),
                   id="message-missing-namespace"))
    return cases


def patterns() -> list[Any]:
    """Bad query and subscription patterns: invalid_pattern."""
    bad = [("star-mid-segment", "a/b*/c"), ("double-star", "**"),
           ("empty-segment-star", "a//*"), ("dotdot-star", "../*"), ("empty", ""),
           ("control", "a\x01*"), ("double-star-middle", "a/**/b"), ("star-in-middle", "a*b"),
           ("too-long", "p" * 2000 + "*")]
    cases = []
    for name, pattern in bad:
        cases.append(P(Bad("GET", f"{MEM}?pattern={_quote(pattern)}", 400, "invalid_pattern"),
                       id=f"query-pattern-{name}"))
    for name, pattern in bad[:4]:
        cases += [
            P(Bad("POST", "/v1/messages", 400, "invalid_pattern",
                  json=msg("memory.query", pattern=pattern)), id=f"message-pattern-{name}"),
            P(Bad("GET", f"/v1/subscribe?namespace={{ns}}&pattern={_quote(pattern)}", 400,
                  "invalid_pattern"), id=f"subscribe-pattern-{name}"),
            P(Bad("PUT", f"{SCHEMAS}/s2", 400, "invalid_pattern",
                  json={"pattern": pattern, "schema": {}}), id=f"schema-pattern-{name}"),
        ]
    return cases


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def queries() -> list[Any]:
    """Limits, cursors and timestamps in query strings."""
    bad = [
        ("query-limit-zero", f"{MEM}?pattern=*&limit=0"),
        ("query-limit-word", f"{MEM}?pattern=*&limit=abc"),
        ("query-limit-negative", f"{MEM}?pattern=*&limit=-1"),
        ("query-limit-float", f"{MEM}?pattern=*&limit=1.5"),
        ("query-cursor-not-base64", f"{MEM}?pattern=*&cursor=***"),
        ("query-cursor-bad-length", f"{MEM}?pattern=*&cursor=a"),
        ("query-cursor-not-utf8", f"{MEM}?pattern=*&cursor=_w"),
        ("history-limit-zero", f"{HIST}/{SEED_KEY}?limit=0"),
        ("history-limit-word", f"{HIST}/{SEED_KEY}?limit=abc"),
        ("agents-limit-zero", f"{AGENTS}?limit=0"),
        ("agents-limit-word", f"{AGENTS}?limit=abc"),
        ("agents-cursor-garbage", f"{AGENTS}?cursor=nope"),
        ("subscribe-nothing", "/v1/subscribe"),
        ("subscribe-sub-without-colon", "/v1/subscribe?sub={ns}"),
        ("subscribe-bad-last-event-id", "/v1/subscribe?namespace={ns}&last_event_id=%%%"),
    ]
    cases = [P(Bad("GET", path, 400, "invalid_request"), id=name) for name, path in bad]
    cases += [
        P(Bad("DELETE", f"{SEED}?timestamp=abc", 400, "invalid_request"),
          id="delete-timestamp-word"),
        P(Bad("DELETE", f"{SEED}?timestamp={10**15}", 400, "invalid_timestamp"),
          id="delete-timestamp-far-future"),
        P(Bad("DELETE", f"{SEED}?timestamp={10**40}", 400, "invalid_timestamp"),
          id="delete-timestamp-huge-integer"),
        P(Bad("GET", f"{MEM}?pattern=*&limit={'9' * 4400}", 400, "invalid_request"),
          id="query-limit-4400-digits"),
        P(Bad("GET", f"{HIST}/{SEED_KEY}?limit={'9' * 4400}", 400, "invalid_request"),
          id="history-limit-4400-digits"),
        P(Bad("GET", f"{AGENTS}?limit={2**53}", 400, "invalid_request"),
          id="agents-limit-past-safe-integers"),
        P(Bad("POST", "/v1/messages", 400, "invalid_request",
              content=b'{"memp": "1.0", "type": "memory.put", "namespace": "{ns}", '
                      b'"key": "seed/item", "value": 1, "if_version": ' + b"9" * 4400 + b"}"),
          id="message-if-version-4400-digits"),
        P(Bad("GET", "/v1/subscribe?namespace={ns}", 400, "invalid_request",
              headers={"Last-Event-ID": "{ns}:18446744073709551616-0"}),
          id="subscribe-last-event-id-past-64-bits"),
        P(Bad("GET", "/v1/subscribe?namespace={ns}", 400, "invalid_request",
              headers={"Last-Event-ID": "{ns}:1-18446744073709551616"}),
          id="subscribe-last-event-id-sequence-past-64-bits"),
        P(Bad("GET", "/v1/subscribe?namespace={ns}", 400, "invalid_request",
              headers={"Last-Event-ID": "{ns}:\u0661-0".encode()}),
          id="subscribe-last-event-id-unicode-digits"),
        P(Bad("PUT", f"{MEM}/k%FF", 400, "invalid_key", json={"value": 1}, raw_path=True),
          id="put-key-invalid-utf8"),
        P(Bad("GET", f"{MEM}/k%FE", 400, "invalid_key", raw_path=True),
          id="get-key-invalid-utf8"),
        P(Bad("DELETE", f"{MEM}/k%C3", 400, "invalid_key", raw_path=True),
          id="delete-key-truncated-utf8"),
        P(Bad("GET", f"{HIST}/k%ED%A0%80", 400, "invalid_key", raw_path=True),
          id="history-key-utf8-surrogate"),
        P(Bad("GET", "/v1/keys/", 404, "not_found"), id="keys-trailing-slash"),
        P(Bad("GET", "/v1/agents/", 404, "not_found"), id="agents-trailing-slash"),
        P(Bad("GET", "/v1/subscribe?namespace={ns}", 400, "invalid_request",
              headers={"Last-Event-ID": "not-a-cursor"}), id="subscribe-bad-last-event-id-header"),
    ]
    return cases


def messages() -> list[Any]:
    """Protocol messages of the wrong shape or with bad fields."""
    bad: list[tuple[str, Any, int, str]] = [
        ("body-number", 1, 400, "invalid_request"),
        ("body-null", None, 400, "invalid_request"),
        ("body-string", "memory.put", 400, "invalid_request"),
        ("empty-object", {}, 400, "invalid_request"),
        ("missing-type", {"memp": "1.0", "namespace": "{ns}", "key": "k"}, 400,
         "invalid_request"),
        ("unknown-type", msg("memory.frobnicate", key="k"), 400, "invalid_request"),
        ("reply-type-ack", msg("ack"), 400, "invalid_request"),
        ("type-number", msg(7), 400, "invalid_request"),
        ("wrong-memp-version", put_msg(memp="2.0"), 400, "invalid_request"),
        ("memp-number", put_msg(memp=1.0), 400, "invalid_request"),
        ("unknown-field", put_msg(extra=1), 400, "invalid_request"),
        ("put-missing-value", msg("memory.put", key="k"), 400, "invalid_request"),
        ("put-ttl-negative", put_msg(ttl_seconds=-1), 400, "invalid_ttl"),
        ("put-ttl-zero", put_msg(ttl_seconds=0), 400, "invalid_ttl"),
        ("put-ttl-huge", put_msg(ttl_seconds=10**40), 400, "invalid_ttl"),
        ("put-ttl-string", put_msg(ttl_seconds="5"), 400, "invalid_request"),
        ("put-ttl-bool", put_msg(ttl_seconds=True), 400, "invalid_request"),
        ("put-timestamp-far-future", put_msg(timestamp=10**15), 400, "invalid_timestamp"),
        ("put-timestamp-float", put_msg(timestamp=1.5), 400, "invalid_request"),
        ("put-if-version-zero", put_msg(if_version=0), 400, "invalid_request"),
        ("put-if-version-bool", put_msg(if_version=True), 400, "invalid_request"),
        ("put-if-version-stale", put_msg(if_version=5), 412, "precondition_failed"),
        ("put-if-version-huge-integer", put_msg(if_version=10**30), 400, "invalid_request"),
        ("put-if-version-4000-digits", put_msg(if_version=10**4000), 400, "invalid_request"),
        ("query-limit-4000-digits", msg("memory.query", pattern="*", limit=10**4000), 400,
         "invalid_request"),
        ("put-if-absent-existing", put_msg(if_absent=True), 412, "precondition_failed"),
        ("put-if-absent-string", put_msg(if_absent="yes"), 400, "invalid_request"),
        ("id-with-space", put_msg(id="has space"), 400, "invalid_request"),
        ("id-too-long", put_msg(id="m" * 129), 400, "invalid_request"),
        ("id-empty", put_msg(id=""), 400, "invalid_request"),
        ("id-number", put_msg(id=5), 400, "invalid_request"),
        ("spoofed-agent-id", put_msg(agent_id="{agent}"), 403, "forbidden"),
        ("delete-timestamp-far-future", msg("memory.delete", key=SEED_KEY, timestamp=10**15),
         400, "invalid_timestamp"),
        ("delete-if-version-stale", msg("memory.delete", key=SEED_KEY, if_version=3), 412,
         "precondition_failed"),
        ("query-missing-pattern", msg("memory.query"), 400, "invalid_request"),
        ("query-limit-zero", msg("memory.query", pattern="*", limit=0), 400,
         "invalid_request"),
        ("query-limit-string", msg("memory.query", pattern="*", limit="10"), 400,
         "invalid_request"),
        ("query-bad-cursor", msg("memory.query", pattern="*", cursor="***"), 400,
         "invalid_request"),
        ("history-limit-zero", msg("memory.history", key=SEED_KEY, limit=0), 400,
         "invalid_request"),
        ("register-missing-name", msg("agent.register"), 400, "invalid_request"),
        ("register-empty-name", msg("agent.register", name=""), 400, "invalid_request"),
        ("register-bad-framework", msg("agent.register", name="a", framework="Lang Chain"),
         400, "invalid_request"),
        ("agent-get-not-uuid", msg("agent.get", agent="nope"), 404, "not_found"),
        ("agent-list-bad-cursor", msg("agent.list", cursor="nope"), 400, "invalid_request"),
        ("agent-list-limit-zero", msg("agent.list", limit=0), 400, "invalid_request"),
    ]
    return [P(Bad("POST", "/v1/messages", status, code, json=body), id=f"message-{name}")
            for name, body, status, code in bad]


def resources() -> list[Any]:
    """Bad bodies for agents, keys, namespace configuration and schemas."""
    reg = "/v1/agents"
    bad: list[tuple[str, str, str, Any, int, str]] = [
        ("register-missing-name", "POST", reg, {"namespace": "{ns}"}, 400, "invalid_request"),
        ("register-missing-namespace", "POST", reg, {"name": "a"}, 400, "invalid_request"),
        ("register-empty-name", "POST", reg, {"name": "", "namespace": "{ns}"}, 400,
         "invalid_request"),
        ("register-control-in-name", "POST", reg, {"name": "a\x01b", "namespace": "{ns}"},
         400, "invalid_request"),
        ("register-long-name", "POST", reg, {"name": "n" * 201, "namespace": "{ns}"}, 400,
         "invalid_request"),
        ("register-name-number", "POST", reg, {"name": 5, "namespace": "{ns}"}, 400,
         "invalid_request"),
        ("register-bad-framework", "POST", reg,
         {"name": "a", "namespace": "{ns}", "framework": "Lang Chain"}, 400, "invalid_request"),
        ("register-unknown-field", "POST", reg,
         {"name": "a", "namespace": "{ns}", "id": "{agent}"}, 400, "invalid_request"),
        ("register-body-array", "POST", reg, [], 400, "invalid_request"),
        ("agent-get-not-uuid", "GET", f"{AGENTS}/not-a-uuid", _UNSET, 404, "not_found"),
        ("agent-get-unknown", "GET", f"{AGENTS}/00000000-0000-4000-8000-000000000000", _UNSET,
         404, "not_found"),
        ("agent-remove-not-uuid", "DELETE", f"{AGENTS}/not-a-uuid", _UNSET, 404, "not_found"),
        ("agent-remove-unknown", "DELETE", f"{AGENTS}/00000000-0000-4000-8000-000000000000",
         _UNSET, 404, "not_found"),
        ("agent-remove-in-another-namespace", "DELETE",
         "/v1/namespaces/{ns}-other/agents/{agent}", _UNSET, 404, "not_found"),
        ("keys-no-grants", "POST", "/v1/keys", {"grants": []}, 400, "invalid_request"),
        ("keys-missing-grants", "POST", "/v1/keys", {"name": "k"}, 400, "invalid_request"),
        ("keys-grants-not-list", "POST", "/v1/keys", {"grants": "all"}, 400,
         "invalid_request"),
        ("keys-unknown-permission", "POST", "/v1/keys",
         {"grants": [{"namespace": "{ns}", "permissions": ["fly"]}]}, 400, "invalid_request"),
        ("keys-no-permissions", "POST", "/v1/keys",
         {"grants": [{"namespace": "{ns}", "permissions": []}]}, 400, "invalid_request"),
        ("keys-bad-namespace-glob", "POST", "/v1/keys",
         {"grants": [{"namespace": "BAD", "permissions": ["read"]}]}, 400,
         "invalid_namespace"),
        ("keys-grant-unknown-field", "POST", "/v1/keys",
         {"grants": [{"namespace": "{ns}", "permissions": ["read"], "x": 1}]}, 400,
         "invalid_request"),
        ("keys-unknown-field", "POST", "/v1/keys",
         {"grants": [{"namespace": "{ns}", "permissions": ["read"]}], "secret": "x"}, 400,
         "invalid_request"),
        ("keys-revoke-unknown", "DELETE", "/v1/keys/key_0000000000000000", _UNSET, 404,
         "not_found"),
        ("keys-revoke-garbage", "DELETE", "/v1/keys/%2E%2E", _UNSET, 404, "not_found"),
        ("config-unknown-strategy", "PUT", CONFIG, {"strategy": "coin-flip"}, 400,
         "invalid_request"),
        ("config-unknown-field", "PUT", CONFIG, {"strategy": "merge", "x": 1}, 400,
         "invalid_request"),
        ("config-body-array", "PUT", CONFIG, [], 400, "invalid_request"),
        ("config-negative-default-ttl", "PUT", CONFIG, {"default_ttl_seconds": -1}, 400,
         "invalid_ttl"),
        ("config-history-limit-huge", "PUT", CONFIG, {"history_limit": 10**30}, 400,
         "invalid_request"),
        ("config-bad-share-namespace", "PUT", CONFIG,
         {"shares": [{"namespace": "a b", "permissions": ["read"]}]}, 400,
         "invalid_namespace"),
        ("config-share-write-permission", "PUT", CONFIG,
         {"shares": [{"namespace": "x", "permissions": ["write"]}]}, 400, "invalid_request"),
        ("config-rule-bad-pattern", "PUT", CONFIG,
         {"rules": [{"pattern": "a//*", "strategy": "merge"}]}, 400, "invalid_pattern"),
        ("config-priority-not-int", "PUT", CONFIG,
         {"priorities": [{"agent": "a", "priority": "high"}]}, 400, "invalid_request"),
        ("schema-not-a-schema", "PUT", f"{SCHEMAS}/s2",
         {"pattern": "*", "schema": {"type": "nonsense"}}, 400, "invalid_schema"),
        ("schema-remote-ref", "PUT", f"{SCHEMAS}/s2",
         {"pattern": "*", "schema": {"$ref": "http://127.0.0.1:9/schema.json"}}, 400,
         "invalid_schema"),
        ("schema-missing-pattern", "PUT", f"{SCHEMAS}/s2", {"schema": {}}, 400,
         "invalid_request"),
        ("schema-is-string", "PUT", f"{SCHEMAS}/s2", {"pattern": "*", "schema": "object"},
         400, "invalid_request"),
        ("schema-bad-id", "PUT", f"{SCHEMAS}/Bad!", {"pattern": "*", "schema": {}}, 400,
         "invalid_request"),
        ("schema-get-bad-id", "GET", f"{SCHEMAS}/Bad!", _UNSET, 400, "invalid_request"),
        ("schema-get-missing", "GET", f"{SCHEMAS}/nope", _UNSET, 404, "not_found"),
        ("schema-delete-missing", "DELETE", f"{SCHEMAS}/nope", _UNSET, 404, "not_found"),
    ]
    return [P(Bad(method, path, status, code, json=body), id=name)
            for name, method, path, body, status, code in bad]


def sizes() -> list[Any]:
    """Values, bodies and batches over the limits: payload_too_large."""
    over_value = LIMITS["max_value_bytes"] + 1
    over_request = LIMITS["max_request_bytes"] + 1000
    big_put = json.dumps({"value": "x" * over_request}).encode()
    big_message = json.dumps(put_msg(value="x" * over_request)).encode()
    batch = [put_msg(key=f"batch/{i}", value=i) for i in range(LIMITS["max_batch"] + 1)]
    return [
        P(Bad("PUT", SEED, 413, "payload_too_large",
              content=lambda: json.dumps({"value": "x" * (1024 * 1024 + 1)}).encode()),
          id="put-value-over-1mib-default-limit"),
        P(Bad("PUT", SEED, 413, "payload_too_large", json={"value": "x" * over_value},
              limited=True), id="put-value-over-limit"),
        P(Bad("PUT", SEED, 413, "payload_too_large", json={"value": ["x"] * 250},
              limited=True), id="put-array-value-over-limit"),
        P(Bad("POST", "/v1/messages", 413, "payload_too_large",
              json=put_msg(value="x" * over_value), limited=True),
          id="message-value-over-limit"),
        P(Bad("PUT", SEED, 413, "payload_too_large", content=big_put, limited=True),
          id="put-body-over-request-limit"),
        P(Bad("PUT", SEED, 413, "payload_too_large", content=big_put, chunked=True,
              limited=True), id="put-body-over-request-limit-chunked"),
        P(Bad("POST", "/v1/messages", 413, "payload_too_large", content=big_message,
              limited=True), id="message-body-over-request-limit"),
        P(Bad("POST", "/v1/messages", 413, "payload_too_large", content=big_message,
              chunked=True, limited=True), id="message-body-over-request-limit-chunked"),
        P(Bad("POST", "/v1/messages", 413, "payload_too_large", json=batch, limited=True),
          id="batch-over-limit"),
        P(Bad("POST", "/v1/agents", 413, "payload_too_large",
              json={"name": "n" * 70_000, "namespace": "{ns}"}), id="register-body-over-64k"),
        P(Bad("POST", "/v1/keys", 413, "payload_too_large",
              json={"name": "n" * 70_000, "grants": []}), id="keys-body-over-64k"),
        P(Bad("PUT", CONFIG, 413, "payload_too_large",
              content=lambda: json.dumps({"shares": [{"namespace": "x", "permissions":
                                                      ["read"]}] * 10_000}).encode()),
          id="config-body-over-256k"),
        P(Bad("POST", "/v1/messages", 400, "invalid_request", json=[]), id="batch-empty"),
    ]


def routing() -> list[Any]:
    """Unknown routes (404) and wrong methods (405), in the error shape."""
    return [
        P(Bad("GET", "/v1/nope", 404, "not_found"), id="unknown-route"),
        P(Bad("GET", "/", 404, "not_found"), id="root"),
        P(Bad("GET", "/v2/namespaces/{ns}/memory/k", 404, "not_found"), id="unknown-version"),
        P(Bad("GET", "/v1/namespaces/{ns}", 404, "not_found"), id="namespace-without-resource"),
        P(Bad("GET", "/v1/namespaces/{ns}/memories/k", 404, "not_found"),
          id="misspelt-resource"),
        P(Bad("GET", f"{MEM}/no/such/key", 404, "not_found"), id="unknown-key"),
        P(Bad("GET", "/v1/namespaces/a%2Fb/memory/k", 404, "not_found"),
          id="namespace-with-encoded-slash"),
        P(Bad("PATCH", SEED, 405, "method_not_allowed", json={"value": 1}),
          id="patch-entry"),
        P(Bad("POST", SEED, 405, "method_not_allowed", json={"value": 1}), id="post-entry"),
        P(Bad("POST", MEM, 405, "method_not_allowed", json={"value": 1}), id="post-query"),
        P(Bad("DELETE", MEM, 405, "method_not_allowed"), id="delete-namespace-memory"),
        P(Bad("PUT", f"{HIST}/{SEED_KEY}", 405, "method_not_allowed", json={"value": 1}),
          id="put-history"),
        P(Bad("GET", "/v1/messages", 405, "method_not_allowed"), id="get-messages"),
        P(Bad("PUT", "/v1/agents", 405, "method_not_allowed", json={}), id="put-agents"),
        P(Bad("DELETE", AGENTS, 405, "method_not_allowed"), id="delete-agents"),
        P(Bad("PATCH", "/v1/keys", 405, "method_not_allowed", json={}), id="patch-keys"),
        P(Bad("POST", "/v1/subscribe", 405, "method_not_allowed", json={}),
          id="post-subscribe"),
        P(Bad("POST", CONFIG, 405, "method_not_allowed", json={}), id="post-config"),
        P(Bad("POST", "/healthz", 405, "method_not_allowed", json={}), id="post-healthz"),
    ]


# Every authenticated endpoint with a request that would succeed for the admin.
ENDPOINTS: list[tuple[str, str, str, Any, int, str]] = [
    # id, method, path, body, status and code for a token without a grant on {ns}
    ("put", "PUT", SEED, {"value": "overwritten"}, 403, "forbidden"),
    ("get", "GET", SEED, _UNSET, 403, "forbidden"),
    ("delete", "DELETE", SEED, _UNSET, 403, "forbidden"),
    ("query", "GET", f"{MEM}?pattern=*", _UNSET, 403, "forbidden"),
    ("history", "GET", f"{HIST}/{SEED_KEY}", _UNSET, 403, "forbidden"),
    ("register", "POST", "/v1/agents", {"name": "intruder", "namespace": "{ns}"}, 403,
     "forbidden"),
    ("list-agents", "GET", AGENTS, _UNSET, 403, "forbidden"),
    ("get-agent", "GET", f"{AGENTS}/{{agent}}", _UNSET, 403, "forbidden"),
    ("remove-agent", "DELETE", f"{AGENTS}/{{agent}}", _UNSET, 403, "forbidden"),
    ("message", "POST", "/v1/messages", put_msg(), 403, "forbidden"),
    ("message-get", "POST", "/v1/messages", msg("memory.get", key=SEED_KEY), 403,
     "forbidden"),
    ("create-key", "POST", "/v1/keys",
     {"grants": [{"namespace": "{ns}", "permissions": ["read", "write", "admin"]}]}, 403,
     "forbidden"),
    ("list-keys", "GET", "/v1/keys", _UNSET, 403, "forbidden"),
    ("revoke-key", "DELETE", "/v1/keys/{key_id}", _UNSET, 404, "not_found"),
    ("get-config", "GET", CONFIG, _UNSET, 403, "forbidden"),
    ("put-config", "PUT", CONFIG, {"strategy": "merge"}, 403, "forbidden"),
    ("list-schemas", "GET", SCHEMAS, _UNSET, 403, "forbidden"),
    ("get-schema", "GET", f"{SCHEMAS}/s1", _UNSET, 403, "forbidden"),
    ("put-schema", "PUT", f"{SCHEMAS}/s1", {"pattern": "*", "schema": False}, 403,
     "forbidden"),
    ("delete-schema", "DELETE", f"{SCHEMAS}/s1", _UNSET, 403, "forbidden"),
    ("subscribe", "GET", "/v1/subscribe?namespace={ns}&pattern=*", _UNSET, 403, "forbidden"),
]


def auth_failures() -> list[Any]:
    """Missing, forged and `alg: none` tokens (401) and a token for another namespace (403),
    on every endpoint."""
    cases = []
    for name, method, path, body, status, code in ENDPOINTS:
        for token in ("none", "forged", "alg-none"):
            cases.append(P(Bad(method, path, 401, "unauthorized", json=body, token=token),
                           id=f"{name}-{token}-token"))
        cases.append(P(Bad(method, path, status, code, json=body, token="outsider"),
                       id=f"{name}-other-namespace-token"))
    cases.append(P(Bad("PUT", SEED, 401, "unauthorized", json={"value": 1}, token="none",
                       headers={"Authorization": "Basic YWRtaW46YWRtaW4="}),
                   id="put-basic-auth"))
    return cases


CATALOGUE = [
    *malformed_json(), *content_types(), *put_bodies(), *headers(), *keys(), *namespaces(),
    *patterns(), *queries(), *messages(), *resources(), *sizes(), *routing(), *auth_failures(),
]


# ---- fixtures ----


@pytest.fixture(scope="module")
def limited(broker: Broker, redis_url: str) -> Iterator[Broker]:
    """A broker on the same backend as `broker`, with small limits (LIMITS)."""
    handle = start_broker(broker.backend, redis_url, **LIMITS)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def outsider_tokens() -> dict[str, str]:
    """Per-broker tokens with full rights on a namespace no test uses (filled lazily)."""
    return {}


@pytest.fixture(scope="module")
def seeded(outsider_tokens: dict[str, str]) -> Iterator[Callable[[Broker], Context]]:
    """One seeded namespace per broker for the whole catalogue. Every case checks that its
    request changed nothing, so they can share it; a namespace per case would also leave the
    session broker's sweeper with hundreds of namespaces to visit. Should a case damage it
    anyway, the next case starts on a fresh one, so one bug fails one case. The context's
    `state` is what the seed holds as the case starts (API keys aside): read again unless the
    case before read it as it ended."""
    contexts: dict[str, Context] = {}

    def get(target: Broker) -> Context:
        ctx = contexts.get(target.url)
        if ctx is not None and ctx.checked:
            ctx.checked = False
            return ctx
        state = _intact(ctx) if ctx is not None else None
        if ctx is not None and state is None:
            ctx.admin.close()
            ctx = None
        if ctx is None:
            ctx = seed(target, target.client(), f"bad-{uuid.uuid4().hex[:12]}",
                       outsider_tokens)
            state = snapshot(ctx, False)
            ctx.baseline = _without_keys(state)
            contexts[target.url] = ctx
        assert state is not None
        ctx.state = state
        return ctx

    yield get
    for ctx in contexts.values():
        ctx.admin.close()


def outsider_token(target: Broker, cache: dict[str, str]) -> str:
    if target.url not in cache:
        with target.client() as admin:
            response = admin.post("/v1/keys", json={"name": "outsider", "grants": [
                {"namespace": "outsider-home", "permissions": ["read", "write", "subscribe"]}]})
            assert response.status_code == 201, response.text
            cache[target.url] = response.json()["api_key"]
    return cache[target.url]


def seed(target: Broker, admin: httpx.Client, ns: str, cache: dict[str, str]) -> Context:
    """Store an entry (two versions), an agent and a schema in `ns`."""
    for value in ("first", SEED_VALUE):
        response = admin.put(f"/v1/namespaces/{ns}/memory/{SEED_KEY}", json={"value": value})
        assert response.status_code in (200, 201), response.text
    registration = admin.post("/v1/agents", json={"name": "seeded", "namespace": ns})
    assert registration.status_code == 201, registration.text
    schema = admin.put(f"/v1/namespaces/{ns}/schemas/s1",
                       json={"pattern": "typed/*", "schema": {"type": "object"}})
    assert schema.status_code == 201, schema.text
    body = registration.json()
    tokens: dict[str, str | None] = {
        "admin": target.admin_headers["Authorization"].removeprefix("Bearer "),
        "none": None,
        "forged": "memp_sk_live_" + "F" * 43,
        "alg-none": ALG_NONE,
        "outsider": outsider_token(target, cache),
    }
    return Context(target, admin, ns, body["agent"]["id"], body["credentials"]["key_id"],
                   tokens)


def _intact(ctx: Context) -> dict[str, Any] | None:
    """The seed's state (API keys aside) if it is as seeded, else None."""
    try:
        state = snapshot(ctx, False)
    except (AssertionError, ValueError):  # unreadable: not intact either
        return None
    return state if _without_keys(state) == ctx.baseline else None


def _without_keys(state: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in state.items() if name != "keys"}


def snapshot(ctx: Context, with_keys: bool = True) -> dict[str, Any]:
    """Everything the seed stored, as the admin sees it (API keys are broker-wide, so only
    when asked)."""
    admin, ns = ctx.admin, ctx.ns
    entry = admin.get(f"/v1/namespaces/{ns}/memory/{SEED_KEY}")
    assert entry.status_code == 200, entry.text
    query = admin.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "*"}).json()
    history = admin.get(f"/v1/namespaces/{ns}/history/{SEED_KEY}").json()["versions"]
    agents = admin.get(f"/v1/namespaces/{ns}/agents").json()["agents"]
    config = admin.get(f"/v1/namespaces/{ns}/config").json()
    schemas = admin.get(f"/v1/namespaces/{ns}/schemas").json()
    return {
        "entry": entry.json(), "etag": entry.headers["etag"], "entries": query["entries"],
        "history": history, "agents": [(a["id"], a["name"], a["framework"]) for a in agents],
        "keys": api_keys(ctx) if with_keys else [], "config": config, "schemas": schemas,
    }


def api_keys(ctx: Context) -> list[str]:
    return sorted(k["id"] for k in ctx.admin.get("/v1/keys").json()["keys"])


# ---- sending ----


def _body(bad: Bad, ctx: Context) -> bytes | None:
    if bad.json is not _UNSET:
        return json.dumps(ctx.fill_json(bad.json)).encode()
    if bad.content is None:
        return None
    content = bad.content() if callable(bad.content) else bad.content
    return content.replace(b"{ns}", ctx.ns.encode())


def send(bad: Bad, ctx: Context) -> tuple[int, Any, dict[str, str]]:
    headers: dict[str, str | bytes] = {}
    token = ctx.tokens[bad.token]
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = _body(bad, ctx)
    if body is not None and bad.content_type is not None:
        headers["Content-Type"] = bad.content_type
    for name, value in bad.headers.items():
        headers[name] = ctx.fill(value) if isinstance(value, str) else value
    path = ctx.fill(bad.path)
    if bad.raw_path:
        return _send_raw(ctx.broker.url, bad.method, path, headers, body)
    content: bytes | Iterator[bytes] | None = body
    if bad.chunked and body is not None:
        content = iter([body[i:i + 1000] for i in range(0, len(body), 1000)])
    encoded = [(name.encode(), value if isinstance(value, bytes) else value.encode())
               for name, value in headers.items()]
    with httpx.Client(base_url=ctx.broker.url, timeout=30) as client, \
            client.stream(bad.method, path, content=content, headers=encoded) as response:
        if "%" not in path:
            sent = response.request.url.raw_path.split(b"?")[0]
            assert sent == path.split("?")[0].encode(), "httpx rewrote the path; use raw_path"
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response.status_code, None, dict(response.headers)  # an endless stream
        return response.status_code, _json(response.read()), dict(response.headers)


def _send_raw(url: str, method: str, path: str, headers: dict[str, str | bytes],
              body: bytes | None) -> tuple[int, Any, dict[str, str]]:
    """Send the request line exactly as written (no `.`/`..` resolution)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        sent = {name.lower() for name in headers}
        for name, value in headers.items():
            connection.putheader(name, value)
        if "content-length" not in sent:
            connection.putheader("Content-Length", str(len(body or b"")))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, _json(response.read()), dict(response.getheaders())
    finally:
        connection.close()


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        raise AssertionError(f"response is not JSON: {content[:300]!r}") from None


def assert_error_shape(payload: Any, status: int, code: str) -> None:
    assert isinstance(payload, dict), payload
    if payload.get("type") == "error":  # a protocol reply from /v1/messages
        assert payload["memp"] == "1.0"
    else:
        assert set(payload) == {"error"}, payload
    error = payload["error"]
    # HTTP error replies carry the request's id; a message's error reply does not.
    assert set(error) - {"request_id"} == {"code", "message", "details"}, error
    assert error["code"] == code, (status, error)
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], dict)


# ---- the catalogue ----


@pytest.mark.parametrize("bad", CATALOGUE)
def test_bad_request_is_refused_and_stored_data_is_intact(
    bad: Bad, broker: Broker, request: pytest.FixtureRequest,
    seeded: Callable[[Broker], Context],
) -> None:
    ctx = seeded(request.getfixturevalue("limited") if bad.limited else broker)
    with_keys = bad.path.startswith("/v1/keys")
    before = {**ctx.state, "keys": api_keys(ctx) if with_keys else []}
    status, payload, headers = send(bad, ctx)
    assert status != 500, payload
    assert status == bad.status, payload
    assert_error_shape(payload, status, bad.code)
    if status == 401:
        assert headers.get("www-authenticate", "").lower().startswith("bearer")
    after = snapshot(ctx, with_keys)
    assert after == before
    assert after["entry"]["value"] == SEED_VALUE and after["entry"]["version"] == 2
    ctx.state, ctx.checked = {**after, "keys": []}, True


@pytest.mark.parametrize(
    ("method", "path", "setting"),
    [
        P("POST", "/v1/agents", "max_registration_bytes", id="register"),
        P("POST", "/v1/keys", "max_key_creation_bytes", id="keys"),
        P("PUT", CONFIG, "max_config_bytes", id="config"),
        P("POST", "/amp/memories", "max_amp_body_bytes", id="amp-create"),
        P("POST", "/amp/memories/search", "max_amp_body_bytes", id="amp-search"),
        P("POST", "/amp/lifecycle/run", "max_amp_body_bytes", id="amp-lifecycle"),
    ],
)
def test_each_body_limit_is_its_setting(
    limited: Broker, seeded: Callable[[Broker], Context], method: str, path: str, setting: str
) -> None:
    """Bodies one byte over the configured limit are 413 naming that limit, not a built-in one."""
    ctx = seeded(limited)
    limit = LIMITS[setting]
    over = b'{"padding": "' + b"x" * (limit - len(b'{"padding": ""}') + 1) + b'"}'
    assert len(over) == limit + 1
    status, payload, _ = send(Bad(method, path, 413, "payload_too_large", content=over,
                                  headers={"X-AMP-Agent-ID": "gateway"}), ctx)
    assert status == 413, payload
    assert payload["error"]["details"] == {"limit": limit}
    status, payload, _ = send(Bad(method, path, 400, "invalid_request", content=over[1:],
                                  headers={"X-AMP-Agent-ID": "gateway"}), ctx)
    assert status != 413, payload


def test_catalogue_ids_are_unique() -> None:
    ids = [param.id for param in CATALOGUE]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})


# ---- batches: each message stands alone ----


def test_batch_with_bad_messages_applies_the_good_ones(
    broker: Broker, admin: httpx.Client, ns: str, outsider_tokens: dict[str, str]
) -> None:
    ctx = seed(broker, admin, ns, outsider_tokens)
    before = snapshot(ctx, with_keys=False)
    batch = [
        put_msg(key="batch/a", value="a"),
        put_msg(key="../x", value="bad key"),
        1,
        None,
        msg("memory.frobnicate", key="k"),
        put_msg(key="batch/ttl", ttl_seconds=-1),
        put_msg(key="batch/future", timestamp=10**15),
        put_msg(memp="2.0", key="batch/version"),
        put_msg(key=SEED_KEY, if_version=1),
        put_msg(key="batch/spoof", agent_id="{agent}"),
        msg("memory.get", key=SEED_KEY),
        put_msg(key="batch/b", value="b"),
    ]
    response = admin.post("/v1/messages", json=ctx.fill_json(batch))
    assert response.status_code == 200, response.text
    replies = response.json()
    assert [r["type"] for r in replies] == [
        "ack", "error", "error", "error", "error", "error", "error", "error", "error", "error",
        "result", "ack"]
    errors = [r for r in replies if r["type"] == "error"]
    assert [r["error"]["code"] for r in errors] == [
        "invalid_key", "invalid_request", "invalid_request", "invalid_request", "invalid_ttl",
        "invalid_timestamp", "invalid_request", "precondition_failed", "forbidden"]
    for reply in errors:
        assert_error_shape(reply, 400, reply["error"]["code"])
    assert replies[10]["entry"]["value"] == SEED_VALUE
    keys = [e["key"] for e in admin.get(f"/v1/namespaces/{ns}/memory",
                                        params={"pattern": "*"}).json()["entries"]]
    assert keys == ["batch/a", "batch/b", SEED_KEY]
    after = snapshot(ctx, with_keys=False)
    assert after["entry"] == before["entry"] and after["history"] == before["history"]


def test_batch_at_the_limit_is_applied_and_one_over_is_not(
    limited: Broker, ns: str, outsider_tokens: dict[str, str]
) -> None:
    size = LIMITS["max_batch"]
    with limited.client() as admin:
        ctx = seed(limited, admin, ns, outsider_tokens)
        at_limit = admin.post("/v1/messages", json=ctx.fill_json(
            [put_msg(key=f"batch/{i}", value=i) for i in range(size)]))
        assert at_limit.status_code == 200
        assert [r["type"] for r in at_limit.json()] == ["ack"] * size
        over = admin.post("/v1/messages", json=ctx.fill_json(
            [put_msg(key=f"over/{i}", value=i) for i in range(size + 1)]))
        assert over.status_code == 413
        assert over.json()["error"]["code"] == "payload_too_large"
        left = admin.get(f"/v1/namespaces/{ns}/memory", params={"pattern": "over/*"})
        assert left.json()["entries"] == []


# ---- values the broker must keep exactly ----


@pytest.mark.parametrize(
    "raw_value",
    [
        pytest.param(b"123456789012345678901234567890123456789", id="huge-integer"),
        pytest.param(b"-0.000000000000000000000000000001e-300", id="tiny-float"),
        pytest.param(b'"\\u0000 nul and \\ud83d\\ude00 emoji"', id="escaped-string"),
        pytest.param('"ünïcødé ✓ 🚀"'.encode(), id="raw-unicode"),
        pytest.param(b"[" * 63 + b"]" * 63, id="63-levels-the-deepest-value-a-put-takes"),
        pytest.param(b"null", id="null"),
    ],
)
def test_unusual_but_valid_values_round_trip(admin: httpx.Client, ns: str,
                                             raw_value: bytes) -> None:
    body = b'{"value": ' + raw_value + b"}"
    written = admin.put(f"/v1/namespaces/{ns}/memory/v", content=body,
                        headers={"Content-Type": JSON})
    assert written.status_code == 201, written.text
    got = admin.get(f"/v1/namespaces/{ns}/memory/v")
    assert got.status_code == 200
    assert got.json()["value"] == json.loads(raw_value)
    canonical = msgspec.json.encode(msgspec.json.decode(raw_value))  # compact, as stored
    assert b'"value":' + canonical + b"," in got.content


@pytest.mark.parametrize("digit", [pytest.param("\u00b2", id="superscript-two"),
                                   pytest.param("\u00b9", id="superscript-one")])
def test_non_ascii_digits_are_refused_not_a_500(admin: httpx.Client, ns: str,
                                                digit: str) -> None:
    """`'²'.isdigit()` holds but `int('²')` fails: such numbers are 400, never 500."""
    key = f"/v1/namespaces/{ns}/memory/k"
    assert admin.put(key, json={"value": 1}).status_code == 201
    latin1 = digit.encode("latin-1")
    for response in (
        admin.put(key, json={"value": 2}, headers={b"If-Match": latin1}),
        admin.delete(key, headers={b"If-Match": latin1}),
        admin.put(f"/v1/namespaces/{ns}/config", json={}, headers={b"If-Match": latin1}),
        admin.get(f"/v1/namespaces/{ns}/memory", params={"limit": digit}),
        admin.get(f"/v1/namespaces/{ns}/history/k", params={"limit": digit}),
        admin.get(f"/v1/namespaces/{ns}/agents", params={"limit": digit}),
        admin.delete(key, params={"timestamp": digit}),
    ):
        assert response.status_code == 400, (response.request.url, response.text)
        assert response.json()["error"]["code"] == "invalid_request"
    assert admin.get(key).json()["value"] == 1


@pytest.mark.parametrize("path", ["/", "/v1", "/v1/nope"])
def test_an_unknown_path_points_to_the_api_reference(broker: Broker, path: str) -> None:
    """A new user opening the broker's root (or any path it does not serve), with or without
    a token, is told where the API reference is."""
    for token in (None, ADMIN_KEY):
        with broker.client(token) as client:
            response = client.get(path)
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        # The console tells a missing route by this very message (docs/console.md).
        assert (error["code"], error["message"]) == ("not_found", "no such endpoint")
        assert error["details"] == {"api_reference": "/docs"}
