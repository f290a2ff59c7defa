"""Grammars for constrained output (llguidance's JSON Schema support), checked before anything is generated."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from llguidance import LLMatcher

from phi_api.engine.threads.native import off_hub
from phi_api.errors import InvalidParameterError

# Fixed separators, the ones models write most: with free whitespace, small
# models pad with blanks until max_tokens runs out (measured with SmolLM2: tabs
# after the last key, forever), and with no blank at all they stray off the
# patterns they know and never close the object.
_COMPACT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
_MAX_REASON_CHARS = 300
# llguidance's compiler recurses along a schema's nesting and through its references: on a thread's 8 MB stack a
# chain of ~1,000 referenced objects (~4,000 of the levels counted by schema_levels) overflows it and kills the
# process. Schemas are refused well before that: the longest such chain allowed is ~250 links, and it compiles
# (tests/service/test_grammar_limits.py).
MAX_SCHEMA_LEVELS = 1024
# Each pattern's complement is intersected with the others': 200 patterns take ~1 s of a core, 300 ~7 s.
MAX_PATTERN_PROPERTIES = 64
# The patterns one value must match at once (its own, its allOf branches', through references) are intersected, and
# llguidance's check that the intersection is not empty doubles in time with each: 19 took 0.3 s, 23 took 28 s,
# 27 ran for minutes and took gigabytes. 12 take ~10 ms (and are refused: it cannot tell); 8 are allowed.
MAX_PATTERNS_AT_ONCE = 8


def json_schema_grammar(schema: Any, param: str) -> tuple[str, str]:
    """The guidance for output matching ``schema`` (given as ``param``), as compact JSON (the schema's own
    ``x-guidance`` options win), with no keys the schema does not declare (:func:`closed`); 400
    ``invalid_parameter`` if it is not a schema llguidance can compile. Made in one hop to a pooled thread: each
    step copies or walks the whole schema."""
    return "json_schema", off_hub(_grammar_text, schema, param)


def _grammar_text(schema: Any, param: str) -> str:
    """:func:`json_schema_grammar`'s text, made on the thread that calls it."""
    schema = closed(schema)
    _refuse_uncompilable(schema, param)
    options = schema.get("x-guidance", {}) if isinstance(schema, dict) else {}
    body = {**schema, "x-guidance": {**_COMPACT, **options}} if isinstance(schema, dict) else schema
    return json.dumps(body)


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


def strict_violation(schema: Any) -> str | None:
    """Where ``schema`` breaks OpenAI's strict-mode rules, in OpenAI's words: every object that declares
    properties sets ``additionalProperties: false`` and lists every property in ``required``. None when it
    keeps them. A walk without recursion, each subschema's path linked to its parent's and spelled out only for a
    violation (a path built at every node made a deep schema's walk nodes x depth)."""
    stack: list[tuple[Any, Any]] = [(schema, None)]  # (subschema, its path: None, or (parent's path, part))
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((item, path) for item in reversed(node))
            continue
        if not isinstance(node, dict):
            continue
        broken = _broken_rule(node)
        if broken:
            return f"{_where(path)}, {broken}"
        children: list[tuple[Any, Any]] = []
        for key in (*_SUBSCHEMA_MAPS, *_SUBSCHEMA_LISTS):
            value = node.get(key)
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
            children += [(child, ((path, key), str(name))) for name, child in items]
        children += [(node.get(key), (path, key)) for key in _SUBSCHEMAS]
        stack.extend(reversed(children))
    return None


def _broken_rule(node: dict[str, Any]) -> str | None:
    """The strict-mode rule one object schema breaks, if any."""
    properties = node.get("properties")
    if not isinstance(properties, dict) or not properties:
        return None
    if node.get("additionalProperties") is not False:
        return "'additionalProperties' is required to be supplied and to be false."
    listed = node.get("required")
    required = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
    missing = next((name for name in properties if name not in required), None)  # (a set: a list made it N x N)
    if missing is None:
        return None
    return f"'required' is required to be supplied and to be an array including every key in properties. Missing " \
           f"'{missing}'."


def _where(path: Any) -> str:
    """OpenAI's ``In context=(...)`` for a linked path."""
    parts: list[str] = []
    while path is not None:
        path, part = path
        parts.append(part)
    parts.reverse()
    return f"In context=({', '.join(repr(part) for part in parts)}{',' if len(parts) == 1 else ''})"


def check_json_schema(schema: Any, param: str) -> None:
    """400 ``invalid_parameter`` (with ``param``) unless ``schema`` compiles to a grammar.

    A schema the client got wrong (``{"type": "hiccup"}``) must be refused
    before a stream starts, not found by the engine once the answer is under way. Its size is checked
    (:func:`check_schema_size`) and it is compiled on a pooled thread: both walk the whole schema, and a large one
    must not stall the worker's other requests on the hub.
    """
    off_hub(_refuse_uncompilable, schema, param)


def _refuse_uncompilable(schema: Any, param: str) -> None:
    """:func:`check_json_schema`, on the thread that calls it."""
    reason = _compile_reason(schema, param)
    if reason:
        raise InvalidParameterError(f"{param} is not a valid JSON Schema: {reason_line(reason)}", param=param)


def reason_line(reason: str) -> str:
    """llguidance's reason for refusing a grammar, as an error message quotes it: its first line, cut short."""
    return (reason.strip().splitlines()[0] if reason.strip() else "invalid")[:_MAX_REASON_CHARS]


def _compile_reason(schema: Any, param: str) -> str:
    """Why llguidance cannot compile ``schema`` ("" when it can), once :func:`check_schema_size` lets it try."""
    check_schema_size(schema, param)
    try:
        return LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(json.dumps(schema)))
    except (ValueError, TypeError) as exc:  # not JSON Schema at all (llguidance raises for these)
        return str(exc) or type(exc).__name__


def check_schema_size(schema: Any, param: str) -> None:
    """400 ``invalid_parameter`` when ``schema`` nests too deeply through its references (:func:`schema_levels`
    over :data:`MAX_SCHEMA_LEVELS`), holds more than :data:`MAX_PATTERN_PROPERTIES` patterns of property names,
    or asks one value to match more than :data:`MAX_PATTERNS_AT_ONCE` patterns: what llguidance could not compile
    within a thread's stack, or would take seconds (or minutes) of a core to. One walk of the schema serves all
    three."""
    survey = _survey(schema)
    if _levels(schema, survey) > MAX_SCHEMA_LEVELS:
        raise InvalidParameterError(f"{param} nests too deeply: its levels, counting each definition it references "
                                    f"at its own depth, pass {MAX_SCHEMA_LEVELS}.", param=param)
    if survey.patterns > MAX_PATTERN_PROPERTIES:
        raise InvalidParameterError(f"{param} has more than {MAX_PATTERN_PROPERTIES} patternProperties.",
                                    param=param)
    if _most_at_once(schema, survey.objects) > MAX_PATTERNS_AT_ONCE:
        raise InvalidParameterError(f"{param} asks one value to match more than {MAX_PATTERNS_AT_ONCE} patterns at "
                                    "once (a pattern and those of its allOf branches).", param=param)


def schema_levels(schema: Any) -> tuple[int, int]:
    """An upper bound of how deep a compiler recurses into ``schema``, and its count of ``patternProperties``
    keys. The bound is the schema's own nesting plus, for each local reference it holds (``#``, ``#/$defs/x``), one
    level and the nesting of what the reference points to: a path through the references meets each target once."""
    survey = _survey(schema)
    return _levels(schema, survey), survey.patterns


def patterns_at_once(schema: Any) -> int:
    """The most ``pattern``s one value of ``schema`` must match at once: a subschema's own, and those of its
    ``allOf`` branches and of what its local ``$ref`` points to, along every path (counted past
    :data:`MAX_PATTERNS_AT_ONCE` no further)."""
    return _most_at_once(schema, _survey(schema).objects)


class _Survey(NamedTuple):
    """What one walk of a schema finds (:func:`_survey`)."""

    heights: dict[int, int]  # every container's height (1 for one holding no container), by its id
    refs: set[str]  # the distinct ``$ref`` strings
    patterns: int  # the ``patternProperties`` keys
    objects: list[dict[str, Any]]  # every object (dict) in it


def _survey(schema: Any) -> _Survey:
    """Walk ``schema`` once, without recursion (it may nest as deep as the body's limit)."""
    survey = _Survey({}, set(), 0, [])
    patterns = 0
    stack: list[tuple[Any, bool]] = [(schema, False)]
    while stack:
        node, done = stack.pop()
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if done:
            survey.heights[id(node)] = 1 + max((survey.heights.get(id(child), 0) for child in children), default=0)
            continue
        if isinstance(node, dict):
            survey.objects.append(node)
            if isinstance(node.get("$ref"), str):
                survey.refs.add(node["$ref"])
            if isinstance(node.get("patternProperties"), dict):
                patterns += len(node["patternProperties"])
        stack.append((node, True))
        stack.extend((child, False) for child in children)
    return survey._replace(patterns=patterns)


def _levels(schema: Any, survey: _Survey) -> int:
    """:func:`schema_levels`' bound, from the schema's survey."""
    levels = survey.heights.get(id(schema), 0)
    for ref in survey.refs:
        target = _pointed(schema, ref)
        levels += 1 + (survey.heights.get(id(target), 0) if target is not None else 0)
    return levels


def _most_at_once(schema: Any, objects: list[dict[str, Any]]) -> int:
    """:func:`patterns_at_once` over the schema's ``objects`` (memoized across them)."""
    memo: dict[int, int] = {}
    most = 0
    for node in objects:
        most = max(most, _at_once(schema, node, memo))
        if most > MAX_PATTERNS_AT_ONCE:
            break
    return most


def _at_once(schema: Any, root: dict[str, Any], memo: dict[int, int]) -> int:
    """:func:`patterns_at_once` of ``root`` (memoized by id; a reference back to a subschema on the path counts 0)."""
    path: set[int] = set()
    stack: list[tuple[dict[str, Any], bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        branches, ref = node.get("allOf"), node.get("$ref")
        joined = [item for item in [*(branches if isinstance(branches, list) else ()),
                                    _pointed(schema, ref) if isinstance(ref, str) else None]
                  if isinstance(item, dict)]
        if done:
            path.discard(id(node))
            count = int("pattern" in node) + sum(memo.get(id(item), 0) for item in joined)
            memo[id(node)] = min(count, MAX_PATTERNS_AT_ONCE + 1)
        elif id(node) not in memo and id(node) not in path:
            path.add(id(node))
            stack.append((node, True))
            stack.extend((item, False) for item in joined)
    return memo.get(id(root), 0)


def _pointed(schema: Any, ref: str) -> Any:
    """What the local reference ``ref`` (a JSON Pointer after ``#``) points to in ``schema``; None if it points
    nowhere or is not local."""
    if not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
        return None
    node = schema
    for part in ref[2:].split("/") if len(ref) > 1 else ():
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isascii() and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node
