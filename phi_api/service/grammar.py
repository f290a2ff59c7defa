"""Grammars for constrained output (llguidance's JSON Schema support), checked before anything is generated."""

from __future__ import annotations

import json
from typing import Any

from llguidance import LLMatcher

from phi_api.errors import InvalidParameterError

# Fixed separators, the ones models write most: with free whitespace, small
# models pad with blanks until max_tokens runs out (measured with SmolLM2: tabs
# after the last key, forever), and with no blank at all they stray off the
# patterns they know and never close the object.
_COMPACT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
_MAX_REASON_CHARS = 300


def json_schema_grammar(schema: Any, param: str) -> tuple[str, str]:
    """The guidance for output matching ``schema`` (given as ``param``), as compact JSON (the schema's own
    ``x-guidance`` options win); 400 ``invalid_parameter`` if it is not a schema llguidance can compile."""
    check_json_schema(schema, param)
    options = schema.get("x-guidance", {}) if isinstance(schema, dict) else {}
    body = {**schema, "x-guidance": {**_COMPACT, **options}} if isinstance(schema, dict) else schema
    return "json_schema", json.dumps(body)


def check_json_schema(schema: Any, param: str) -> None:
    """400 ``invalid_parameter`` (with ``param``) unless ``schema`` compiles to a grammar.

    A schema the client got wrong (``{"type": "hiccup"}``) must be refused
    before a stream starts, not found by the engine once the answer is under way.
    """
    try:
        reason = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    except (ValueError, TypeError) as exc:  # not JSON Schema at all (llguidance raises for these)
        reason = str(exc)
    if reason:
        first_line = reason.strip().splitlines()[0] if reason.strip() else "invalid"
        raise InvalidParameterError(f"{param} is not a valid JSON Schema: {first_line[:_MAX_REASON_CHARS]}",
                                    param=param)
