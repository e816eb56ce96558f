"""The API reference page at /docs: openapi.yaml rendered to one HTML page on the server.

Nothing is fetched from elsewhere (no CDN, no script): the page and its stylesheet come from
the package, so it works offline and behind a strict Content-Security-Policy."""

from __future__ import annotations

import html
import re
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

# libyaml's safe loader where PyYAML was built with it: the same values, about ten times faster
# than the pure-Python one (openapi.yaml takes the latter a good part of a second).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_METHODS = ("get", "put", "post", "patch", "delete")
_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")
_LINK = re.compile(r"&lt;(https?://[^&\s]+)&gt;")


def _text(markdown: str | None) -> str:
    """The little Markdown the document uses: paragraphs, `code`, **bold**, <links>."""
    if not markdown:
        return ""
    paragraphs = []
    for block in re.split(r"\n\s*\n", markdown.strip()):
        escaped = html.escape(block)
        escaped = _CODE.sub(r"<code>\1</code>", escaped)
        escaped = _BOLD.sub(r"<strong>\1</strong>", escaped)
        escaped = _LINK.sub(r'<a href="\1">\1</a>', escaped)
        paragraphs.append(f"<p>{escaped}</p>")
    return "\n".join(paragraphs)


def _ref_name(node: Any) -> str:
    if isinstance(node, dict) and "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    if isinstance(node, dict) and "type" in node:
        return str(node["type"])
    return "—"


def _resolve(document: dict[str, Any], node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        target: Any = document
        for part in str(node["$ref"]).lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def _schema_link(node: Any) -> str:
    name = _ref_name(node)
    if isinstance(node, dict) and "$ref" in node:
        return f'<a href="#schema-{html.escape(name)}"><code>{html.escape(name)}</code></a>'
    return f"<code>{html.escape(name)}</code>"


def _operation(document: dict[str, Any], method: str, path: str, op: dict[str, Any],
               shared: list[Any]) -> str:
    anchor = html.escape(op.get("operationId", f"{method}-{path}"))
    parts = [f'<section class="op" id="{anchor}"><h3><span class="method {method}">'
             f'{method.upper()}</span> <span class="path">{html.escape(path)}</span></h3>',
             f"<p><strong>{html.escape(op.get('summary', ''))}</strong></p>",
             _text(op.get("description"))]
    sdk = op.get("x-sdk")
    if sdk:
        parts.append(f'<p class="sdk">SDK: Python <code>{html.escape(sdk["python"])}</code>, '
                     f'JavaScript <code>{html.escape(sdk["js"])}</code></p>')
    parameters = [_resolve(document, p) for p in [*shared, *op.get("parameters", [])]]
    if parameters:
        rows = "".join(
            f"<tr><td><code>{html.escape(p['name'])}</code></td><td>{html.escape(p['in'])}</td>"
            f"<td>{'yes' if p.get('required') else ''}</td>"
            f"<td>{_text(p.get('description'))}</td></tr>" for p in parameters)
        parts.append("<table><tr><th>parameter</th><th>in</th><th>required</th>"
                     f"<th>meaning</th></tr>{rows}</table>")
    body = op.get("requestBody")
    if body:
        body = _resolve(document, body)
        for media, content in body.get("content", {}).items():
            parts.append(f"<p>Body ({html.escape(media)}): "
                         f"{_schema_link(content.get('schema'))}</p>")
    responses = []
    for status, response in op.get("responses", {}).items():
        response = _resolve(document, response)
        schemas = ", ".join(_schema_link(c.get("schema"))
                            for c in response.get("content", {}).values())
        responses.append(f"<tr><td>{html.escape(str(status))}</td>"
                         f"<td>{_text(response.get('description'))}</td><td>{schemas}</td></tr>")
    if responses:
        parts.append("<table><tr><th>status</th><th>meaning</th><th>body</th></tr>"
                     f"{''.join(responses)}</table>")
    parts.append("</section>")
    return "\n".join(parts)


def _schema(name: str, schema: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(prop)}</code></td><td>{_schema_link(spec)}</td>"
        f"<td>{'yes' if prop in schema.get('required', []) else ''}</td>"
        f"<td>{_text(spec.get('description') if isinstance(spec, dict) else '')}</td></tr>"
        for prop, spec in schema.get("properties", {}).items())
    table = ("<table><tr><th>field</th><th>type</th><th>required</th><th>meaning</th></tr>"
             f"{rows}</table>") if rows else ""
    return (f'<section id="schema-{html.escape(name)}"><h3>{html.escape(name)}</h3>'
            f"{_text(schema.get('description'))}{table}</section>")


def load_document(text: str) -> Any:
    """A YAML document (openapi.yaml) as plain values, as `yaml.safe_load` reads it."""
    return yaml.load(text, Loader=_LOADER)


def render(text: str, stylesheet: str) -> str:
    """The whole page for an OpenAPI document."""
    document = load_document(text)
    info = document["info"]
    by_tag: dict[str, list[str]] = {t["name"]: [] for t in document.get("tags", [])}
    for path, item in document["paths"].items():
        for method in _METHODS:
            if method in item:
                op = item[method]
                tag = (op.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append(
                    _operation(document, method, path, op, item.get("parameters", [])))
    descriptions = {t["name"]: t.get("description") for t in document.get("tags", [])}
    sections = [f'<h2 id="tag-{html.escape(tag)}">{html.escape(tag)}</h2>'
                f"{_text(descriptions.get(tag))}{''.join(ops)}"
                for tag, ops in by_tag.items() if ops]
    schemas = document.get("components", {}).get("schemas", {})
    nav = " ".join(f'<a href="#tag-{html.escape(t)}">{html.escape(t)}</a>'
                   for t, ops in by_tag.items() if ops)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(info['title'])} API reference</title>"
        f"<style>{stylesheet}</style></head><body><header>"
        f"<h1>{html.escape(info['title'])} <small>{html.escape(str(info['version']))}</small>"
        f"</h1>{_text(info.get('summary'))}"
        '<p>The contract as data: <a href="/openapi.yaml">openapi.yaml</a>, '
        '<a href="/openapi.json">openapi.json</a>.</p>'
        f"<nav>{nav} <a href=\"#schemas\">schemas</a></nav></header><main>"
        f"{_text(info.get('description'))}{''.join(sections)}"
        '<h2 id="schemas">schemas</h2>'
        f"{''.join(_schema(n, s) for n, s in schemas.items() if isinstance(s, dict))}"
        "</main></body></html>")


@lru_cache(maxsize=1)
def page() -> bytes:
    package = resources.files("broker.web")
    text = package.joinpath("openapi.yaml").read_text()
    stylesheet = package.joinpath("static", "reference.css").read_text()
    return render(text, stylesheet).encode()
