"""The client's connection: deadlines that keep slow or vanished clients from holding the server.

Under gunicorn the WSGI environ carries the client socket (``gunicorn.socket``);
elsewhere (Flask's test client) these guards do nothing.

- Headers: gunicorn's gevent worker gives a request ``keepalive`` seconds to
  arrive (``gunicorn.conf.py``), and limits their size and number.
- Body: it must arrive within ``REQUEST_READ_TIMEOUT`` seconds (an upload's
  within ``UPLOAD_READ_TIMEOUT``), or 408. It is read before a concurrency slot
  is taken, so a slow body never holds one.
- Streams: the send buffer is made small and each write must finish within
  ``STREAM_WRITE_TIMEOUT`` seconds, so a client that stops reading is found
  once the bytes in flight fill the buffers; a client that closed the
  connection is found before the next event is sent (the socket reads as
  end-of-file), even while a long prompt is still being prefilled. A client
  that keeps reading, but slower than the answer is made, meets the run's
  deadline (``GENERATION_TIMEOUT`` and a grace) at its next event: the stream
  ends with the timeout's error and the slot is given back.
- Non-streaming answers: the wait for the answer polls the socket the same
  way (:func:`disconnect_probe`), so a client that gave up is found within
  a poll interval and its generation cancelled.
"""

from __future__ import annotations

import logging
import select
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import gevent
from flask import Response, request

from phi_api.errors import RequestTimeoutError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bytes the kernel may hold for a stream (Linux doubles it). A token event is
# ~200 bytes: a reader that stops is found after at most a few hundred tokens.
STREAM_SEND_BUFFER = 16 * 1024
# Each write of a stream must finish within STREAM_WRITE_TIMEOUT: a large event (the Responses API echoes a request's
# tools in its events: megabytes, for a large schema) is written a slice at a time, each with its own deadline, so
# that a client reading at 64 KB a second or faster keeps its stream.
STREAM_SLICE = 64 * 1024
GONE_CHECK_SECONDS = 0.1


def _client_socket() -> Any:
    return request.environ.get("gunicorn.socket")


def read_body(timeout: float) -> bytes:
    """The request body, which must arrive within ``timeout`` seconds (else 408, and no more reading)."""
    return read_within(timeout, lambda: request.get_data(cache=False))  # honours MAX_CONTENT_LENGTH (413)


def read_within(timeout: float, read: Callable[[], T]) -> T:
    """What ``read`` makes of the request body (the body read whole), which must arrive within ``timeout`` seconds
    (else 408, and no more reading)."""
    deadline = gevent.Timeout(timeout)
    try:
        with deadline:
            return read()
    except gevent.Timeout as exc:
        if exc is not deadline:
            raise
        sock = _client_socket()
        if sock is not None:
            # The rest of the body will not be read: let gunicorn see the end of the
            # connection instead of waiting for it before the next request.
            try:
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        raise RequestTimeoutError(f"The request body did not arrive within {timeout:g} seconds.") from None


def disconnect_probe() -> Callable[[], bool]:
    """For the current request: a check that says whether its client has closed the connection.

    A non-streaming answer writes nothing until it is done, so the write that
    would reveal a vanished client comes too late; its wait polls this
    instead. Outside gunicorn (Flask's test client) the check says "no".
    """
    sock = _client_socket()
    if sock is None:
        return lambda: False
    return lambda: client_gone(sock)


def client_gone(sock: Any) -> bool:
    """True if the client closed (or reset) the connection: it reads as end-of-file, without waiting."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or already closed
        return True


STREAM_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies such as nginx must not buffer the stream
}


def streaming_response(chunks: Iterator[str], mimetype: str, write_timeout: float,
                       on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """A streamed response of ``chunks``, :func:`guarded`; ``on_close`` runs however it ends."""
    response = Response(guarded(chunks, write_timeout), mimetype=mimetype, headers=STREAM_HEADERS)
    for callback in on_close:
        response.call_on_close(callback)
    return response


def guarded(chunks: Iterator[str], write_timeout: float) -> Iterator[str]:
    """``chunks`` of a streamed response, stopped as soon as the client is found gone or not reading.

    Call while the request is being handled; the guard is set up at once and
    undone when the stream ends or is closed.
    """
    sock = _client_socket()
    if sock is None:
        return chunks
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)
    sock.settimeout(write_timeout)  # a write that times out ends the response (see phi_api.server.worker)
    return _watched(chunks, sock)


def _watched(chunks: Iterator[str], sock: Any) -> Iterator[str]:
    # At most one look at the socket per interval: two system calls per token would compete with the engine
    # for the cores, and a client gone is still noticed within a fraction of a second.
    next_look = 0.0
    try:
        for chunk in chunks:
            now = time.monotonic()
            if now >= next_look:
                next_look = now + GONE_CHECK_SECONDS
                if client_gone(sock):
                    log.info("Client closed the connection; stream stopped")
                    return
            if len(chunk) <= STREAM_SLICE:
                yield chunk
                continue
            for start in range(0, len(chunk), STREAM_SLICE):
                yield chunk[start:start + STREAM_SLICE]
    finally:
        try:
            sock.settimeout(None)
        except OSError:
            pass
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
