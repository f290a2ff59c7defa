"""Error responses: each protocol's renderer of the one error tree applied to everything a blueprint (or the app)
raises, everyone else's exceptions through :func:`phi_api.web.foreign.from_foreign`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
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


RENDERERS = "phi_api.renderers"  # app.extensions: each blueprint's renderer, by the blueprint's name


def render_errors(target: Flask | Blueprint, render: Callable[[APIError], dict[str, Any]]) -> None:
    """Answer every exception raised while ``target`` serves a request in ``render``'s protocol: ours as they
    are, everyone else's through :func:`phi_api.web.foreign.from_foreign`, anything unexpected as a generic 500.
    A method a route does not take is refused before any blueprint serves it: in the protocol of the blueprint whose
    route it is (:func:`_owner_s`)."""
    if isinstance(target, Blueprint):
        name = target.name
        target.record_once(lambda state: state.app.extensions.setdefault(RENDERERS, {}).__setitem__(name, render))

    @target.errorhandler(APIError)
    def _api_error(error: APIError) -> Response:
        return error_response(error, render)

    @target.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        allowed = getattr(exc, "valid_methods", None)  # MethodNotAllowed's
        response = error_response(from_foreign(exc), _owner_s(allowed) or render if allowed else render)
        if exc.code == 405 and allowed:
            response.headers["Allow"] = ", ".join(sorted(allowed))
        return response

    @target.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        return error_response(logged(exc), render)


def logged(exc: Exception) -> APIError:
    """``exc`` as a member of the error tree (:func:`from_foreign`); anyone else's logged: a traceback for a fault
    of ours, one line for an outage or a refusal."""
    error = from_foreign(exc)
    if isinstance(exc, APIError):  # ours: its message is its whole story
        return error
    if error.status == 503:  # the database out of reach (web.foreign): an outage, one line per request
        log.warning("unavailable: %s", type(exc).__name__)
    elif error.status >= 500:
        log.error("Unhandled error while serving the request", exc_info=(type(exc), exc, exc.__traceback__))
    else:
        log.info("refused: %s: %s", type(exc).__name__, exc)  # the cause, for the log only
    return error


def _owner_s(allowed: list[str]) -> Callable[[APIError], dict[str, Any]] | None:
    """The renderer of the blueprint whose route this request's path is (with a method it takes), if it has one."""
    try:
        endpoint, _ = current_app.url_map.bind_to_environ(request.environ).match(method=sorted(allowed)[0])
    except HTTPException:
        return None
    return current_app.extensions.get(RENDERERS, {}).get(str(endpoint).rpartition(".")[0])

