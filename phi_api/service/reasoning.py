"""A reasoning model's thinking, told apart from its answer: the text between the model's thinking markers
(``<think>`` and ``</think>`` for Qwen3, DeepSeek-R1-Distill, Phi-4-mini-reasoning), found as the text streams.

A template may open the thinking itself (DeepSeek-R1-Distill ends the prompt with ``<think>\\n``): then the
answer starts inside it and only the end marker appears. Text that may still be the start of a marker is held
back until it cannot be; the markers themselves are told to nobody, nor are the blanks around the thinking.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reasoning:
    """How one chat answer's thinking is found: its markers, and whether the prompt left the model inside it."""

    start: str
    end: str
    inside: bool = False


class ReasoningSplitter:
    """Splits one answer's text, as it streams, into (is thinking, text) pieces in order."""

    def __init__(self, reasoning: Reasoning) -> None:
        self._start, self._end = reasoning.start, reasoning.end
        self._state = "thinking" if reasoning.inside else "opening"
        self._pending = ""
        self._trim = reasoning.inside  # blanks that open the thinking, or the answer after it, are dropped

    def feed(self, text: str) -> list[tuple[bool, str]]:
        """Take more text; the pieces that can be told now."""
        self._pending += text
        pieces: list[tuple[bool, str]] = []
        while True:
            before = (self._state, self._pending)
            pieces += self._step()
            if (self._state, self._pending) == before:
                return [piece for piece in pieces if piece[1]]

    def flush(self) -> list[tuple[bool, str]]:
        """The end of the answer: whatever was held back."""
        pending, self._pending = self._pending, ""
        if self._trim:
            pending = pending.lstrip()
        return [(self._state == "thinking", pending)] if pending else []

    def _step(self) -> list[tuple[bool, str]]:
        if self._trim:
            stripped = self._pending.lstrip()
            if not stripped:
                return []
            self._pending, self._trim = stripped, False
        if self._state == "opening":
            return self._opening()
        if self._state == "thinking":
            return self._thinking()
        pending, self._pending = self._pending, ""
        return [(False, pending)]

    def _opening(self) -> list[tuple[bool, str]]:
        """At the answer's start: the start marker (after blanks) opens the thinking; anything else is answer."""
        head = self._pending.lstrip()
        if head.startswith(self._start):
            self._pending, self._state, self._trim = head[len(self._start):], "thinking", True
        elif not (self._start.startswith(head)):  # cannot become the marker: no thinking in this answer
            self._state = "answer"
        return []

    def _thinking(self) -> list[tuple[bool, str]]:
        found = self._pending.find(self._end)
        if found >= 0:
            thought = self._pending[:found].rstrip()
            self._pending, self._state, self._trim = self._pending[found + len(self._end):], "answer", True
            return [(True, thought)]
        # held back: what may start the end marker, and the blanks before it (dropped if the marker follows)
        cut = len(self._pending) - _held_suffix(self._pending, self._end)
        cut = len(self._pending[:cut].rstrip())
        told, self._pending = self._pending[:cut], self._pending[cut:]
        return [(True, told)]


def _held_suffix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
