"""From generated tokens to text: whole UTF-8 characters, with stop strings held back."""

from __future__ import annotations

import codecs
from typing import Protocol


class TokenDecoder(Protocol):
    def decode(self, token: int) -> bytes: ...


class StopMatcher:
    """Releases text only once it cannot be the start of a stop string.

    ``feed`` returns the text that is safe to send and whether a stop string
    was found (the returned text then ends just before it). Text that might
    still turn into a stop string is held until more arrives or ``flush``.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add ``text``; return (text safe to release, stop string found)."""
        if not self._stops:
            return text, False
        pending = self._pending + text
        cut = min((index for index in (pending.find(stop) for stop in self._stops) if index >= 0), default=-1)
        if cut >= 0:
            self._pending = ""
            return pending[:cut], True
        held = max(self._held_suffix(pending, stop) for stop in self._stops)
        self._pending = pending[len(pending) - held:] if held else ""
        return pending[: len(pending) - held], False

    def flush(self) -> str:
        """Release whatever was held back (generation ended without a stop string)."""
        pending, self._pending = self._pending, ""
        return pending

    @staticmethod
    def _held_suffix(text: str, stop: str) -> int:
        """Length of the longest end of ``text`` that begins ``stop``."""
        for length in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:length]):
                return length
        return 0


class TextAssembler:
    """Turns a generation's tokens into text deltas that never split a character or a stop string."""

    def __init__(self, decoder: TokenDecoder, stops: tuple[str, ...]) -> None:
        self._decoder = decoder
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._stops = StopMatcher(stops)

    def add(self, token: int) -> tuple[str, bool]:
        """Decode ``token``; return (text to release, stop string reached)."""
        return self._stops.feed(self._utf8.decode(self._decoder.decode(token)))

    def finish(self) -> str:
        """The text still held when generation ends for another reason."""
        try:
            tail = self._utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            tail = ""  # a character cut in half by max_tokens has no text to show
        return self._stops.feed(tail)[0] + self._stops.flush()
