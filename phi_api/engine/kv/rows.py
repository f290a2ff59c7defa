"""Which row of the key/value pool each sequence occupies, in the order batched steps need.

A batched step advances a contiguous range of rows, and LongRoPE's short and
long rows cannot share a step. So the rows are laid out as:

- ``[0, short)``: running sequences still under LongRoPE's switch;
- ``[short, running)``: running sequences past it (every sequence is short
  in other models);
- ``[running, rows)``: anything else: a request's leader still prefilling,
  a kept prefix, or nothing.

A leaving running row's place is taken by the last row of its group (a copy
of its keys and values), so the running stay in front; the last running row
leaves where it is (one stream's conversation: its next request takes the
kept row over in place, where each request used to copy its keys and values
twice, ~30 MB at 680 tokens of the default model). A row that is freed,
or whose occupant moves away, gives its pages back to the system. One row is
always left free for moves. :meth:`RowTable.check` states these invariants;
the tests check them after every operation.
"""

from __future__ import annotations

from collections.abc import Iterator

from phi_api.engine.kv.reuse import Occupant
from phi_api.engine.kv.sequence import LONG, Kept, Phase, Sequence
from phi_api.engine.runtime.pool import KVPool
from phi_api.errors import RowsFull


class RowTable:
    """The pool's rows and their occupants."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.slots: list[Occupant | None] = [None] * pool.rows
        self.running = 0  # rows [0, running) advance each step ...
        self.short = 0  # ... of which [0, short) with LongRoPE's short factors

    # Looking --------------------------------------------------------------------------------------

    @property
    def occupied(self) -> int:
        return sum(item is not None for item in self.slots)

    @property
    def free(self) -> int:
        """Rows that can take an occupant (the spare row for moves not counted)."""
        return len(self.slots) - self.occupied - 1

    def occupants(self) -> Iterator[Occupant]:
        return (item for item in self.slots if item is not None)

    def group(self, first: int, end: int) -> list[Sequence]:
        """The running sequences in rows ``[first, end)``."""
        return self.slots[first:end]  # type: ignore[return-value]

    # Placing --------------------------------------------------------------------------------------

    def free_slot(self, start: int = 0) -> int:
        """The first free row at or after ``start`` (the spare row is never handed out)."""
        if self.free < 1:
            raise RowsFull("every row of the key/value pool is taken")
        return self._empty_at_or_after(start)

    def entry_slot(self) -> int:
        """The row for a new request's keys and values: the first free one after the running rows, or the first of
        those rows when a kept prefix holds it, moved out of the way now (the request takes that place when it
        joins: one copy, the kept prefix's, where its own would be a second)."""
        slot = self.free_slot(self.running)
        if self.running < len(self.slots) and isinstance(self.slots[self.running], Kept):
            self._vacate(self.running)
            return self.running
        return slot

    def place(self, item: Occupant, slot: int) -> None:
        """Put ``item`` (whose keys and values are already in row ``slot``, or will be written there) in ``slot``."""
        assert self.slots[slot] is None, f"row {slot} is taken"
        self.slots[slot] = item
        item.slot = slot

    def take(self, old: Occupant, new: Occupant, keep: int) -> None:
        """``new`` takes over ``old``'s row as it is, its first ``keep`` tokens included (no copy)."""
        slot = old.slot
        assert slot is not None and slot >= self.running
        old.slot = None
        self.slots[slot] = new
        new.slot = slot
        self.pool.release(slot, keep)

    def move(self, item: Occupant, target: int) -> None:
        """Copy ``item``'s keys and values to the free row ``target``; its old row's pages go back."""
        source = item.slot
        assert source is not None and self.slots[target] is None
        self.pool.copy(source, target, item.length)
        self.pool.release(target, item.length)  # whatever an earlier occupant left past the copy
        self.slots[source] = None
        self.pool.release(source)
        self.place(item, target)

    def remove(self, item: Occupant) -> None:
        """Take ``item`` out and give its row's pages back; a running row's place is taken by the last of its
        group, so the running stay in front, short ones first."""
        slot = item.slot
        if slot is None:
            return
        self.slots[slot] = None
        item.slot = None
        self.pool.release(slot)
        if slot < self.running:
            self._close_gap(slot)

    def stays_on_leaving(self, row: Sequence) -> bool:
        """Whether running ``row`` can leave the running rows without moving: it is the last of them and of its
        LongRoPE group (a lone stream's row, whose next request then takes it over where it is: no copy either way)."""
        slot = row.slot
        return slot == self.running - 1 and (slot >= self.short or self.short == self.running)

    def leave_running(self, row: Sequence, target: int | None) -> None:
        """Take a running sequence out of the running rows (it becomes something else: a kept prefix): moved to the
        free row ``target``, its keys and values with it, or where :meth:`stays_on_leaving`, left in place
        (``target`` None)."""
        slot = row.slot
        assert slot is not None and slot < self.running
        if target is None:
            assert self.stays_on_leaving(row)
            if slot < self.short:
                self.short -= 1
            self.running -= 1
            return
        self.move(row, target)
        self._close_gap(slot)

    def _close_gap(self, slot: int) -> None:
        """Running row ``slot`` was just emptied: the last row of its group takes its place."""
        if slot < self.short:
            last_short = self.short - 1
            if slot != last_short:
                self.move(self._at(last_short), slot)
            if self.running - 1 > last_short:
                self.move(self._at(self.running - 1), last_short)
            self.short -= 1
        elif slot != self.running - 1:
            self.move(self._at(self.running - 1), slot)
        self.running -= 1

    def join(self, row: Sequence) -> None:
        """Bring a sequence whose prompt is in among the running, in its group."""
        if not row.long and self.short < self.running:  # short rows sit before the long ones
            self._vacate(self.running)
            self.move(self._at(self.short), self.running)
            target = self.short
        else:
            target = self.running
            if row.slot != target:
                self._vacate(target)
        if row.slot != target:
            self.move(row, target)
        row.phase = Phase.RUNNING
        self.running += 1
        if not row.long:
            self.short += 1

    def regroup(self, row: Sequence) -> None:
        """A short running row became long: it takes the last short place, and the short group shrinks."""
        last_short = self.short - 1
        if row.slot != last_short:
            place = row.slot
            assert place is not None
            self.move(row, self._empty_at_or_after(self.running))  # out of the way, through the spare row
            self.move(self._at(last_short), place)  # the last short row takes its place
            self.move(row, last_short)
        row.long = True
        self.short -= 1

    def clear(self) -> None:
        """Forget every occupant and give every row's pages back."""
        for index, item in enumerate(self.slots):
            if item is not None:
                item.slot = None
                self.pool.release(index)
        self.slots = [None] * len(self.slots)
        self.running = self.short = 0

    # Invariants -----------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise AssertionError unless the layout holds (see the module's docstring)."""
        assert 0 <= self.short <= self.running <= len(self.slots), (self.short, self.running)
        for index, item in enumerate(self.slots):
            if item is not None:
                assert item.slot == index, f"row {index} holds an occupant that thinks it is in {item.slot}"
        for index in range(self.running):
            item = self.slots[index]
            assert item is not None and not isinstance(item, Kept), f"running row {index} holds {item!r}"
            phase = getattr(item, "phase", None)
            assert phase is Phase.RUNNING, f"running row {index} is {phase}"
            assert (item.regime == LONG) == (index >= self.short), f"row {index} is in the wrong LongRoPE group"
        assert self.occupied <= len(self.slots) - 1, "the spare row is taken"
        assert len({id(item) for item in self.occupants()}) == self.occupied, "an occupant holds two rows"

    def _at(self, slot: int) -> Occupant:
        """The occupant of ``slot``, which the layout says is taken."""
        occupant = self.slots[slot]
        assert occupant is not None, f"row {slot} was expected to be occupied"
        return occupant

    def _vacate(self, slot: int) -> None:
        """Move whatever occupies ``slot`` (a row still prefilling, a kept prefix) further back."""
        occupant = self.slots[slot]
        if occupant is not None:
            self.move(occupant, self._empty_at_or_after(slot + 1))

    def _empty_at_or_after(self, start: int) -> int:
        for index in range(start, len(self.slots)):
            if self.slots[index] is None:
                return index
        raise RowsFull("no free row past the running ones")

