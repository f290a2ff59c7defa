"""The key/value budget's books: what running requests book, what kept prefixes hold, and who leaves for room."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine.kv.ledger import Ledger, row_bytes, tokens_within
from phi_api.engine.kv.sequence import SHORT, Kept
from phi_api.engine.runtime.pool import PAGE
from phi_api.engine.runtime.spec import DecoderSpec
from phi_api.errors import CapacityError

SPEC = DecoderSpec(layers=2, kv_heads=2, head_size=16, vocab_size=64)  # 64 bytes a token of a head


def ledger(tokens_of_budget: int = 1000, max_rows: int = 8) -> Ledger:
    return Ledger(SPEC, row_bytes(SPEC, tokens_of_budget), max_rows, context_length=4096)


def kept(ledger: Ledger, length: int, first: int = 1) -> Kept:
    item = Kept(np.arange(first, first + length), SHORT, slot=0, used_at=ledger.tick())
    ledger.keep(item)
    return item


def test_rows_are_booked_in_whole_pages_of_every_head_and_layer():
    assert row_bytes(SPEC, 0) == 0
    assert row_bytes(SPEC, 1) == 2 * 2 * 2 * PAGE  # keys and values, 2 layers, 2 heads: a page each
    assert row_bytes(SPEC, 64) == row_bytes(SPEC, 1)  # 64 tokens of 64 bytes fill one 4 KB page
    assert row_bytes(SPEC, 65) == 2 * row_bytes(SPEC, 1)
    assert tokens_within(SPEC, row_bytes(SPEC, 100)) == 128  # whole pages: 100 tokens' pages hold 128


def test_booking_and_giving_back_balance():
    books = ledger()
    first, second = books.take(100), books.take(300)
    assert books.reserved == first + second and books.active_rows == 2
    books.give_back(first)
    books.give_back(second)
    assert books.reserved == 0 and books.active_rows == 0


def test_could_fit_counts_running_rows_only_and_room_short_counts_kept_prefixes_too():
    books = ledger(1000)
    books.take(500)
    kept(books, 400)
    assert books.could_fit(1, 400)  # were every kept prefix given up
    short_bytes, short_rows = books.room_short(1, 400, free_rows=3)
    assert short_bytes == books.reserved + row_bytes(SPEC, 400) + row_bytes(SPEC, 400) - books.budget > 0
    assert short_rows == 0
    assert not books.could_fit(1, 600)  # beside the running 500, never


def test_evictions_are_least_recently_used_first_and_spare_the_source_last():
    books = ledger()
    old, middle, recent = kept(books, 100, 1), kept(books, 100, 200), kept(books, 100, 400)
    books.touch(old)  # used again: now the most recent
    assert books.evictions(row_bytes(SPEC, 100), 0, spare=lambda item: False) == [middle]
    assert books.evictions(row_bytes(SPEC, 100), 0, spare=lambda item: item is middle) == [recent]
    assert books.evictions(10 * row_bytes(SPEC, 100), 0, spare=lambda item: False) == [middle, recent, old]


def test_a_request_over_the_whole_budget_or_the_rows_is_refused_with_its_arithmetic():
    books = ledger(1000, max_rows=4)
    books.check_capacity(1000, 1)
    with pytest.raises(CapacityError, match="2 x 1000 tokens"):
        books.check_capacity(1000, 2)
    with pytest.raises(CapacityError):
        books.check_capacity(10, 5)  # more choices than rows
