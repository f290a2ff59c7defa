"""OpenAI's published schemas for the Responses API, to validate what the server sends against.

``tests/data/openai-responses-schemas.json`` holds the schemas reachable from ``Response`` and
``ResponseStreamEvent`` in OpenAI's OpenAPI document (github.com/openai/openai-openapi, ``openapi.json``),
with the prose taken out; its ``$comment`` names the commit. To refresh it from a newer document::

    python -m tests.support.openai_schemas path/to/openapi.json <commit>
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS_FILE = Path(__file__).resolve().parent.parent / "data" / "openai-responses-schemas.json"
ROOTS = ("Response", "ResponseStreamEvent")
_PROSE = {"description", "title", "example", "examples"}
_PREFIX = "#/components/schemas/"


def validate(name: str, instance: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` matches OpenAI's schema ``name``."""
    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(instance))
    if error is not None:
        raise error


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    document = json.loads(SCHEMAS_FILE.read_text(encoding="utf-8"))
    schema = {"$ref": f"#/$defs/{name}", "$defs": document["$defs"]}
    return jsonschema.Draft202012Validator(schema)


def extract(openapi: dict[str, Any], commit: str) -> dict[str, Any]:
    """The closure of :data:`ROOTS` in an OpenAPI document, as JSON Schema ``$defs`` (prose dropped)."""
    schemas = openapi["components"]["schemas"]
    kept: dict[str, Any] = {}
    pending = list(ROOTS)
    while pending:
        name = pending.pop()
        if name not in kept:
            kept[name] = _rewrite(schemas[name], pending)
    return {"$comment": f"From github.com/openai/openai-openapi openapi.json at {commit}; see "
                        "tests/support/openai_schemas.py", "$defs": dict(sorted(kept.items()))}


def _rewrite(node: Any, pending: list[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if (key in _PROSE and not isinstance(value, dict)) or key.startswith("x-"):
                continue
            if key == "$ref" and isinstance(value, str) and value.startswith(_PREFIX):
                pending.append(value[len(_PREFIX):])
                value = "#/$defs/" + value[len(_PREFIX):]
            out[key] = _rewrite(value, pending) if key != "properties" else {
                name: _rewrite(schema, pending) for name, schema in value.items()}
        return out
    if isinstance(node, list):
        return [_rewrite(item, pending) for item in node]
    return node


if __name__ == "__main__":
    source, commit = sys.argv[1], sys.argv[2]
    extracted = extract(json.loads(Path(source).read_text(encoding="utf-8")), commit)
    SCHEMAS_FILE.write_text(json.dumps(extracted, indent=None, separators=(",", ":")) + "\n", encoding="utf-8")
