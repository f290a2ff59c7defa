"""Reading server-sent events, strictly."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def parse_sse(raw: str) -> list[Any]:
    """The events of an SSE body: JSON objects, then the string "[DONE]". Comments are dropped.

    Fails unless every event is a single ``data:`` line ended by a blank line.
    """
    events = []
    for lines in _blocks(raw):
        assert len(lines) == 1 and lines[0].startswith("data: "), f"unexpected SSE block {lines!r}"
        data = lines[0][len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _blocks(raw: str) -> Iterator[list[str]]:
    """The lines of each event of an SSE body, comments (keepalives) left out."""
    assert raw.endswith("\n\n"), "an SSE body ends with a blank line"
    for block in raw[:-2].split("\n\n"):
        lines = block.split("\n")
        if not all(line.startswith(":") for line in lines):
            yield lines


def chat_text(events: list[Any]) -> str:
    """The concatenated content of chat chunks."""
    return "".join(choice["delta"].get("content") or "" for event in events if isinstance(event, dict)
                   for choice in event.get("choices", []))


def completion_text(events: list[Any]) -> str:
    """The concatenated text of completion chunks."""
    return "".join(choice["text"] for event in events if isinstance(event, dict) for choice in event.get("choices", []))


def data_lines(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The ``data:`` lines of a streamed SSE body, skipping blank lines and comments (keepalives may come
    at any time, even before the first event)."""
    return (line for line in lines if line and not line.startswith(b":"))


def parse_named_sse(raw: str) -> list[tuple[str, Any]]:
    """The events of a named-event SSE body (the Responses and Messages APIs): ``(event name, data)`` pairs, the
    data parsed as JSON. Comments are dropped; there is no ``[DONE]``.

    Fails unless every event is exactly an ``event:`` line and one ``data:`` line, ended by a blank line.
    """
    events = []
    for lines in _blocks(raw):
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), lines
        events.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return events
