"""What the answer must match, from any of the fields clients use to say it: OpenAI's ``response_format``, vLLM's
``structured_outputs`` (and its older ``guided_*`` fields), llama.cpp's ``grammar`` and ``json_schema``.

A JSON Schema stays a schema (the JSON path closes and compacts it, see :mod:`.grammar`); a regex, a list of
choices or a grammar (Lark or GBNF) becomes an llguidance grammar here, checked before anything is generated, so a
bad one gets a 400 at once and never reaches a slot. At most one of these fields may be given.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher, grammar_from

from phi_api import jsontext
from phi_api.engine.threads.native import off_hub
from phi_api.errors import InvalidJSONSchemaError, InvalidParameterError, UnsupportedParameterError
from phi_api.service.grammar import check_schema_size, reason_line, strict_violation

# vLLM's structured_outputs keys phi-api honours -> llguidance's format for them (json is a schema, apart)
_STRUCTURED = {"regex": "regex", "choice": "choice", "grammar": "grammar"}
# the older vLLM fields, and llama.cpp's
_FIELDS = {"guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar", "grammar": "grammar"}
_SCHEMA_FIELDS = ("guided_json", "json_schema")
# llguidance's compiler recurses from rule to rule: on a thread's 8 MB stack a chain of ~2,500 Lark rules overflows
# it and kills the process. A grammar of more definitions than this is refused (a full programming language's
# grammar holds a few hundred).
MAX_GRAMMAR_RULES = 500
# a definition's head at a line's start: Lark's "name:", "?name:", "NAME.2:", GBNF's "name ::="
_DEFINITION = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w-]*(?:\.-?\d+)?[ \t]*(?:::=|:)", re.MULTILINE)
_EMBEDDED_SCHEMA = re.compile(r"%json\s*")  # Lark's %json {schema}: a JSON Schema within the grammar


@dataclass(frozen=True)
class Grammar:
    """A grammar the answer must match: its llguidance definition, and the field it came from (for errors)."""

    definition: str
    param: str

    def guidance(self) -> tuple[str, str]:
        """What the engine takes: ``(kind, grammar)``."""
        return "llguidance", self.definition


def grammar(kind: str, text: Any, param: str) -> Grammar:
    """``text`` of ``kind`` (``regex``, ``choice``: a list of strings, ``grammar``: Lark or GBNF) compiled and
    checked; 400 ``invalid_parameter`` naming ``param`` when llguidance cannot compile it."""
    if kind == "choice" and not (isinstance(text, list) and text and all(isinstance(item, str) for item in text)):
        raise InvalidParameterError(f"{param} must be a non-empty list of strings.", param=param)
    if kind != "choice" and not (isinstance(text, str) and text.strip()):
        raise InvalidParameterError(f"{param} must be a non-empty string.", param=param)
    # measured and compiled on a pooled thread: a large grammar must not stall the worker's other requests on the hub
    definition, reason = off_hub(_compile, kind, json.dumps(text) if kind == "choice" else text, param)
    if reason:
        raise InvalidParameterError(f"{param} cannot be compiled: {reason_line(reason)}", param=param)
    return Grammar(definition, param)


def _check_grammar_size(text: str, param: str) -> None:
    """400 ``invalid_parameter`` when the grammar ``text`` defines more than :data:`MAX_GRAMMAR_RULES` rules, or
    embeds a JSON Schema (``%json``) that :func:`.grammar.check_schema_size` refuses."""
    if sum(1 for _ in _DEFINITION.finditer(text)) > MAX_GRAMMAR_RULES:
        raise InvalidParameterError(f"{param} defines more than {MAX_GRAMMAR_RULES} rules.", param=param)
    decoder = json.JSONDecoder()
    for found in _EMBEDDED_SCHEMA.finditer(text):
        try:
            schema, _ = decoder.raw_decode(text, found.end())
        except (ValueError, RecursionError):
            continue  # not JSON there: llguidance's compiler says what is wrong with it
        check_schema_size(schema, param)


def _compile(kind: str, text: str, param: str) -> tuple[str, str]:
    """llguidance's definition of ``text`` of ``kind``, and why it cannot be used ("" when it can), once
    :func:`_check_grammar_size` lets it try."""
    if kind == "grammar":
        _check_grammar_size(text, param)
    try:
        definition = grammar_from(kind, text)  # type: ignore[arg-type]
        return definition, LLMatcher.validate_grammar(definition)
    except (ValueError, TypeError) as exc:  # llguidance's words for a grammar it cannot read
        return "", str(exc) or type(exc).__name__


def constraint_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The answer's constraint from a chat or completion body, as request fields: ``output_schema`` and
    ``output_param`` for a JSON Schema, ``output_grammar`` for any other grammar; {} when free text."""
    found = _given_constraints(body)
    if len(found) > 1:
        raise InvalidParameterError(f"Only one of {', '.join(name for name, _ in found)} may be given: each "
                                    "constrains the whole answer.", param=found[1][0])
    if not found:
        return {}
    param, value = found[0]
    if param == "response_format":
        return output_fields(value)
    if param == "structured_outputs":
        return _structured_outputs(value)
    if param in _SCHEMA_FIELDS:
        return {"output_schema": _schema(value, param), "output_param": param}
    return {"output_grammar": grammar(_FIELDS[param], value, param)}


def _given_constraints(body: dict[str, Any]) -> list[tuple[str, Any]]:
    names = ["structured_outputs", *_FIELDS, *_SCHEMA_FIELDS]
    found = [(name, body[name]) for name in names if body.get(name) is not None]  # null: not given
    response_format = body.get("response_format") or {}
    if response_format.get("type", "text") != "text":
        found.insert(0, ("response_format", response_format))
    return found


def _structured_outputs(options: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``structured_outputs``: exactly one of ``json``, ``json_object``, ``regex``, ``choice``, ``grammar``."""
    unsupported = sorted(set(options) - {"json", "json_object", *_STRUCTURED})
    if unsupported:
        raise UnsupportedParameterError(f"structured_outputs.{unsupported[0]} is not supported (json, json_object, "
                                        "regex, choice and grammar are).", param=f"structured_outputs.{unsupported[0]}")
    chosen = [key for key, value in options.items() if value not in (None, False)]
    if len(chosen) != 1:
        raise InvalidParameterError("structured_outputs needs exactly one of json, json_object, regex, choice and "
                                    "grammar.", param="structured_outputs")
    key = chosen[0]
    param = f"structured_outputs.{key}"
    if key == "json":
        return {"output_schema": _schema(options[key], param), "output_param": param}
    if key == "json_object":
        return {"output_schema": {"type": "object"}, "output_param": param}
    return {"output_grammar": grammar(_STRUCTURED[key], options[key], param)}


def _schema(value: Any, param: str) -> dict[str, Any]:
    """A JSON Schema given as an object or as its JSON text (vLLM takes both)."""
    if isinstance(value, str):
        try:
            value = jsontext.loads(value)
        except RecursionError:
            raise InvalidParameterError(f"{param} is nested more than {jsontext.MAX_DEPTH} levels deep.",
                                        param=param) from None
        except ValueError:
            raise InvalidParameterError(f"{param} is not JSON: give a JSON Schema.", param=param) from None
    if not isinstance(value, dict):
        raise InvalidParameterError(f"{param} must be a JSON Schema object.", param=param)
    return value


def output_fields(response_format: dict[str, Any] | None) -> dict[str, Any]:
    """OpenAI's ``response_format`` as the schema the answer must match (any JSON object for ``json_object``)."""
    response_format = response_format or {"type": "text"}
    kind = response_format["type"]
    if kind == "json_object":
        return {"output_schema": {"type": "object"}, "output_param": "response_format"}
    if kind == "json_schema":
        spec = response_format["json_schema"]
        schema = spec.get("schema") or {"type": "object"}
        if spec.get("strict"):
            violation = off_hub(strict_violation, schema)  # it walks the whole schema
            if violation:
                raise InvalidJSONSchemaError(f"Invalid schema for response_format '{spec.get('name', '')}': "
                                             f"{violation}", param="response_format")
        return {"output_schema": schema, "output_param": "response_format.json_schema.schema"}
    return {}
