"""Reading a request's JSON body: strict JSON (UTF-8, no NUL, no non-finite numbers, bounded nesting), an object at
the top, within ``REQUEST_READ_TIMEOUT``, then checked against its JSON Schema file."""

from __future__ import annotations

import json
from typing import Any

from flask import request

from phi_api import jsontext
from phi_api.errors import (
    InvalidJSONError,
    InvalidRequestError,
    JSONNumberError,
    UnsupportedMediaTypeError,
)
from phi_api.web.resources import get_settings, get_validator
from phi_api.web.transport import read_body

_JSON_TYPES = ("application/json",)


def read_json_object(any_media_type: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, or the matching 4xx error.

    Accepts ``application/json`` (or no Content-Type at all); refuses other
    media types with 415 unless ``any_media_type`` (Ollama's API reads any
    body as JSON, and its clients rely on it). The body must arrive within
    ``REQUEST_READ_TIMEOUT`` seconds (408), and must be UTF-8, free
    of lone surrogates, NUL characters and non-finite numbers (NaN, Infinity,
    1e309), and an object at the top.
    """
    mimetype = request.mimetype
    if not any_media_type and mimetype and mimetype not in _JSON_TYPES and not mimetype.endswith("+json"):
        raise UnsupportedMediaTypeError(f"Content-Type must be application/json, got {mimetype}.")
    raw = read_body(get_settings().REQUEST_READ_TIMEOUT)
    try:
        text = raw.decode("utf-8")
        body = jsontext.strict_loads(text)
    except UnicodeError:
        raise InvalidJSONError("The request body is not valid UTF-8 text.") from None
    except RecursionError:
        raise InvalidJSONError("The request body is nested too deeply.") from None
    except json.JSONDecodeError as exc:
        raise InvalidJSONError(f"The request body is not valid JSON (line {exc.lineno}, column {exc.colno}).") from None
    except JSONNumberError:
        raise InvalidJSONError("The request body holds a number that is not finite (NaN, Infinity, "
                               "or beyond the range of a double).") from None
    except ValueError:  # an integer literal longer than Python will convert
        raise InvalidJSONError("The request body holds a number that is too long.") from None
    if not isinstance(body, dict):
        raise InvalidJSONError("The request body must be a JSON object.")
    if jsontext.too_deep(body):
        raise InvalidJSONError(f"The request body is nested more than {jsontext.MAX_DEPTH} levels deep.")
    if jsontext.holds_nul(text):
        raise InvalidRequestError("The request body holds a NUL character (\\u0000), which text may not contain.")
    return body


def read_request(schema: str, any_media_type: bool = False) -> dict[str, Any]:
    """The request's JSON object, checked against the JSON Schema ``schema`` (a 400 naming what is wrong)."""
    body = read_json_object(any_media_type)
    get_validator().validate(schema, body)
    return body
