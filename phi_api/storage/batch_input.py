"""A batch's input file read: each line's request (its ``custom_id`` and body), or what is wrong with it, in the
words and codes of OpenAI's Batch API. A file with any bad line makes a ``failed`` batch."""

from __future__ import annotations

import json
from typing import Any

MAX_LINES = 50_000  # lines of one batch, as OpenAI


def parse_lines(data: bytes, endpoint: str) -> tuple[list[tuple[str, dict]], list[dict[str, Any]]]:
    """An input file's requests as (custom_id, body), and its errors in OpenAI's form (empty when it is good)."""
    lines: list[tuple[str, dict]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    text = data.decode("utf-8", errors="replace").splitlines()
    for number, raw in enumerate(text, start=1):
        if not raw.strip():
            continue
        problem = _line_problem(raw, endpoint, seen)
        if isinstance(problem, tuple):
            lines.append(problem)
            seen.add(problem[0])
        else:
            errors.append({**problem, "line": number})
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None,
                       "line": None})
    if len(lines) > MAX_LINES:
        errors.append({"code": "too_many_requests", "message": f"A batch holds at most {MAX_LINES} requests.",
                       "param": None, "line": None})
    return lines, errors[:100]


def _line_problem(raw: str, endpoint: str, seen: set[str]) -> tuple[str, dict] | dict[str, Any]:
    """A line's (custom_id, body), or what is wrong with it."""
    try:
        item = json.loads(raw)
    except ValueError:
        return _problem("invalid_json_line", "This line is not JSON.", None)
    if not isinstance(item, dict):
        return _problem("invalid_json_line", "This line is not a JSON object.", None)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _problem("missing_custom_id", "Each request needs a custom_id (a string).", "custom_id")
    if custom_id in seen:
        return _problem("duplicate_custom_id", f"The custom_id '{custom_id}' is used twice.", "custom_id")
    if item.get("method") != "POST":
        return _problem("invalid_method", "The method must be POST.", "method")
    if item.get("url") != endpoint:
        return _problem("mismatched_endpoint", f"The url must be the batch's endpoint, {endpoint}.", "url")
    if not isinstance(item.get("body"), dict):
        return _problem("invalid_body", "The body must be a JSON object.", "body")
    return custom_id, item["body"]


def _problem(code: str, message: str, param: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param}
