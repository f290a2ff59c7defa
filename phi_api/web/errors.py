"""Error responses: each protocol's renderer of the one error tree applied to everything a blueprint (or the app)
raises, everyone else's exceptions through :func:`phi_api.web.foreign.from_foreign`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from phi_api.errors import APIError
from phi_api.web.foreign import from_foreign

log = logging.getLogger("phi_api.errors")


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
