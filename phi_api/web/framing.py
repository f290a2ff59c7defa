"""How each protocol's stream goes on the wire (:class:`phi_api.protocols.contract.Framing`): server-sent events,
plain or named, and newline-delimited JSON; ``KEEPALIVE`` is written as the framing's comment or empty object."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Response

from phi_api.protocols.contract import Framing
from phi_api.service.generation import KEEPALIVE
from phi_api.web.resources import get_settings
from phi_api.web.transport import streaming_response

NDJSON_TYPE = "application/x-ndjson"


def _compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _sse(events: Iterable[Any], done: bool) -> Iterator[str]:
    """Server-sent events of JSON objects (and ``KEEPALIVE``'s comment), ended by ``data: [DONE]`` if ``done``."""
    for event in events:
        yield ": keepalive\n\n" if event is KEEPALIVE else "data: " + _compact(event) + "\n\n"
    if done:
        yield "data: [DONE]\n\n"


def _named_sse(events: Iterable[Any]) -> Iterator[str]:
    """Named events: ``(name, data)`` pairs written ``event: name`` then the data as JSON (or ``KEEPALIVE``'s
    comment); no ``[DONE]``: those APIs end with an event of their own."""
    for event in events:
        if event is KEEPALIVE:
            yield ": keepalive\n\n"
        else:
            name, data = event
            yield f"event: {name}\ndata: {_compact(data)}\n\n"


def _ndjson(objects: Iterable[Any]) -> Iterator[str]:
    """One compact object a line."""
    return (_compact(item) + "\n" for item in objects)


_WRITTEN: dict[Framing, tuple[Callable[[Iterable[Any]], Iterator[str]], str]] = {
    Framing.SSE: (lambda events: _sse(events, done=True), "text/event-stream"),
    Framing.SSE_UNTERMINATED: (lambda events: _sse(events, done=False), "text/event-stream"),
    Framing.NAMED_SSE: (_named_sse, "text/event-stream"),
    Framing.NDJSON: (_ndjson, NDJSON_TYPE),
}


def framed(framing: Framing, events: Iterable[Any], on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """A streamed response of ``events`` framed as ``framing`` says; ``on_close`` callbacks run when the server
    closes it, whether the stream finished, failed, or the client went away."""
    write, media_type = _WRITTEN[framing]
    return streaming_response(write(events), media_type, get_settings().STREAM_WRITE_TIMEOUT, on_close)
