"""broker/web/reference.py: the API reference page at /docs."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.support.brokers import Broker, load_yaml

DOCUMENT = load_yaml((Path(__file__).resolve().parents[2] / "openapi.yaml").read_text())


def test_the_reference_page_shows_every_operation_and_loads_nothing_else(
        broker: Broker) -> None:
    response = httpx.get(f"{broker.url}/docs", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    page = response.text
    for item in DOCUMENT["paths"].values():
        for method, operation in item.items():
            if method in ("get", "put", "post", "patch", "delete"):
                assert f'id="{operation["operationId"]}"' in page, operation["operationId"]
    for name in DOCUMENT["components"]["schemas"]:
        assert f'id="schema-{name}"' in page, name
    # Nothing is loaded from anywhere: no scripts, no stylesheets or images by URL.
    assert "<script" not in page and not re.search(r"\ssrc=", page)
    assert "<link" not in page


def test_the_reference_page_escapes_what_it_shows(broker: Broker) -> None:
    page = httpx.get(f"{broker.url}/docs", timeout=10).text
    # Descriptions mention `<cursor>`-like text and HTML-looking values; none becomes markup.
    assert "<cursor>" not in page
    assert page.count("<html") == 1
