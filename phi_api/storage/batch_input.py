"""A batch's input file read: each line's request (its ``custom_id``, ``url`` and body), or what is wrong with it, in
the words and codes of OpenAI's Batch API. A file with any bad line makes a ``failed`` batch.

The file is read a chunk at a time, never whole; a file's good lines are kept once (``storage.files``), and a batch
of another endpoint over the same lines is checked against their kept urls (:func:`endpoint_errors`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from phi_api import jsontext
from phi_api.errors import JSONNumberError

MAX_LINES = 50_000  # lines of one batch, as OpenAI
MAX_ERRORS = 100


@dataclass(frozen=True)
class Request:
    """A good line: its number in the file, ``custom_id``, ``url`` and body (as JSON text)."""

    line: int
    custom_id: str
    url: str
    body: str


def numbered_lines(chunks: Iterable[bytes], longest: int | None = None) -> Iterator[tuple[int, str | None]]:
    """The file's lines, numbered from 1, from its chunks (a line may span chunks). A line of more than ``longest``
    bytes comes as None: it is never decoded nor held whole (its bytes are dropped as they arrive), as one line of a
    100 MB file would otherwise take gigabytes to parse."""
    number, rest, dropped = 0, b"", False
    for chunk in chunks:
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for raw in parts:
            number += 1
            yield number, None if dropped else _text(raw, longest)
            dropped = False  # only the first part ends the line whose start was dropped
        if longest is not None and len(rest) > longest + 1:  # + 1: its "\r", when the "\n" is in the next chunk
            rest, dropped = b"", True
    if rest or dropped:
        yield number + 1, None if dropped else _text(rest, longest)


def _text(raw: bytes, longest: int | None) -> str | None:
    raw = raw.rstrip(b"\r")
    return None if longest is not None and len(raw) > longest else raw.decode("utf-8", errors="replace")


def read_requests(lines: Iterable[tuple[int, str | None]], errors: list[dict[str, Any]]) -> Iterator[Request]:
    """The good requests of ``lines`` (None: a line too long to read); what is wrong with the others is added to
    ``errors`` (OpenAI's form, the first :data:`MAX_ERRORS`), and so are an empty file and one of too many lines, once
    read to its end."""
    seen: set[str] = set()
    for number, raw in lines:
        if raw is not None and not raw.strip():
            continue
        found = _line_problem(raw, seen) if raw is not None else _problem(  # a code of OpenAI's: it has none for this
            "invalid_json_line", "This line is longer than a request body may be (MAX_REQUEST_SIZE_MB).", None)
        if isinstance(found, Request):
            seen.add(found.custom_id)
            if len(seen) <= MAX_LINES:
                yield Request(number, found.custom_id, found.url, found.body)
        elif len(errors) < MAX_ERRORS:
            errors.append({**found, "line": number})
    if not seen and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None,
                       "line": None})
    if len(seen) > MAX_LINES:
        errors.append({"code": "too_many_requests", "message": f"A batch holds at most {MAX_LINES} requests.",
                       "param": None, "line": None})


def endpoint_errors(urls: Iterable[tuple[int, str]], endpoint: str) -> list[dict[str, Any]]:
    """The lines (number, url) whose url is not the batch's ``endpoint``, as errors."""
    return [{**_problem("mismatched_endpoint", f"The url must be the batch's endpoint, {endpoint}.", "url"),
             "line": number} for number, url in urls if url != endpoint][:MAX_ERRORS]


def _line_problem(raw: str, seen: set[str]) -> Request | dict[str, Any]:
    """A line's request (numbered 0: the caller numbers it), or what is wrong with it."""
    try:  # as strict as a request's body (phi_api.web.bodies): what a live request may not send, a line may not
        item = jsontext.strict_loads(raw)
        if jsontext.too_deep(item):
            raise RecursionError
    except RecursionError:
        return _problem("invalid_json_line", f"This line nests more than {jsontext.MAX_DEPTH} levels deep.", None)
    except JSONNumberError:
        return _problem("invalid_json_line", "This line holds a number that is not finite (NaN, Infinity, or beyond "
                        "the range of a double).", None)
    except UnicodeError:
        return _problem("invalid_json_line", "This line holds a lone surrogate (\\ud800 to \\udfff), which is not "
                        "text.", None)
    except ValueError:
        return _problem("invalid_json_line", "This line is not JSON.", None)
    if jsontext.holds_nul(raw):
        return _problem("invalid_json_line", "This line holds a NUL character (\\u0000), which text may not contain.",
                        None)
    if not isinstance(item, dict):
        return _problem("invalid_json_line", "This line is not a JSON object.", None)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _problem("missing_custom_id", "Each request needs a custom_id (a string).", "custom_id")
    if custom_id in seen:
        return _problem("duplicate_custom_id", f"The custom_id '{custom_id}' is used twice.", "custom_id")
    if item.get("method") != "POST":
        return _problem("invalid_method", "The method must be POST.", "method")
    if not isinstance(item.get("url"), str):
        return _problem("mismatched_endpoint", "Each request needs the batch's endpoint as its url.", "url")
    if not isinstance(item.get("body"), dict):
        return _problem("invalid_body", "The body must be a JSON object.", "body")
    return Request(0, custom_id, item["url"], jsontext.dumps_in_slices(item["body"]))


def _problem(code: str, message: str, param: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param}
