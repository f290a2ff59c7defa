"""The key/value budget of one engine: what running requests may grow to, and what kept prefixes hold.

A request is admitted only if every one of its choices can grow to its whole
reserve (prompt + ``max_tokens``) within the budget (``KV_CACHE_MB``), so a
running generation never runs out of room. Kept prefixes (see
:mod:`engine.kv.reuse`) live in the same budget, in the memory running requests
do not use yet, and leave, least recently used first, when a request needs
the room: the way vLLM's prefix cache shares its block pool. Every amount is
in whole pages, as the pool holds them (:func:`row_bytes`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from phi_api.engine.kv.budget import Account, SharedBudget
from phi_api.engine.kv.sequence import Kept
from phi_api.engine.runtime.pool import PAGE
from phi_api.engine.runtime.spec import DecoderSpec
from phi_api.errors import CapacityError


def row_bytes(spec: DecoderSpec, length: int) -> int:
    """Memory a row of ``length`` tokens takes in a pool of ``spec``'s layout (whole pages of every head)."""
    token_bytes = spec.kv_head_token_bytes
    pages = -(-length * token_bytes // PAGE) if length > 0 else 0
    return 2 * spec.layers * spec.kv_heads * pages * PAGE


def tokens_within(spec: DecoderSpec, budget: int) -> int:
    """The most tokens one row may hold within ``budget`` bytes."""
    pages = budget // (2 * spec.layers * spec.kv_heads * PAGE)
    return pages * PAGE // spec.kv_head_token_bytes


class Ledger:
    """Bytes reserved by running requests, and the kept prefixes, within ``budget`` bytes and ``max_rows`` rows of
    this engine, and within the worker's budget shared by every engine (:mod:`engine.kv.budget`; a budget of its own
    when none is given)."""

    def __init__(self, spec: DecoderSpec, budget: int, max_rows: int, context_length: int, *,
                 shared: SharedBudget | None = None, name: str = "", wake: Callable[[], None] = lambda: None,
                 open_account: bool = True) -> None:
        self.spec = spec
        self.shared = shared if shared is not None else SharedBudget(budget)
        self.own_budget = budget  # this model's cap (KV_CACHE_MB), within the shared budget
        self.max_rows = max_rows
        self.row_tokens = min(context_length, tokens_within(spec, budget))  # the longest a row can grow
        self.active_rows = 0
        self.account = self.shared.open(name, wake, lambda kept: self.reserve_bytes(kept.length)) \
            if open_account else None

    @property
    def budget(self) -> int:
        """The most this engine's running requests and kept prefixes may hold now: its cap, or the worker's budget
        when that is smaller."""
        return min(self.own_budget, self.shared.budget)

    @property
    def reserved(self) -> int:
        """Bytes the running and starting sequences may grow to."""
        return self._account.reserved

    @property
    def kept(self) -> list[Kept]:
        return self._account.kept

    @property
    def _account(self) -> Account:
        assert self.account is not None, "a capacity-only ledger books nothing"
        return self.account

    def reserve_bytes(self, tokens: int) -> int:
        return row_bytes(self.spec, tokens)

    def check_capacity(self, reserve: int, rows: int) -> None:
        """Raise :class:`CapacityError` unless ``rows`` choices reserving ``reserve`` tokens each could ever run."""
        if rows > self.max_rows or reserve > self.row_tokens or rows * self.reserve_bytes(reserve) > self.budget:
            raise CapacityError(
                f"needs {rows} x {reserve} tokens of key/value cache; this server holds at most "
                f"{self.tokens_for(rows)} tokens per choice for {rows} choice(s) (KV_CACHE_MB, MEMORY_LIMIT_MB)")

    def tokens_for(self, rows: int) -> int:
        """The most tokens each of ``rows`` choices may reserve, alone."""
        return min(self.row_tokens, tokens_within(self.spec, self.budget // max(1, rows)))

    # Running requests -----------------------------------------------------------------------------

    def could_fit(self, rows: int, reserve: int) -> bool:
        """Whether ``rows`` more choices of ``reserve`` tokens fit beside the running ones of this engine and of
        every other engine of the worker, were every kept prefix given up."""
        wanted = rows * self.reserve_bytes(reserve)
        return (self.active_rows + rows <= self.max_rows and self.reserved + wanted <= self.budget
                and self.shared.reserved + wanted <= self.shared.budget)

    def room_short(self, rows: int, reserve: int, free_rows: int) -> tuple[int, int]:
        """(bytes, rows) that this engine's kept prefixes must give back before such choices fit its own cap."""
        wanted = self.reserved + rows * self.reserve_bytes(reserve) + self.kept_bytes - self.own_budget
        return max(0, wanted), max(0, rows - free_rows)

    def shared_short(self, rows: int, reserve: int) -> int:
        """Bytes that kept prefixes of any engine must give back before such choices fit the worker's budget."""
        return self.shared.short(rows * self.reserve_bytes(reserve))

    def take(self, reserve: int) -> int:
        """Book one choice reserving ``reserve`` tokens; returns the bytes booked (give them back when it ends)."""
        booked = self.reserve_bytes(reserve)
        with self.shared.lock:
            self._account.reserved += booked
        self.active_rows += 1
        return booked

    def give_back(self, booked: int) -> None:
        """A choice booked with ``booked`` bytes has ended."""
        with self.shared.lock:
            self._account.reserved -= booked
        self.active_rows -= 1
        self.shared.room_freed()

    def reset(self) -> None:
        """Nothing runs and nothing is kept any more."""
        with self.shared.lock:
            self._account.reserved = 0
            self._account.kept.clear()
        self.active_rows = 0
        self.shared.room_freed()

    def close(self) -> None:
        """The engine has ended: its part of the worker's books goes."""
        if self.account is not None:
            self.shared.close(self.account)

    # Kept prefixes --------------------------------------------------------------------------------

    @property
    def kept_bytes(self) -> int:
        return self._account.kept_bytes

    def tick(self) -> int:
        """A new time for least-recently-used order (across every engine of the worker)."""
        return self.shared.tick()

    def keep(self, kept: Kept) -> None:
        with self.shared.lock:
            self.kept.append(kept)

    def forget(self, kept: Kept) -> None:
        with self.shared.lock:
            self.kept.remove(kept)

    def touch(self, kept: Kept) -> None:
        kept.used_at = self.tick()
        kept.touched = time.monotonic()

    def evictions(self, bytes_needed: int, rows_needed: int, spare: Callable[[Kept], bool]) -> list[Kept]:
        """This engine's kept prefixes to give up, least recently used first, to free ``bytes_needed`` and
        ``rows_needed`` (``spare``: those to give up last); all of them if that is not enough."""
        order = sorted(self.kept, key=lambda kept: (spare(kept), kept.used_at))
        chosen: list[Kept] = []
        freed_bytes = 0
        for kept in order:
            if freed_bytes >= bytes_needed and len(chosen) >= rows_needed:
                break
            chosen.append(kept)
            freed_bytes += self.reserve_bytes(kept.length)
        return chosen

    def idle_kept(self, now: float) -> list[Kept]:
        """Kept prefixes no request has used for the shared budget's ``idle_seconds``."""
        return [kept for kept in self.kept if now - kept.touched > self.shared.idle_seconds]
