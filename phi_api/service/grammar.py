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
    ``x-guidance`` options win), with no keys the schema does not declare (:func:`closed`); 400
    ``invalid_parameter`` if it is not a schema llguidance can compile."""
    schema = closed(schema)
    check_json_schema(schema, param)
    options = schema.get("x-guidance", {}) if isinstance(schema, dict) else {}
    body = {**schema, "x-guidance": {**_COMPACT, **options}} if isinstance(schema, dict) else schema
    return "json_schema", json.dumps(body)


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedProperties", "unevaluatedItems")


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that declares its ``properties``
    and says nothing of others: the output never holds keys the schema does not declare, as OpenAI's structured
    outputs and vLLM's default grammar (xgrammar, strict) promise. A schema that allows other keys on purpose
    (``additionalProperties`` given, or an object without ``properties``, such as ``json_object``'s) keeps them."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = dict(schema)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(result.get(key), list):
            result[key] = [closed(item) for item in result[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(result.get(key), dict):
            result[key] = {name: closed(item) for name, item in result[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(result.get(key), dict):
            result[key] = closed(result[key])
    if isinstance(result.get("properties"), dict) and "additionalProperties" not in result:
        result["additionalProperties"] = False
    return result


def strict_violation(schema: Any, context: tuple[str, ...] = ()) -> str | None:
    """Where ``schema`` breaks OpenAI's strict-mode rules, in OpenAI's words: every object that declares
    properties sets ``additionalProperties: false`` and lists every property in ``required``. None when it
    keeps them."""
    if isinstance(schema, list):
        return next(filter(None, (strict_violation(item, context) for item in schema)), None)
    if not isinstance(schema, dict):
        return None
    where = f"In context=({', '.join(repr(part) for part in context)}{',' if len(context) == 1 else ''})"
    properties = schema.get("properties")
    if isinstance(properties, dict) and properties:
        if schema.get("additionalProperties") is not False:
            return f"{where}, 'additionalProperties' is required to be supplied and to be false."
        required = schema.get("required")
        if not isinstance(required, list):
            required = []
        missing = [name for name in properties if name not in required]
        if missing:
            return (f"{where}, 'required' is required to be supplied and to be an array including every key in "
                    f"properties. Missing '{missing[0]}'.")
    for key in (*_SUBSCHEMA_MAPS, *_SUBSCHEMA_LISTS):
        value = schema.get(key)
        children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for name, child in children:
            found = strict_violation(child, (*context, key, str(name)))
            if found:
                return found
    for key in _SUBSCHEMAS:
        found = strict_violation(schema.get(key), (*context, key))
        if found:
            return found
    return None


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
