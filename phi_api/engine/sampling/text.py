"""From generated tokens to text: whole UTF-8 characters, with stop strings held back.

Each generated token becomes a :class:`Piece`: the text it completes (often a
word, sometimes nothing, when it holds only part of a character) and, when
asked for, its log-probability record. Pieces are released whole and in
order, so the released texts concatenate to exactly the answer, and each
log-probability travels with its own text.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any, Protocol


class TokenDecoder(Protocol):
    def decode(self, token: int) -> bytes: ...


@dataclass(frozen=True)
class Piece:
    """The text one token contributes to the answer, and its log-probability record (or None)."""

    text: str
    logprob: Any = None


class StopMatcher:
    """Releases pieces only once their text cannot be the start of a stop string.

    ``feed`` returns the pieces that are safe to send and whether a stop string
    was found; then the released text ends just before it (the piece holding
    the stop string's start is cut there, later ones are dropped). A piece
    whose text might still turn into a stop string waits for more text or
    ``flush``.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._pending: list[Piece] = []
        self.matched: str | None = None  # the stop string found, once one is

    def feed(self, piece: Piece) -> tuple[list[Piece], bool]:
        """Add ``piece``; return (pieces safe to release, stop string found)."""
        if not self._stops:
            return [piece], False
        self._pending.append(piece)
        text = "".join(pending.text for pending in self._pending)
        found = [(index, stop) for stop in self._stops if (index := text.find(stop)) >= 0]
        cut = min(found)[0] if found else -1
        if cut >= 0:
            self.matched = min(found)[1]
            released = self._take(cut, truncate=True)
            self._pending = []
            return released, True
        held = max(self._held_suffix(text, stop) for stop in self._stops)
        return self._take(len(text) - held, truncate=False), False

    def flush(self) -> list[Piece]:
        """Release whatever was held back (generation ended without a stop string)."""
        pending, self._pending = self._pending, []
        return pending

    def _take(self, boundary: int, *, truncate: bool) -> list[Piece]:
        """Remove and return the pending pieces that end at or before ``boundary``.

        With ``truncate``, the piece straddling the boundary is cut to fit and released too.
        """
        released, offset = [], 0
        while self._pending:
            piece = self._pending[0]
            end = offset + len(piece.text)
            if end <= boundary:
                released.append(self._pending.pop(0))
                offset = end
            elif truncate and offset < boundary:
                released.append(Piece(piece.text[: boundary - offset], piece.logprob))
                self._pending.pop(0)
                break
            else:
                break
        return released

    @staticmethod
    def _held_suffix(text: str, stop: str) -> int:
        """Length of the longest end of ``text`` that begins ``stop``."""
        for length in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:length]):
                return length
        return 0


class TextAssembler:
    """Turns a generation's tokens into pieces that never split a character or a stop string."""

    def __init__(self, decoder: TokenDecoder, stops: tuple[str, ...]) -> None:
        self._decoder = decoder
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._stops = StopMatcher(stops)

    def add(self, token: int, logprob: Any = None) -> tuple[list[Piece], bool]:
        """Decode ``token``; return (pieces to release, stop string reached)."""
        return self._stops.feed(Piece(self._utf8.decode(self._decoder.decode(token)), logprob))

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stops.matched

    def finish(self) -> list[Piece]:
        """The pieces still held when generation ends for another reason."""
        try:
            tail = self._utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            tail = ""  # a character cut in half by max_tokens has no text to show
        released = self._stops.feed(Piece(tail))[0] if tail else []
        return released + self._stops.flush()
