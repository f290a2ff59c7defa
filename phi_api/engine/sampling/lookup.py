"""Draft sources beside a sequence's own tokens: a text indexed by its n-grams (:class:`Index`), read by one sequence
from where its last kept draft ended (:class:`Lookup`); and each key's earlier answers (:class:`Histories`).

A request's predicted output (OpenAI's ``prediction``) is a text the answer is expected to follow in order: its
occurrence at or after the sequence's place in it is drafted, and while the answer begins as it does, its next tokens
with no n-gram needed. A key's history is the answers it had from this model in this worker, each after the two
tokens that opened it (the chat template's assistant header), so that even an answer's first tokens find the
starts of earlier answers; its latest occurrence is drafted (what the key asked last is likeliest again). A
history is only ever read for requests of the key (the cache key: the API key and ``cache_salt``) that wrote it: a
draft kept from another tenant's text would tell that text through the timing of the answer.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence

NGRAM_SIZES = (3, 2)  # the last n tokens matched, longest first (llama.cpp's prompt lookup starts at 3 too)
HEADER_TOKENS = 2  # the prompt's last tokens kept before each answer in a history
HISTORY_OWNERS = 8  # a worker keeps the histories of this many keys per model at most (the least recent go first)


class Index:
    """Tokens and, for each n-gram followed by a token, the positions of those followers (ascending)."""

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        self._at: dict[tuple[int, ...], list[int]] = {}
        self.add(tokens)

    def add(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens)
            for size in NGRAM_SIZES:
                if end > size:  # the n-gram ending just before this token is followed by it
                    self._at.setdefault(tuple(self.tokens[end - 1 - size:end - 1]), []).append(end - 1)

    def places(self, ngram: tuple[int, ...]) -> list[int]:
        return self._at.get(ngram, [])


def nearest(places: list[int], cursor: int, window: int, otherwise: int) -> int:
    """The first of ``places`` (ascending) in ``[cursor, cursor + window)``; ``otherwise`` where none is."""
    at = bisect.bisect_left(places, cursor)
    return places[at] if at < len(places) and places[at] < cursor + window else otherwise


class Lookup:
    """One sequence's reading of an :class:`Index`: ``in_order`` (a prediction) takes the first occurrence at or
    after its place and drafts the text's start while the answer begins as it does; otherwise (a history) the
    latest occurrence, unless the last kept draft goes on where it ended."""

    def __init__(self, index: Index, *, in_order: bool) -> None:
        self.index = index
        self.in_order = in_order
        self.cursor = 0  # just after the last kept draft token taken from it
        self.start = 0  # where the last draft taken from it starts
        self._matched = 0  # the answer's tokens so far, while they are the text's first tokens
        self._aligned = in_order

    def follow(self, token: int) -> None:
        """The answer's next token (only an in-order text's start is followed)."""
        tokens = self.index.tokens
        if self._aligned and self._matched < len(tokens) and tokens[self._matched] == token:
            self._matched += 1
        else:
            self._aligned = False

    def propose(self, recent: list[int], limit: int) -> list[int]:
        """The text's start while the answer follows it, else what follows ``recent``'s last n-gram."""
        if self._aligned and self._matched < len(self.index.tokens):
            self.start = self._matched
            return self.index.tokens[self.start:self.start + limit]
        for size in NGRAM_SIZES:
            if len(recent) >= size:
                draft = self.match(tuple(recent[-size:]), limit)
                if draft:
                    return draft
        return []

    def match(self, ngram: tuple[int, ...], limit: int) -> list[int]:
        """At most ``limit`` tokens that follow ``ngram`` in the text (none if it occurs nowhere)."""
        places = self.index.places(ngram)
        if not places:
            return []
        if self.in_order:  # the first occurrence at or after its place
            self.start = nearest(places, self.cursor, len(self.index.tokens) + 1, places[0])
        else:  # where the last kept draft ended, else the latest
            self.start = nearest(places, self.cursor, 1, places[-1])
        return self.index.tokens[self.start:self.start + limit]

    def kept(self, accepted: int) -> None:
        """The last draft from it had its first ``accepted`` tokens kept."""
        self.cursor = self.start + accepted


class Histories:
    """Per owner (a cache key), its earlier answers in one :class:`Index` of at most ``tokens`` tokens (past that,
    its older half is dropped); at most :data:`HISTORY_OWNERS` owners, the least recently used dropped first."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._owners: collections.OrderedDict[str, Index] = collections.OrderedDict()

    def of(self, owner: str) -> Index | None:
        """The owner's history, if it has one (and it becomes the most recently used)."""
        index = self._owners.get(owner)
        if index is not None:
            self._owners.move_to_end(owner)
        return index

    def add(self, owner: str, answer: Sequence[int]) -> None:
        """An answer of the owner's, with the tokens that opened it."""
        answer = list(answer)[-self.tokens:] if self.tokens > 0 else []
        if not answer:
            return
        index = self._owners.get(owner)
        if index is None:
            index = self._owners[owner] = Index()
            while len(self._owners) > HISTORY_OWNERS:
                self._owners.popitem(last=False)
        elif len(index.tokens) + len(answer) > self.tokens:  # rebuilt from its newer half at most: amortized
            keep = min(self.tokens // 2, self.tokens - len(answer))
            index = self._owners[owner] = Index(index.tokens[len(index.tokens) - keep:] if keep > 0 else [])
        index.add(answer)
        self._owners.move_to_end(owner)
