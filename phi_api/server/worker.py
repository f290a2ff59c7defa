"""phi-api's gunicorn worker: gunicorn's gevent worker, speaking the API's error shape.

gunicorn answers requests it cannot parse (an overlong request line, too many
or too large headers, broken HTTP) itself, before the app sees them, with an
HTML page. This worker sends OpenAI's error object instead, and treats a
stream whose client stopped reading (a write that timed out, see
:mod:`phi_api.web.transport`) as a client that went away, not as a server error.
"""

from __future__ import annotations

import json
import logging
import uuid
from http import HTTPStatus
from typing import Any

from gunicorn.workers.ggevent import GeventWorker

from phi_api.errors import openai_body
from phi_api.telemetry.logs import REQUEST_ID_HEADER
from phi_api.web.foreign import from_foreign

log = logging.getLogger(__name__)


class Worker(GeventWorker):
    """``worker_class = "phi_api.server.worker.Worker"`` in ``gunicorn.conf.py``."""

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """Answer a request gunicorn could not serve with the error object, and log it without its text.

        gunicorn's own handler writes HTML and logs the exception's text, which
        can quote the request line (and an ``api_key`` in its query string).
        """
        error = from_foreign(exc)
        status = error.status
        if status >= 500:
            log.error("Error handling request", exc_info=(type(exc), exc, exc.__traceback__))
        else:
            log.warning("Refused an invalid request (%s): %d", type(exc).__name__, status)
        body = json.dumps(openai_body(error)).encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"{REQUEST_ID_HEADER}: {uuid.uuid4().hex}\r\n\r\n")
        try:
            client.sendall(head.encode("latin-1") + body)
        except OSError:
            log.debug("Could not send the error response")

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> bool:
        """Serve one request; a stream write that timed out closes the connection quietly."""
        try:
            return super().handle_request(listener_name, req, sock, addr)
        except TimeoutError:
            # The response iterable has been closed (generation stopped, slot freed).
            log.info("Client stopped reading a response; connection closed")
            raise StopIteration() from None
