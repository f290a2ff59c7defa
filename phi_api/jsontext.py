"""How deeply a JSON value may nest: one bound for a request's body and for the JSON texts it carries (a schema given
as a string), checked without recursion so that no depth a client sends can exhaust the interpreter's stack."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from phi_api.errors import JSONNumberError

MAX_DEPTH = 256  # objects and arrays within each other; far past any schema or message list a client needs


def depth(value: Any) -> int:
    """How many objects and arrays lie within each other in ``value`` at its deepest (a scalar: 0)."""
    # One level at a time, keeping only the containers: a body of a million small items is walked in a tenth of the
    # time (and memory) a stack of every value with its level takes.
    level, containers = 0, [value] if isinstance(value, (dict, list)) else []
    while containers:
        level += 1
        if level > MAX_DEPTH:  # no need to look further
            return level
        containers = [child for item in containers for child in (item.values() if isinstance(item, dict) else item)
                      if isinstance(child, (dict, list))]
    return level


def too_deep(value: Any) -> bool:
    """Whether ``value`` nests past :data:`MAX_DEPTH`."""
    return depth(value) > MAX_DEPTH


def loads(text: str) -> Any:
    """``text`` as JSON; :class:`RecursionError` when it nests past :data:`MAX_DEPTH` (or past what the parser
    itself can read), which :data:`phi_api.web.foreign.FOREIGN` answers with a 400; ValueError when it is not JSON."""
    value = json.loads(text)
    if too_deep(value):
        raise RecursionError(f"nested more than {MAX_DEPTH} deep")
    return value


def strict_loads(text: str) -> Any:
    """``text`` as the JSON a request may be: as ``json.loads`` (ValueError, RecursionError), and
    :class:`phi_api.errors.JSONNumberError` for a number that is not finite (NaN, Infinity, 1e309), UnicodeError for
    a lone surrogate (``\\ud800`` parses, but is not text). Nesting and NUL are the caller's to check
    (:func:`too_deep`, :func:`holds_nul`)."""
    value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    # A pair is text (an emoji, escaped), a lone one is not: refused here, not when the prompt is encoded.
    if ("\\ud" in text or "\\uD" in text) and _SURROGATE_ESCAPE.search(text):
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    return value


def holds_nul(text: str) -> bool:
    """Whether the JSON ``text`` holds a NUL character (which the engine, reading C strings, cannot take)."""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None  # (the substring first: 50x faster)


def _reject_constant(name: str) -> Any:
    raise JSONNumberError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONNumberError(text)
    return value


# An escape in JSON text: a backslash after an even number of them (the others escape each other). Strict JSON
# holds no raw control character, and a backslash only within a string: so a text holds a NUL exactly when it holds
# the escape \u0000, and a lone surrogate only where it holds a surrogate's escape. Both found in C, no walk.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_SURROGATE_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F]")


SLICE = 256  # list items encoded in one call of the C encoder


def dumps_in_slices(value: Any, depth: int = 0) -> str:
    """``value`` as compact JSON (non-ASCII as it is), made in pieces: each call of the C encoder takes at most
    :data:`SLICE` items of a list below the top levels, so that a thread encoding a large answer gives the
    interpreter's lock back often (one call of the C encoder keeps it throughout)."""
    return "".join(_pieces(value, depth))


def _pieces(value: Any, depth: int) -> Any:
    if isinstance(value, dict):
        yield "{"
        for position, (name, item) in enumerate(value.items()):
            yield ("," if position else "") + _dumps(str(name)) + ":"
            yield from _pieces(item, depth + 1)
        yield "}"
    elif isinstance(value, (list, tuple)) and depth >= 3:  # deep lists (an answer's log-probabilities): in slices
        yield "["
        for start in range(0, len(value), SLICE):
            yield ("," if start else "") + _dumps(list(value[start:start + SLICE]))[1:-1]
        yield "]"
    elif isinstance(value, (list, tuple)):  # shallow lists (an answer's choices): item by item
        yield "["
        for position, item in enumerate(value):
            if position:
                yield ","
            yield from _pieces(item, depth + 1)
        yield "]"
    else:
        yield _dumps(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
