"""Newline-delimited JSON streams (Ollama's streaming format)."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator

from flask import Response

from phi_api.extensions import get_settings
from phi_api.transport import streaming_response

NDJSON_TYPE = "application/x-ndjson"


def ndjson_response(objects: Iterable[dict[str, Any]], on_close: Iterable[Callable[[], None]] = ()) -> Response:
    """A stream of one compact JSON object per line; ``on_close`` runs when the server closes it."""

    def body() -> Iterator[str]:
        for item in objects:
            yield json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n"

    return streaming_response(body(), NDJSON_TYPE, get_settings().STREAM_WRITE_TIMEOUT, on_close)
