"""The OpenAPI 3.1 document, generated from the JSON Schema files and the app's routes.

Request bodies are the files in ``schemas/`` (OpenAPI 3.1 speaks JSON Schema
2020-12), bundled into ``components/schemas`` with their ``$ref``s rewritten.
Every route is described by its view (:func:`operation`); building the document fails otherwise.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask

from phi_api.version import __version__
from phi_api.web.schemas import REQUEST_SCHEMAS, SCHEMA_DIR

JSON = "application/json"
_PATH_PARAMETER = re.compile(r"<(?:[a-z]+:)?(\w+)>")  # Flask's <path:model> is OpenAPI's {model}


SSE = "text/event-stream"
NDJSON = "application/x-ndjson"
GENERATION_STATUSES = (400, 401, 404, 405, 408, 413, 415, 429, 500, 503, 504)


@dataclass(frozen=True)
class Operation:
    """What the document says about one endpoint."""

    summary: str
    request: str | None = None  # request schema name (see REQUEST_SCHEMAS)
    media: tuple[str, ...] = (JSON,)  # success media types
    errors: str = "openai"  # "openai" (the error object), "ollama" ({"error": "..."}) or "health" ({"status": ...})
    statuses: tuple[int, ...] = (400, 401, 404, 405, 413, 415)
    query: tuple[tuple[str, str, str], ...] = ()  # (name, JSON type, description) of each query parameter


PAGE_QUERY = (("after", "string", "the id after which the page starts"),
              ("limit", "integer", "how many items, from 1 to the route's most (20 by default)"),
              ("order", "string", "asc or desc (the default)"))  # OpenAI's cursor pages (web.paging)


def operation(summary: str, **details: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Describe the view it decorates (put it under the route decorators): :class:`Operation`'s fields."""

    def describe(view: Callable[..., Any]) -> Callable[..., Any]:
        view.openapi = Operation(summary, **details)  # type: ignore[attr-defined]
        return view

    return describe


_ERROR_SCHEMAS = {
    "openai": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
        }},
    },
    "ollama": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "anthropic": {"type": "object", "required": ["type", "error"], "properties": {
        "type": {"const": "error"},
        "error": {"type": "object", "required": ["type", "message"],
                  "properties": {"type": {"type": "string"}, "message": {"type": "string"}}},
    }},
    "rerank": {"type": "object", "required": ["message", "error"], "properties": {
        "message": {"type": "string"}, "error": {"$ref": "#/components/schemas/OpenAIError/properties/error"}}},
    "health": {"type": "object", "required": ["status"], "properties": {"status": {"enum": ["starting", "draining"]}}},
}
_ERROR_COMPONENTS = {"openai": "OpenAIError", "ollama": "OllamaError", "anthropic": "AnthropicError",
                     "rerank": "RerankError", "health": "HealthUnavailable"}


_SUCCESS_SCHEMAS: dict[str, Any] = {
    JSON: {"type": "object"},
    # One event of the stream (OpenAPI 3.1 has no itemSchema yet; tools read the schema per event):
    # its data is a chunk as JSON, an error object, or the closing "[DONE]".
    "text/event-stream": {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string", "contentMediaType": "application/json"},
                       "event": {"type": "string"}},
    },
}


def bundle(schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    """Every schema file's request schema and ``$defs``, as OpenAPI components with rewritten references."""
    components: dict[str, Any] = {}
    for path in sorted(schema_dir.glob("*.json")):
        name = path.stem
        schema = json.loads(path.read_text(encoding="utf-8"))
        for key, definition in schema.pop("$defs", {}).items():
            components[f"{name}.{key}"] = _rewrite(definition, name)
        if name in REQUEST_SCHEMAS:
            schema.pop("$schema", None)
            schema.pop("$id", None)
            components[name] = _rewrite(schema, name)
    return components


def _rewrite(node: Any, current: str) -> Any:
    if isinstance(node, dict):
        out = {key: _rewrite(value, current) for key, value in node.items()}
        reference = out.get("$ref")
        if isinstance(reference, str):
            document, _, pointer = reference.partition("#")
            owner = document.removesuffix(".json") if document else current
            out["$ref"] = f"#/components/schemas/{owner}.{pointer.removeprefix('/$defs/')}"
        return out
    if isinstance(node, list):
        return [_rewrite(item, current) for item in node]
    return node


def build(app: Flask) -> dict[str, Any]:
    """The OpenAPI document for ``app``; raises if a route's view has no :func:`operation`."""
    schemas = bundle()
    schemas.update({_ERROR_COMPONENTS[kind]: schema for kind, schema in _ERROR_SCHEMAS.items()})
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if rule.endpoint == "static":
            continue
        described_by = getattr(app.view_functions[rule.endpoint], "openapi", None)
        if described_by is None:
            raise LookupError(f"{rule.endpoint} ({rule.rule}) has no @operation: describe it for /openapi.json")
        path = _PATH_PARAMETER.sub(r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            described = _operation(described_by, rule.endpoint, method)
            parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                          for name in sorted(rule.arguments)]
            parameters += [{"name": name, "in": "query", "required": False, "schema": {"type": kind},
                            "description": description} for name, kind, description in described_by.query]
            if parameters:
                described["parameters"] = parameters
            paths.setdefault(path, {})[method.lower()] = described
    return {
        "openapi": "3.1.0",
        "info": {"title": "phi-api", "version": __version__,
                 "description": "OpenAI-compatible inference server on ONNX Runtime GenAI (CPU)."},
        "paths": paths,
        "components": {
            "schemas": copy.deepcopy(schemas),
            "securitySchemes": {
                "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKeyQuery": {"type": "apiKey", "in": "query", "name": "api_key"},
            },
        },
    }


def _operation(operation: Operation, endpoint: str, method: str) -> dict[str, Any]:
    error = {"$ref": "#/components/schemas/" + _ERROR_COMPONENTS[operation.errors]}
    responses: dict[str, Any] = {"200": {"description": "Success", "content": {
        media: {"schema": _SUCCESS_SCHEMAS.get(media, {"type": "string"})} for media in operation.media}}}
    for status in operation.statuses:
        responses[str(status)] = {"description": "Error", "content": {JSON: {"schema": error}}}
    described: dict[str, Any] = {"operationId": f"{endpoint}.{method.lower()}", "summary": operation.summary,
                                 "responses": responses}
    if operation.request:
        described["requestBody"] = {"required": True, "content": {JSON: {
            "schema": {"$ref": f"#/components/schemas/{operation.request}"}}}}
    return described
