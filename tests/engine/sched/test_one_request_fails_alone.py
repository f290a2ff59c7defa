"""A prompt is prefilled only when rows for all its choices will be there, and one request's failure ends that
request only, the rest of the batch going on.

The slip found under load: admission (KVCache.make_room) checked that the free rows hold a new request's n choices,
but not the rows already promised to requests still prefilling (their n - 1 other choices take rows only when their
prompt is in). While a long n=3 prompt prefilled, short requests were admitted into those rows and, once finished,
stayed there as kept prefixes; when the long prompt's last chunk was in, start_running found no free row
(RowsFull), and the engine loop failed every request of the batch.
"""

from __future__ import annotations

import traceback

import numpy as np

from phi_api.engine.choice import Choice, Finished
from phi_api.engine.kv.sequence import Kept
from tests.engine.sched.test_continuous import Bench, bench
from tests.support.fakes import FakeDecoder, Script


def loop_until_idle(b: Bench, limit: int = 2000) -> list[str]:
    """Iterate as the engine loop does (an exception escaping an iteration fails everything); what failed so."""
    failed = []
    for _ in range(limit):
        if b.batch.idle:
            break
        try:
            b.batch.iterate()
        except Exception as error:  # EngineLoop._run's catch-all
            frames = ">".join(frame.name for frame in traceback.extract_tb(error.__traceback__)[1:])
            layout = "".join("-" if item is None else type(item).__name__[0] for item in b.batch.rows.slots)
            failed.append(f"{type(error).__name__}: {error} in {frames}; rows {layout} (S sequence, K kept)")
            b.batch.endings.fail_everything(repr(error))
        b.batch.check()
    return failed


def ends(b: Bench) -> dict[int, Finished]:
    return {id(choice): finished for choice, finished in b.finished}


def short_prompt(i: int) -> np.ndarray:
    """20 tokens (kept as a prefix when done) sharing no prefix with any other prompt here."""
    return np.full(20, 62 - i, dtype=np.int32)


def long_and_shorts(b: Bench, shorts: int) -> tuple[list[Choice], list[str]]:
    long_prompt = np.arange(300, dtype=np.int32) % 40 + 1  # many chunks: prefills while the short ones come and go
    long_choices = b.submit(long_prompt, n=3, max_tokens=2)
    b.iterate()  # admitted: its leader takes one row; its two other choices will need rows when its prompt is in
    assert len(b.batch.prefilling) == 1
    for i in range(shorts):  # a burst of short one-token answers, each kept as a prefix once done
        b.submit(short_prompt(i), max_tokens=1)
    return long_choices, loop_until_idle(b)


def test_an_n3_prompt_finishes_prefilling_with_rows_for_all_its_choices():
    b = bench(max_rows=4)  # 9 rows: 8 usable and the spare
    long_choices, failed = long_and_shorts(b, shorts=10)
    assert not failed, failed
    assert [ends(b)[id(choice)].reason for choice in long_choices] == ["length"] * 3
    assert b.reasons().count("length") == 13 and "error" not in b.reasons()
    assert [item for item in b.batch.rows.occupants() if isinstance(item, Kept)]  # the short ones were kept


def test_the_same_with_batch_invariant_padding():
    b = bench(max_rows=4, invariant=True)
    _, failed = long_and_shorts(b, shorts=10)
    assert not failed, failed
    assert b.reasons().count("length") == 13


class FailingPrefill(FakeDecoder):
    """Raises a plain error (a bug of ours, not ONNX Runtime's) on the prefill of prompts starting with ``bad``."""

    bad = 50

    def step(self, kv, first, ids, past, prefill, every_position=False):
        if prefill and int(past[0]) == 0 and int(ids[0, 0]) == self.bad:
            raise ValueError("one request's bug")
        return super().step(kv, first, ids, past, prefill, every_position)


def test_an_error_in_one_request_s_prefill_fails_only_that_request():
    b = bench(max_rows=4, decoder=FailingPrefill(Script([1, 2, 3])))
    b.batch.decoder.script = b.script
    good = b.submit(np.arange(1, 13), n=2, max_tokens=3)
    b.iterate()
    bad = b.submit(np.full(12, FailingPrefill.bad), n=2, max_tokens=3)
    failed = loop_until_idle(b)
    assert not failed, failed
    assert [ends(b)[id(choice)].reason for choice in good] == ["length", "length"]
    assert [ends(b)[id(choice)].reason for choice in bad] == ["error", "error"]
    assert "one request's bug" in (ends(b)[id(bad[0])].error or "")
    assert b.batch.ledger.reserved == 0 and b.batch.ledger.active_rows == 0


def test_an_error_half_way_through_one_request_s_start_fails_only_that_request(monkeypatch):
    b = bench(max_rows=4)
    good = b.submit(np.arange(1, 13), n=1, max_tokens=6)
    b.iterate(2)  # the good one runs
    bad = b.submit(np.full(8, 55), n=3, max_tokens=3)
    pool_copy, copies = b.batch.rows.pool.copy, []

    def copy(source, target, length):  # the copy of the bad request's prompt to its third choice fails
        if length == 8:
            copies.append(target)
            if len(copies) == 2:
                raise MemoryError("copy failed")
        return pool_copy(source, target, length)

    monkeypatch.setattr(b.batch.rows.pool, "copy", copy)
    failed = loop_until_idle(b)
    assert not failed, failed
    assert ends(b)[id(good[0])].reason == "length"
    assert [ends(b)[id(choice)].reason for choice in bad] == ["error"] * 3
    assert b.batch.ledger.reserved == 0 and b.batch.ledger.active_rows == 0
    assert b.batch.rows.running == 0 and not [o for o in b.batch.rows.occupants() if not isinstance(o, Kept)]
