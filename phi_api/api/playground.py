"""GET /: the chat playground, a page served from the package (HTML, CSS, JavaScript; no CDN, no build step).

It holds no data and needs no key (it asks for one when the API does); a
strict Content-Security-Policy lets it load only its own files and talk only
to this server, and forbids inline scripts, so nothing a model writes can run.
Turned off with ``PLAYGROUND=false``: then ``/`` is a 404.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, send_from_directory

from phi_api.web.openapi import operation

FILES = Path(__file__).resolve().parent / "static" / "playground"  # the blueprint's own files
PREFIX = "/playground/"
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

bp = Blueprint("playground", __name__)


def _served(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@bp.get("/")
@operation("The chat playground (HTML)", media=("text/html",), statuses=(404,))
def page() -> Response:
    """The playground's page."""
    return _served(send_from_directory(FILES, "index.html", max_age=0))


@bp.get(PREFIX + "<path:name>")
@operation("The playground's scripts, styles and their licenses", media=("text/plain",), statuses=(404,))
def asset(name: str) -> Response:
    """One of the playground's files (404 for anything else)."""
    return _served(send_from_directory(FILES, name, max_age=300))
