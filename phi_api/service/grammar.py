"""Grammars for ONNX Runtime GenAI's guidance (llguidance)."""

from __future__ import annotations

import json
from typing import Any

# Fixed separators, the ones models write most: with free whitespace, small
# models pad with blanks until max_tokens runs out (measured with SmolLM2: tabs
# after the last key, forever), and with no blank at all they stray off the
# patterns they know and never close the object.
_COMPACT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def json_schema_grammar(schema: dict[str, Any]) -> tuple[str, str]:
    """The guidance for output matching ``schema``, as compact JSON (the schema's own
    ``x-guidance`` options win)."""
    return "json_schema", json.dumps({**schema, "x-guidance": {**_COMPACT, **schema.get("x-guidance", {})}})
