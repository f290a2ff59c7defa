"""Reading a request body as JSON, strictly."""

from __future__ import annotations

import json
from typing import Any

from flask import request

from phi_api.errors import InvalidJSONError, UnsupportedMediaTypeError

_JSON_TYPES = ("application/json",)


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def read_json_object(any_media_type: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, or the matching 4xx error.

    Accepts ``application/json`` (or no Content-Type at all); refuses other
    media types with 415 unless ``any_media_type`` (Ollama's API reads any
    body as JSON, and its clients rely on it). The body must be UTF-8, free
    of lone surrogates, NaN and Infinity, and an object at the top.
    """
    mimetype = request.mimetype
    if not any_media_type and mimetype and mimetype not in _JSON_TYPES and not mimetype.endswith("+json"):
        raise UnsupportedMediaTypeError(f"Content-Type must be application/json, got {mimetype}.")
    raw = request.get_data(cache=False)  # honours MAX_CONTENT_LENGTH (413)
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_constant=_reject_constant)
        # A lone surrogate escape (\ud800) parses, but is not text: reject it here
        # rather than fail later when the prompt is encoded.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeError:
        raise InvalidJSONError("The request body is not valid UTF-8 text.") from None
    except RecursionError:
        raise InvalidJSONError("The request body is nested too deeply.") from None
    except json.JSONDecodeError as exc:
        raise InvalidJSONError(f"The request body is not valid JSON (line {exc.lineno}, column {exc.colno}).") from None
    except ValueError:
        raise InvalidJSONError("The request body is not valid JSON (NaN and Infinity are not JSON numbers).") from None
    if not isinstance(body, dict):
        raise InvalidJSONError("The request body must be a JSON object.")
    return body
