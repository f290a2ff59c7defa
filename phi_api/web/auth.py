"""API keys (``API_KEYS``, ``API_KEYS_FILE``: :mod:`phi_api.limits.keys`): off unless keys are configured.

A key is read from ``X-API-Key``, ``Authorization: Bearer ...``, or the query
parameter ``api_key`` / ``api-key`` (unless ``ALLOW_QUERY_API_KEY`` is off:
proxies log query strings); a header wins over the query. Keys are compared
by their SHA-256 in constant time and never logged (request lines are logged
without their query string). Preflight ``OPTIONS``, ``GET /health``, the API's
description (``GET /openapi.json``) and the playground's page and files need no key.
"""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, g, request

from phi_api.errors import AuthenticationError, PermissionDeniedError
from phi_api.limits.keys import Key, Keys

EXEMPT_PATHS = frozenset({"/health", "/openapi.json", "/"})  # "/": the playground's page, which holds no data
EXEMPT_PREFIXES = ("/playground/",)  # its scripts and styles


def supplied_key(query: bool = True) -> str | None:
    """The key the request carries, if any (in its query string too when ``query``)."""
    header = request.headers.get("X-API-Key")
    if header:
        return header
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return (request.args.get("api_key") or request.args.get("api-key")) if query else None


def register_auth(app: Flask, keys: Keys, query: bool = True) -> None:
    """Require one of ``keys`` on every request but preflights and the health check; the request's key is
    ``g.api_key`` (see :func:`current_key`); ``query``: a key may come in the query string."""
    if not keys.keys:
        return

    @app.before_request
    def _authenticate() -> None:
        if request.method == "OPTIONS" or request.path in EXEMPT_PATHS or request.path.startswith(EXEMPT_PREFIXES):
            return
        supplied = supplied_key(query)
        if supplied is None:
            where = ", or the api_key query parameter" if query else " (this server takes no key in the query)"
            raise AuthenticationError("You didn't provide an API key. Send it in the X-API-Key or "
                                      f"Authorization: Bearer header{where}.")
        key = keys.identify(supplied)
        if key is None:
            raise AuthenticationError("Incorrect API key provided.")
        g.api_key = key


def current_key() -> Key | None:
    """The key the current request was authenticated with (None when keys are off)."""
    return g.get("api_key")


def is_admin() -> bool:
    """Whether the request may manage the server: an admin key's, or any request when keys are off (one user)."""
    key = current_key()
    return key is None or key.admin


def require_admin(action: str) -> None:
    """403 (before any work: the answer reveals nothing) unless :func:`is_admin`."""
    if not is_admin():
        raise PermissionDeniedError(f'Only an admin key ("admin": true in API_KEYS_FILE) may {action}.')


@dataclass(frozen=True)
class Tenant:
    """Whose request this is, for what it stores: the owner of what it creates (a key's name; "" without keys), and
    whose objects it may see (``scope``: one owner's, or None for every owner's: an admin key, or no keys)."""

    name: str
    scope: str | None


def current_tenant() -> Tenant:
    """The current request's tenant (see :class:`Tenant`)."""
    key = current_key()
    if key is None:
        return Tenant("", None)
    return Tenant(key.name, None if key.admin else key.name)
