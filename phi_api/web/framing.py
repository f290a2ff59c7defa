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


def framed(framing: Framing, events: Iterable[Any], on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """A stream of ``events`` framed as ``framing`` says."""
    if framing is Framing.NAMED_SSE:
        return named_sse_response(events, on_close)
    if framing is Framing.NDJSON:
        return ndjson_response(events, on_close)
    return sse_response(events, on_close, done=framing is Framing.SSE)
