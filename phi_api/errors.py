"""One error shape for the whole API.

Every failure a client can see is an :class:`APIError` (or is turned into one
by the handlers registered here) and is rendered by :func:`error_body` as
OpenAI's error object::

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

The tree, with the rows of the specification's error table:

- ``APIError`` (500 ``server_error`` / ``internal_error``)
  - ``InvalidRequestError`` (400 ``invalid_request_error``)
    - ``InvalidParameterError`` (``invalid_parameter``, param: the parameter)
    - ``MissingParameterError`` (``missing_parameter``, param: the parameter)
    - ``InvalidMessagesError`` (``invalid_messages``, param: ``messages``)
    - ``ContextLengthExceededError`` (``context_length_exceeded``)
    - ``UnsupportedParameterError`` (``unsupported_parameter``: valid, but not something this server can do)
    - ``InvalidJSONError`` (``invalid_json``)
    - ``ModelNotFoundError`` (404 ``model_not_found``, param ``model``)
    - ``RouteNotFoundError`` (404 ``not_found``)
    - ``MethodNotAllowedError`` (405 ``method_not_allowed``)
    - ``RequestTooLargeError`` (413 ``request_too_large``)
    - ``UnsupportedMediaTypeError`` (415 ``unsupported_media_type``)
    - ``RequestTimeoutError`` (408 ``request_timeout``: the body did not arrive in time)
    - ``URITooLongError`` (414 ``uri_too_long``) and ``HeadersTooLargeError``
      (431 ``headers_too_large``): answered by the gunicorn worker itself
    - ``AuthenticationError`` (401 ``invalid_api_key``)
  - ``RateLimitError`` (429 ``rate_limit_error`` / ``rate_limit_exceeded``, with ``Retry-After``)
  - ``ClientClosedRequestError`` (499 ``client_closed_request``: the client left before
    its answer was ready; never seen by it, only logged)
  - ``InternalError`` (500 ``internal_error``, generic message only)
  - ``GenerationTimeoutError`` (504 ``timeout``)
  - ``ServiceUnavailableError`` (503 ``unavailable``: the worker is shutting down)
  - ``ModelLoadingError`` (500 ``model_loading_failed``; start-up only, logged)
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from flask import Flask, Response, current_app, has_request_context, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)

GENERIC_SERVER_ERROR = "The server had an error while processing your request."


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object, with its fields in OpenAI's order."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """Base of the tree: an error with an HTTP status and OpenAI's error fields."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = "internal_error"
    default_param: ClassVar[str | None] = None
    headers: ClassVar[dict[str, str]] = {}  # sent with the error response

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param if param is not None else self.default_param

    def body(self) -> dict[str, Any]:
        """This error as the OpenAI error object."""
        return error_body(self.message, self.type, self.param, self.code)


class InvalidRequestError(APIError):
    status = 400
    type = "invalid_request_error"
    code = None


class InvalidParameterError(InvalidRequestError):
    code = "invalid_parameter"


class MissingParameterError(InvalidRequestError):
    code = "missing_parameter"


class InvalidMessagesError(InvalidRequestError):
    code = "invalid_messages"
    default_param = "messages"


class ContextLengthExceededError(InvalidRequestError):
    code = "context_length_exceeded"


class UnsupportedParameterError(InvalidRequestError):
    code = "unsupported_parameter"


class InvalidJSONError(InvalidRequestError):
    code = "invalid_json"


class ModelNotFoundError(InvalidRequestError):
    status = 404
    code = "model_not_found"
    default_param = "model"


class RouteNotFoundError(InvalidRequestError):
    status = 404
    code = "not_found"


class MethodNotAllowedError(InvalidRequestError):
    status = 405
    code = "method_not_allowed"


class RequestTooLargeError(InvalidRequestError):
    status = 413
    code = "request_too_large"


class UnsupportedMediaTypeError(InvalidRequestError):
    status = 415
    code = "unsupported_media_type"


class RequestTimeoutError(InvalidRequestError):
    status = 408
    code = "request_timeout"


class URITooLongError(InvalidRequestError):
    status = 414
    code = "uri_too_long"


class HeadersTooLargeError(InvalidRequestError):
    status = 431
    code = "headers_too_large"


class AuthenticationError(InvalidRequestError):
    status = 401
    code = "invalid_api_key"


class RateLimitError(APIError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    headers = {"Retry-After": "1"}  # slots free up as generations end: seconds, not minutes


class ClientClosedRequestError(APIError):
    status = 499  # nginx's "client closed request"
    type = "invalid_request_error"
    code = "client_closed_request"


class InternalError(APIError):
    def __init__(self, message: str = GENERIC_SERVER_ERROR) -> None:
        super().__init__(message)


class GenerationTimeoutError(APIError):
    status = 504
    code = "timeout"


class ServiceUnavailableError(APIError):
    status = 503
    code = "unavailable"


class ModelLoadingError(APIError):
    code = "model_loading_failed"

    def __init__(self, path: str, cause: str) -> None:
        super().__init__(f"Failed to load model from {path}: {cause}")


def plain_error_body(message: str) -> dict[str, Any]:
    """The error shape of Ollama's API: ``{"error": "message"}``."""
    return {"error": message}


def wants_plain_errors() -> bool:
    """Whether the current request belongs to a blueprint that speaks Ollama's error shape."""
    if not has_request_context() or request.blueprint is None:
        return False
    return getattr(current_app.blueprints.get(request.blueprint), "plain_errors", False)


def api_error_response(error: APIError) -> Response:
    """A Flask response carrying ``error`` in the shape of the API the request belongs to."""
    response = jsonify(plain_error_body(error.message) if wants_plain_errors() else error.body())
    response.status_code = error.status
    response.headers.update(error.headers)
    return response


def _from_http_exception(exc: HTTPException) -> APIError:
    """Werkzeug's routing and body errors, as members of the tree."""
    status = exc.code or 500
    if status == 404:
        return RouteNotFoundError("Unknown route; see GET /v1/models for the API's base path.")
    if status == 405:
        return MethodNotAllowedError(f"Method not allowed; allowed: {', '.join(sorted(exc.valid_methods or []))}.")
    if status == 413:
        return RequestTooLargeError("The request body is larger than the server accepts (MAX_REQUEST_SIZE_MB).")
    if status == 400:
        return InvalidJSONError("The request body could not be read as JSON.")
    if status < 500:
        error = InvalidRequestError(exc.description or "Invalid request.")
        error.status = status
        return error
    return InternalError()


def protocol_error(status: int) -> APIError:
    """The error for a request gunicorn refused before the app saw it (a bad request line or headers)."""
    if status == 414:
        return URITooLongError("The request line is longer than the server accepts.")
    if status == 431:
        return HeadersTooLargeError("The request headers are larger or more numerous than the server accepts.")
    if status == 500:
        return InternalError()
    error = InvalidRequestError("The request is not valid HTTP/1.1, or uses a part of it this server refuses.")
    error.status = status
    return error


def register_error_handlers(app: Flask) -> None:
    """Turn every exception into the error object: API errors, HTTP errors and crashes."""

    @app.errorhandler(APIError)
    def _api_error(error: APIError) -> Response:
        return api_error_response(error)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        response = api_error_response(_from_http_exception(exc))
        if exc.code == 405 and getattr(exc, "valid_methods", None):
            response.headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return response

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("Unhandled error while serving the request")
        return api_error_response(InternalError())
