"""How waiting encoder inputs are cut into session calls, and padded."""

from __future__ import annotations

import numpy as np

from phi_api.engine.encoder.batcher import Pending, next_batch, padded
from phi_api.engine.encoder.tokens import Tokens, truncated


def waiting(job: str, lengths: list[int], priority: int = 0, arrival: int = 0) -> list[Pending]:
    return [Pending(job, index, Tokens(np.arange(length, dtype=np.int64) + 1), priority, arrival)
            for index, length in enumerate(lengths)]


def test_sooner_requests_first_and_each_request_s_inputs_by_length():
    pending = waiting("late", [3, 3], arrival=2) + waiting("early", [9, 2, 5], arrival=1)
    batch = next_batch(pending, max_rows=8, max_tokens=1000)
    assert [(item.job, len(item.tokens)) for item in batch] == [
        ("early", 2), ("early", 5), ("early", 9), ("late", 3), ("late", 3)]
    urgent = waiting("urgent", [4], priority=-1, arrival=3)
    assert next_batch(pending + urgent, 8, 1000)[0].job == "urgent"


def test_a_batch_stops_at_its_rows_and_its_padded_size_but_always_takes_one():
    pending = waiting("a", [10, 10, 10, 40])
    assert len(next_batch(pending, max_rows=2, max_tokens=1000)) == 2
    assert len(next_batch(pending, max_rows=8, max_tokens=30)) == 3  # a 4th row of 40 would pad to 160
    assert len(next_batch(waiting("b", [500]), max_rows=8, max_tokens=30)) == 1


def test_padding_masks_the_tail_and_keeps_token_types():
    items = [Pending("a", 0, Tokens(np.array([5, 6, 7]), np.array([0, 1, 1])), 0, 0),
             Pending("a", 1, Tokens(np.array([8])), 0, 0)]
    ids, mask, types = padded(items)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert types.tolist() == [[0, 1, 1], [0, 0, 0]]


def test_truncation_keeps_the_closing_special_token():
    cut = truncated(Tokens(np.array([101, 1, 2, 3, 4, 102]), np.array([0, 0, 0, 1, 1, 1])), 4)
    assert cut.ids.tolist() == [101, 1, 2, 102] and cut.types is not None and cut.types.tolist() == [0, 0, 0, 1]
