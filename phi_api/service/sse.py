"""Server-sent events: the one helper every streaming endpoint uses."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator

from flask import Response

from phi_api.extensions import get_settings
from phi_api.transport import streaming_response

# Yielded by an event source when it has had nothing to say for a while: sent
# as an SSE comment, which clients ignore. Each chunk is a moment to notice a
# client that has gone (see phi_api.transport), so silence must not last.
KEEPALIVE = object()


def encode_event(data: Any) -> str:
    """One ``data:`` event carrying ``data`` as compact JSON."""
    return "data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def sse_response(events: Iterable[Any], on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """A ``text/event-stream`` response of ``events`` (dicts, or ``KEEPALIVE``), ended by ``data: [DONE]``.

    ``on_close`` callbacks run when the server closes the response, whether
    the stream finished, failed, or the client went away.
    """

    def body() -> Iterator[str]:
        for event in events:
            yield ": keepalive\n\n" if event is KEEPALIVE else encode_event(event)
        yield "data: [DONE]\n\n"

    return streaming_response(body(), "text/event-stream", get_settings().STREAM_WRITE_TIMEOUT, on_close)
