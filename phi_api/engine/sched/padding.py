"""Batch invariance: every decode step computes an even number of rows, so a row's numbers never depend on its
neighbours.

ONNX Runtime's 4-bit matrix kernel (MLAS, AVX-512 VNNI and AVX2 paths) computes
rows in pairs; a lone row, or the last row of an odd count, goes through a
one-row kernel that adds its sums up in another order. Its last bits then
differ from the same row computed in a pair, enough to flip a greedy near-tie
some tokens later: a request's answer would depend on how many others share
its steps. With ``BATCH_INVARIANT`` a step of an odd number of rows takes one
more, a padding row whose result is thrown away, so that every row goes
through the pair kernel, alone or beside others
(``tests/engine/runtime/test_invariance.py`` checks the whole graph on the
real model: attention, norms and the last projection give a row the same bits
beside any neighbours). A graph whose every operator computes a row on its own
at any row count (phi-api's 4-bit and attention operators:
:mod:`engine.runtime.rowwise`) takes no padding row.

The step binds contiguous rows of the pool, so the padding row is the row
right after the group. Whatever occupies it, the padding writes one key and
value at that occupant's length, past everything it holds: a running or
prefilling row's next token overwrites it, a kept prefix never reads it, and
the pages it touched beyond a row that is not running are given back (the pool
holds one token more than a row ever does, so the write always fits). Under
LongRoPE a short group's step must stay under the switch: a neighbour too long
for that cannot pad, and the step goes unpadded (a conversation past the switch
beside shorter ones on a LongRoPE model is the one case not promised).
"""

from __future__ import annotations

from typing import NamedTuple

from phi_api.engine.kv.rows import RowTable
from phi_api.engine.kv.sequence import Phase

PAD_TOKEN = 0  # any token id of the vocabulary: its result is thrown away


class Pad(NamedTuple):
    """The padding row of one step: its slot, where it writes (it feeds :data:`PAD_TOKEN`), and whether its row's
    pages past ``past`` go back afterwards."""

    slot: int
    past: int
    give_back: bool


class Padding:
    """Plans the padding row of a decode step of the rows ``[first, end)`` of a :class:`RowTable`."""

    def __init__(self, rows: RowTable, switch: int | None) -> None:
        self.rows = rows
        self.switch = switch  # LongRoPE: a step wider than this uses the long factors

    def plan(self, first: int, end: int) -> Pad | None:
        """The padding row for an odd number of rows; None for an even number (or when no row can pad)."""
        if (end - first) % 2 == 0:
            return None
        occupant = self.rows.slots[end]
        past = 0 if occupant is None else occupant.length
        short_group = self.switch is not None and first == 0 and end <= self.rows.short
        if short_group and past + 1 > self.switch:  # type: ignore[operator]
            return None
        running = getattr(occupant, "phase", None) is Phase.RUNNING
        return Pad(end, past, give_back=not running)

    def done(self, pad: Pad | None) -> None:
        """After the step: the pages the padding touched past a row that is not running go back to the system."""
        if pad is not None and pad.give_back:
            self.rows.pool.release(pad.slot, keep=pad.past)
