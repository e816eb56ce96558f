"""A corrupt stored record is a clear error naming it (broker/storage/records.py), over real
HTTP on both stores: an entry, an AMP index record and a namespace configuration that cannot be
decoded answer the error shape with the record named, and the broker goes on serving."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from broker.storage import layout
from tests.conftest import BACKENDS, Broker
from tests.test_amp_support import Amp, amp_broker, sync_redis


@pytest.fixture(params=BACKENDS)
def amp(request: pytest.FixtureRequest, broker_factory: Callable[..., Broker],
        ns: str) -> Any:
    with amp_broker(broker_factory, request.param, ns) as client:
        yield client


def corrupt_error(response: httpx.Response, what: str) -> None:
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "internal"
    assert "corrupt" in error["message"] and what in error["message"], error


def test_corrupt_records_are_named_not_a_bare_500(amp: Amp, redis_url: str, ns: str) -> None:
    cell = amp.create("kept safe")
    other = f"{ns}-data"
    assert amp.http.put(f"/v1/namespaces/{other}/memory/k", json={"value": 1}).status_code \
        == 201
    client = sync_redis(amp, redis_url)
    try:
        client.hset(layout.amp_cell(ns, cell["id"]), "ref", "not-a-number")
        client.hset(layout.entry(other, "k"), "ver", "x1")
        client.set(layout.config(f"{ns}-conf"), b"{not json")
    finally:
        client.close()
    corrupt_error(amp.get(cell["id"]), cell["id"])
    corrupt_error(amp.http.get(f"/v1/namespaces/{other}/memory/k"), f"{other}/k")
    corrupt_error(amp.http.get(f"/v1/namespaces/{ns}-conf/config"), f"{ns}-conf")
    assert amp.http.get("/healthz").status_code == 200
    assert amp.http.put(f"/v1/namespaces/{other}/memory/fine", json={"value": 2}
                        ).status_code == 201
