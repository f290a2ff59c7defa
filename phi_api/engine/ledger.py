"""The key/value budget of one engine: what running requests may grow to, and what kept prefixes hold.

A request is admitted only if every one of its choices can grow to its whole
reserve (prompt + ``max_tokens``) within the budget (``KV_CACHE_MB``), so a
running generation never runs out of room. Kept prefixes (see
:mod:`engine.reuse`) live in the same budget, in the memory running requests
do not use yet, and leave, least recently used first, when a request needs
the room: the way vLLM's prefix cache shares its block pool. Every amount is
in whole pages, as the pool holds them (:func:`row_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phi_api.engine.kvpool import PAGE
from phi_api.engine.sequence import Kept


def row_bytes(spec: Any, length: int) -> int:
    """Memory a row of ``length`` tokens takes in a pool of ``spec``'s layout (whole pages of every head)."""
    token_bytes = spec.head_size * _itemsize(spec)
    pages = -(-length * token_bytes // PAGE) if length > 0 else 0
    return 2 * spec.layers * spec.kv_heads * pages * PAGE


def tokens_within(spec: Any, budget: int) -> int:
    """The most tokens one row may hold within ``budget`` bytes."""
    pages = budget // (2 * spec.layers * spec.kv_heads * PAGE)
    return pages * PAGE // (spec.head_size * _itemsize(spec))


def _itemsize(spec: Any) -> int:
    import numpy as np

    return np.dtype(spec.kv_dtype).itemsize


class CapacityError(ValueError):
    """A request that needs more key/value memory than the whole budget allows (it could never run)."""


class Ledger:
    """Bytes reserved by running requests, and the kept prefixes, within ``budget`` bytes and ``max_rows`` rows."""

    def __init__(self, spec: Any, budget: int, max_rows: int, context_length: int) -> None:
        self.spec = spec
        self.budget = budget
        self.max_rows = max_rows
        self.row_tokens = min(context_length, tokens_within(spec, budget))  # the longest a row can grow
        self.reserved = 0  # bytes the running and starting sequences may grow to
        self.active_rows = 0
        self.kept: list[Kept] = []
        self._clock = 0

    def reserve_bytes(self, tokens: int) -> int:
        return row_bytes(self.spec, tokens)

    def check_capacity(self, reserve: int, rows: int) -> None:
        """Raise :class:`CapacityError` unless ``rows`` choices reserving ``reserve`` tokens each could ever run."""
        if rows > self.max_rows or reserve > self.row_tokens or rows * self.reserve_bytes(reserve) > self.budget:
            raise CapacityError(
                f"needs {rows} x {reserve} tokens of key/value cache; this server holds at most "
                f"{self.tokens_for(rows)} tokens per choice for {rows} choice(s) (KV_CACHE_MB)")

    def tokens_for(self, rows: int) -> int:
        """The most tokens each of ``rows`` choices may reserve, alone."""
        return min(self.row_tokens, tokens_within(self.spec, self.budget // max(1, rows)))

    # Running requests -----------------------------------------------------------------------------

    def could_fit(self, rows: int, reserve: int) -> bool:
        """Whether ``rows`` more choices of ``reserve`` tokens fit beside the running ones, were every kept prefix
        given up."""
        return (self.active_rows + rows <= self.max_rows
                and self.reserved + rows * self.reserve_bytes(reserve) <= self.budget)

    def room_short(self, rows: int, reserve: int, free_rows: int) -> tuple[int, int]:
        """(bytes, rows) that kept prefixes must give back before such choices fit."""
        wanted = self.reserved + rows * self.reserve_bytes(reserve) + self.kept_bytes - self.budget
        return max(0, wanted), max(0, rows - free_rows)

    def take(self, reserve: int) -> int:
        """Book one choice reserving ``reserve`` tokens; returns the bytes booked (give them back when it ends)."""
        booked = self.reserve_bytes(reserve)
        self.reserved += booked
        self.active_rows += 1
        return booked

    def give_back(self, booked: int) -> None:
        """A choice booked with ``booked`` bytes has ended."""
        self.reserved -= booked
        self.active_rows -= 1

    def reset(self) -> None:
        """Nothing runs and nothing is kept any more."""
        self.reserved = self.active_rows = 0
        self.kept.clear()

    # Kept prefixes --------------------------------------------------------------------------------

    @property
    def kept_bytes(self) -> int:
        return sum(self.reserve_bytes(kept.length) for kept in self.kept)

    def tick(self) -> int:
        """A new time for least-recently-used order."""
        self._clock += 1
        return self._clock

    def keep(self, kept: Kept) -> None:
        self.kept.append(kept)

    def forget(self, kept: Kept) -> None:
        self.kept.remove(kept)

    def touch(self, kept: Kept) -> None:
        kept.used_at = self.tick()

    def evictions(self, bytes_needed: int, rows_needed: int, spare: Callable[[Kept], bool]) -> list[Kept]:
        """The kept prefixes to give up, least recently used first, to free ``bytes_needed`` and ``rows_needed``
        (``spare``: those to give up last); all of them if that is not enough."""
        order = sorted(self.kept, key=lambda kept: (spare(kept), kept.used_at))
        chosen: list[Kept] = []
        freed_bytes = 0
        for kept in order:
            if freed_bytes >= bytes_needed and len(chosen) >= rows_needed:
                break
            chosen.append(kept)
            freed_bytes += self.reserve_bytes(kept.length)
        return chosen

    @property
    def usage(self) -> float:
        """Share of the budget running requests hold (kept prefixes, which leave when room is needed, do not count;
        as vLLM's ``kv_cache_usage_perc``)."""
        return self.reserved / self.budget if self.budget else 0.0
