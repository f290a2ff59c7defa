"""The row table's invariants (engine.rows), after every operation of long random runs, and what moves copy."""

from __future__ import annotations

import random

import numpy as np
import pytest

from phi_api.engine.kv.rows import RowTable
from phi_api.engine.kv.sequence import Kept
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.spec import DecoderSpec
from phi_api.errors import RowsFull

SPEC = DecoderSpec(layers=2, kv_heads=2, head_size=16, vocab_size=8)


class Row:
    """A stand-in sequence: its keys hold its own number at every position it holds."""

    def __init__(self, number: int, length: int, long: bool = False) -> None:
        self.number, self.length, self.long = number, length, long
        self.slot = None
        self.reusable = 0
        self.regime = "long" if long else "short"


@pytest.fixture
def table():
    pool = KVPool(SPEC, 9, 64)
    yield RowTable(pool)
    pool.close()


def write(table: RowTable, row) -> None:
    for buffers in (table.pool.keys, table.pool.values):
        for buffer in buffers:
            buffer[row.slot, :, :row.length] = row.number


def assert_rows_hold_their_own(table: RowTable) -> None:
    for item in table.occupants():
        for buffer in (*table.pool.keys, *table.pool.values):
            assert (buffer[item.slot, :, :item.length] == item.number).all(), f"row {item.slot} lost its keys"


@pytest.mark.parametrize("seed", range(12))
def test_random_joins_leaves_regroups_and_kept_rows_keep_the_layout(table, seed):
    rng = random.Random(seed)
    number = 0
    for _ in range(300):
        running = table.group(0, table.running)
        waiting = [item for item in table.occupants() if item.slot >= table.running]
        action = rng.choice(["start", "join", "leave", "regroup", "keep", "drop"])
        try:
            if action == "start" and table.free:
                number += 1
                row = Row(number, rng.randint(1, 60), long=rng.random() < 0.3)
                table.place(row, table.entry_slot() if rng.random() < 0.5 else table.free_slot(table.running))
                write(table, row)
            elif action == "join" and [item for item in waiting if isinstance(item, Row)]:
                table.join(rng.choice([item for item in waiting if isinstance(item, Row)]))
            elif action == "leave" and running:
                table.remove(rng.choice(running))
            elif action == "regroup" and table.short:
                row = rng.choice(table.group(0, table.short))
                table.regroup(row)
                row.regime = "long"
            elif action == "keep" and running and table.free:
                row = rng.choice(running)
                stays = table.stays_on_leaving(row) and rng.random() < 0.5
                table.leave_running(row, None if stays else table.free_slot(table.running))
                kept = Kept(np.zeros(row.length, dtype=np.int64), row.regime, row.slot, 0)
                kept.number = row.number
                table.take(row, kept, row.length)
            elif action == "drop" and waiting:
                table.remove(rng.choice(waiting))
        except RowsFull:
            pass
        table.check()
        assert_rows_hold_their_own(table)


def test_the_spare_row_is_never_handed_out(table):
    for number in range(8):
        table.place(Row(number, 1), table.free_slot())
    with pytest.raises(RowsFull):
        table.free_slot()
    table.check()


def test_check_finds_a_broken_layout(table):
    row = Row(1, 4)
    table.place(row, 3)
    table.running = 1  # row 0 is counted as running, but holds nothing
    with pytest.raises(AssertionError):
        table.check()


@pytest.mark.parametrize("long", [False, True])
def test_a_lone_stream_s_row_leaves_and_is_taken_over_where_it_is(table, monkeypatch, long):
    """The last running row becomes a kept prefix in place, and the next request joins from that same row: no copy
    of its keys and values either way (a conversation's or an agent loop's requests one after another)."""
    row = Row(1, 40, long=long)
    table.place(row, table.free_slot())
    write(table, row)
    table.join(row)
    copies = []
    monkeypatch.setattr(table.pool, "copy", lambda *args: copies.append(args))
    assert table.stays_on_leaving(row)
    table.leave_running(row, None)
    kept = Kept(np.zeros(row.length, dtype=np.int64), row.regime, row.slot, 0)
    kept.number = row.number
    table.take(row, kept, row.length)
    table.check()
    following = Row(1, 40, long=long)  # the next request of the conversation: the same keys so far
    table.take(kept, following, row.length)
    table.join(following)
    table.check()
    assert copies == [] and following.slot == 0 and table.running == 1
    assert_rows_hold_their_own(table)


def test_a_running_row_before_others_moves_out_when_it_leaves(table):
    first, second = Row(1, 10), Row(2, 12)
    for row in (first, second):
        table.place(row, table.free_slot(table.running))
        write(table, row)
        table.join(row)
    assert not table.stays_on_leaving(first) and table.stays_on_leaving(second)
    table.leave_running(first, table.free_slot(table.running))
    table.check()
    assert second.slot == 0 and first.slot >= table.running
    assert_rows_hold_their_own(table)


def test_a_new_request_takes_the_first_row_a_kept_prefix_leaves_for_it(table, monkeypatch):
    """After a lone stream's turn, its kept prefix holds row 0; an unrelated request (no reuse) starts there, the
    prefix moved out of its way once, and joins without a second copy."""
    row = Row(1, 30)
    table.place(row, table.entry_slot())
    write(table, row)
    table.join(row)
    table.leave_running(row, None)
    kept = Kept(np.zeros(row.length, dtype=np.int64), row.regime, row.slot, 0)
    kept.number = row.number
    table.take(row, kept, row.length)
    copies = []
    real = table.pool.copy
    monkeypatch.setattr(table.pool, "copy", lambda *args: (copies.append(args), real(*args)))
    other = Row(2, 12)
    table.place(other, table.entry_slot())
    write(table, other)
    table.join(other)
    table.check()
    assert other.slot == 0 and kept.slot != 0 and len(copies) == 1
    assert_rows_hold_their_own(table)
