"""API keys (``API_KEYS``): off unless keys are configured.

A key is read from ``X-API-Key``, ``Authorization: Bearer ...``, or the query
parameter ``api_key`` / ``api-key``; a header wins over the query. Keys are
compared in constant time and never logged (request lines are logged without
their query string). Preflight ``OPTIONS``, ``GET /health``, the API's
description (``GET /openapi.json``) and the playground's page and files need no key.
"""

from __future__ import annotations

import hmac

from flask import Flask, request

from phi_api.batchrunner import BATCH_LINE
from phi_api.errors import AuthenticationError

EXEMPT_PATHS = frozenset({"/health", "/openapi.json", "/"})  # "/": the playground's page, which holds no data
EXEMPT_PREFIXES = ("/playground/",)  # its scripts and styles


def supplied_key() -> str | None:
    """The key the request carries, if any."""
    header = request.headers.get("X-API-Key")
    if header:
        return header
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.args.get("api_key") or request.args.get("api-key")


def matches(supplied: str, keys: tuple[str, ...]) -> bool:
    """Whether ``supplied`` is one of ``keys``, comparing with every key in constant time."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(supplied.encode("utf-8"), key.encode("utf-8"))
    return found


def register_auth(app: Flask, keys: tuple[str, ...]) -> None:
    """Require one of ``keys`` on every request but preflights and the health check."""
    if not keys:
        return

    @app.before_request
    def _authenticate() -> None:
        if request.method == "OPTIONS" or request.path in EXEMPT_PATHS or request.path.startswith(EXEMPT_PREFIXES):
            return
        if request.environ.get(BATCH_LINE):  # a line of a batch an authenticated client created
            return
        supplied = supplied_key()
        if supplied is None:
            raise AuthenticationError("You didn't provide an API key. Send it in the X-API-Key or "
                                      "Authorization: Bearer header, or the api_key query parameter.")
        if not matches(supplied, keys):
            raise AuthenticationError("Incorrect API key provided.")
