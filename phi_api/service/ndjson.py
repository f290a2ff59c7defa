"""Newline-delimited JSON streams (Ollama's streaming format)."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator

from flask import Response

NDJSON_TYPE = "application/x-ndjson"


def ndjson_response(objects: Iterable[dict[str, Any]], on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """A stream of one compact JSON object per line; ``on_close`` runs when the server closes it."""

    def body() -> Iterator[str]:
        for item in objects:
            yield json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n"

    response = Response(body(), mimetype=NDJSON_TYPE, headers={"Cache-Control": "no-cache",
                                                               "X-Accel-Buffering": "no"})
    for callback in on_close:
        response.call_on_close(callback)
    return response
