"""HTTP framing, in the blueprints' layer: reading a JSON body, SSE and NDJSON responses, error responses,
and the service's dependencies gathered from the app's resources."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Blueprint, Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from phi_api import jsontext
from phi_api.batch.runner import BATCH_LINE
from phi_api.engine.threads.native import off_hub
from phi_api.errors import (
    APIError,
    InvalidJSONError,
    InvalidParameterError,
    InvalidRequestError,
    JSONNumberError,
    UnsupportedMediaTypeError,
)
from phi_api.service import admission, generation
from phi_api.service.admission import Caller, Gate
from phi_api.service.generation import KEEPALIVE
from phi_api.service.requests import GenerationRequest
from phi_api.telemetry.logs import current_request_id
from phi_api.web.auth import current_key
from phi_api.web.foreign import from_foreign
from phi_api.web.resources import (
    get_caps,
    get_keys,
    get_limiter,
    get_line,
    get_metrics,
    get_models,
    get_settings,
    get_tracing,
    get_validator,
)
from phi_api.web.transport import read_body, streaming_response

log = logging.getLogger("phi_api.errors")

_JSON_TYPES = ("application/json",)
NDJSON_TYPE = "application/x-ndjson"


def gate() -> Gate:
    """The gate's dependencies, from the current app."""
    return Gate(get_models(), get_limiter(), get_settings(), get_keys(), get_caps(), get_line(), get_metrics(),
                get_tracing())


PRIORITY_HEADER = "X-Priority"
PRIORITY_RANGE = (-2**31, 2**31 - 1)


def start_generation(typed: GenerationRequest) -> generation.Run:
    """Start a typed request through the one gate (:func:`phi_api.service.admission.admit`) as this HTTP request's
    caller: its key, its id, its ``X-Priority`` header (for clients that cannot add a ``priority`` field; the field
    wins), its trace headers; a Batch API line (:mod:`phi_api.batch.runner`) as its batch's key."""
    caller = Caller(key=current_key(), request_id=current_request_id(), header_priority=header_priority(),
                    trace_headers=dict(request.headers) if get_tracing().provider is not None else {},
                    batch=bool(request.environ.get(BATCH_LINE)))
    g.rate_headers = caller.rate_headers  # filled by the gate; sent with the answer, whatever it is
    return admission.admit(gate(), caller, typed)


def count_request() -> None:
    """Count this request (an upload: not a generation) against its key's requests per minute, or refuse it (429,
    with the key's rate-limit headers)."""
    key = current_key()
    if key is not None:
        caller = Caller(key=key, request_id=current_request_id())
        g.rate_headers = caller.rate_headers
        admission.count_request(get_keys(), caller)


def header_priority() -> int | None:
    """The ``X-Priority`` header's integer (lower is sooner), if given; 400 if it is not one."""
    raw = request.headers.get(PRIORITY_HEADER)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or not PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1]:
        raise InvalidParameterError(f"The {PRIORITY_HEADER} header must be an integer from {PRIORITY_RANGE[0]} to "
                                    f"{PRIORITY_RANGE[1]} (lower is sooner).", param=PRIORITY_HEADER)
    return value


# Bodies ---------------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise JSONNumberError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONNumberError(text)
    return value


def _has_nul(body: Any) -> bool:
    """True if any key or string in ``body`` holds U+0000 (the engine reads C strings)."""
    pending = [body]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\0" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


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
        body = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        # A lone surrogate escape (\ud800) parses, but is not text: reject it here
        # rather than fail later when the prompt is encoded.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
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
    if _has_nul(body):
        raise InvalidRequestError("The request body holds a NUL character (\\u0000), which text may not contain.")
    return body


# Streams --------------------------------------------------------------------------------------------


def read_request(schema: str, any_media_type: bool = False) -> dict[str, Any]:
    """The request's JSON object, checked against the JSON Schema ``schema`` (a 400 naming what is wrong)."""
    body = read_json_object(any_media_type)
    get_validator().validate(schema, body)
    return body


def _compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def sse_response(events: Iterable[Any], on_close: Iterable[Callable[[], None]] = (), done: bool = True) -> Response:
    """A ``text/event-stream`` response of ``events`` (dicts, or ``KEEPALIVE``), ended by ``data: [DONE]`` (unless
    not ``done``: llama.cpp's own streams end with their last object).

    ``on_close`` callbacks run when the server closes the response, whether
    the stream finished, failed, or the client went away.
    """

    def body() -> Iterator[str]:
        for event in events:
            yield ": keepalive\n\n" if event is KEEPALIVE else "data: " + _compact(event) + "\n\n"
        if done:
            yield "data: [DONE]\n\n"

    return streaming_response(body(), "text/event-stream", get_settings().STREAM_WRITE_TIMEOUT, on_close)


def named_sse_response(events: Iterable[Any], on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """A ``text/event-stream`` response of named events: ``(name, data)`` pairs, written ``event: name`` then the
    data as JSON (how OpenAI's Responses API and Anthropic's Messages API stream), or ``KEEPALIVE``; no
    ``[DONE]`` at the end (those APIs end with an event of their own)."""

    def body() -> Iterator[str]:
        for event in events:
            if event is KEEPALIVE:
                yield ": keepalive\n\n"
            else:
                name, data = event
                yield f"event: {name}\ndata: {_compact(data)}\n\n"

    return streaming_response(body(), "text/event-stream", get_settings().STREAM_WRITE_TIMEOUT, on_close)


def ndjson_response(objects: Iterable[dict[str, Any]], on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """Newline-delimited JSON (Ollama's streams): one compact object per line."""
    lines = (_compact(item) + "\n" for item in objects)
    return streaming_response(lines, NDJSON_TYPE, get_settings().STREAM_WRITE_TIMEOUT, on_close)


def answer_json(run: generation.Run, build: Callable[[], Any],
                then: Callable[[Any], None] = lambda answer: None) -> Response:
    """A run's whole answer as JSON (``build`` makes it; ``then`` is given it, as stored responses keep it). One with
    log-probabilities may be large: it is built and encoded on a pooled thread, in slices
    (:func:`phi_api.jsontext.dumps_in_slices`), while the hub serves the worker's other streams; others are small,
    and encoded here."""
    if run.request.logprobs is None:
        answer = build()
        then(answer)
        return jsonify(answer)
    run.engine.token_bytes(0)  # the vocabulary's table loaded here first: the thread must not wait on the hub

    def encoded() -> tuple[Any, str]:
        answer = build()
        return answer, jsontext.dumps_in_slices(answer) + "\n"

    answer, text = off_hub(encoded)
    then(answer)
    return Response(text, mimetype="application/json")


# Errors ---------------------------------------------------------------------------------------------


def error_response(error: APIError, render: Callable[[APIError], dict[str, Any]]) -> Response:
    """``error`` as a response, its body written by ``render`` (the protocol's renderer)."""
    response = jsonify(render(error))
    response.status_code = error.status
    response.headers.update(error.headers)
    return response


def render_errors(target: Flask | Blueprint, render: Callable[[APIError], dict[str, Any]]) -> None:
    """Answer every exception raised while ``target`` serves a request in ``render``'s protocol: ours as they
    are, everyone else's through :func:`phi_api.web.foreign.from_foreign`, anything unexpected as a generic 500."""
    @target.errorhandler(APIError)
    def _api_error(error: APIError) -> Response:
        return error_response(error, render)

    @target.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        response = error_response(from_foreign(exc), render)
        allowed = getattr(exc, "valid_methods", None)  # MethodNotAllowed's
        if exc.code == 405 and allowed:
            response.headers["Allow"] = ", ".join(sorted(allowed))
        return response

    @target.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        error = from_foreign(exc)
        if error.status == 503:  # the database out of reach (web.foreign): an outage, one line per request
            log.warning("unavailable: %s", type(exc).__name__)
        elif error.status >= 500:
            log.exception("Unhandled error while serving the request")
        else:
            log.info("refused: %s: %s", type(exc).__name__, exc)  # the cause, for the log only
        return error_response(error, render)
