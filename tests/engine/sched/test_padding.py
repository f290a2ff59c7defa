"""Batch invariance (engine.sched.padding) on the fake model: every decode step has an even row count, the padding
row harms no neighbour, and a row's steps are the same beside others as alone."""

from __future__ import annotations

import threading

import numpy as np

from phi_api.engine import SamplingParams
from phi_api.engine.kv.sequence import Kept
from tests.engine.sched.test_continuous import bench
from tests.support.fakes import fake_engine, text_pieces
from tests.support.generations import collect


def run_three(invariant: bool):
    b = bench(tokens=[1, 2, 3, 4, 5, 6], invariant=invariant, mode="off")
    for first, max_tokens in ((1, 7), (21, 5), (41, 9)):
        b.submit(np.arange(first, first + 6 + first % 5), max_tokens=max_tokens)
    b.run()
    return b


def test_every_decode_step_has_an_even_row_count_and_the_answers_stay():
    padded, plain = run_three(True), run_three(False)
    decodes = [int(step.split(":")[1]) for step in padded.script.steps if step.startswith("decode:")]
    assert decodes and all(rows % 2 == 0 for rows in decodes)
    assert any(int(step.split(":")[1]) % 2 for step in plain.script.steps if step.startswith("decode:"))
    assert [(f.reason, f.completion_tokens) for _, f in padded.finished] == \
        [(f.reason, f.completion_tokens) for _, f in plain.finished]


def test_the_padding_row_writes_only_past_a_kept_prefix_which_serves_the_next_turn_whole():
    b = bench(tokens=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], invariant=True)
    b.submit(np.arange(60, 70), max_tokens=12)  # row 0, running on after the conversation's turn ends
    b.iterate(4)
    conversation = np.arange(1, 25)
    b.submit(conversation, max_tokens=3)  # row 1: it ends first, the last running row, kept where it is
    while not b.finished:
        b.iterate()
    kept = next(item for item in b.batch.rows.occupants() if isinstance(item, Kept))
    values = b.batch.rows.pool.values[0]
    before = values[kept.slot, 0, :kept.length, 0].copy()
    steps = len(b.script.steps)
    b.run()  # row 0 alone, padded with the row after it: the kept prefix's
    assert kept.slot == 1 and "decode:2" in b.script.steps[steps:]
    assert np.array_equal(values[kept.slot, 0, :kept.length, 0], before)
    assert not values[kept.slot, 0, kept.length + 1:, 0].any()  # the padding wrote one token past it, no further
    b.submit(np.concatenate([conversation, [1, 2, 3, 50, 51]]), max_tokens=1)
    b.run()
    assert b.finished[-1][1].cached_tokens >= 24


def checks_of_a_drafting_request(beside: bool) -> list[str]:
    """The draft checks of a request whose prompt holds its answer, alone or beside a request that never drafts."""
    script = list(range(1, 61))
    engine = fake_engine(script, text_pieces(*[f" w{token}".encode() for token in script]), draft_max=8,
                         prefill_chunk=64, batch_invariant=True)
    engine.model.script.check_token_seconds = 0.0125  # checks that would not pay among other requests' rows
    engine.model.script.gate = threading.Semaphore(0)
    try:
        drafting = engine.submit(np.array([70, 71, *script], dtype=np.int32), SamplingParams(max_tokens=40,
                                                                                              temperature=0))
        other = engine.submit(np.array([90, 91, 92], dtype=np.int32), SamplingParams(max_tokens=40, temperature=0,
                                                                                     draft_max=0)) if beside else None
        engine.model.script.gate.release(10_000)
        text, finished = collect(drafting)
        if other is not None:
            collect(other)
    finally:
        engine.stop()
    assert finished.completion_tokens == 40
    return text, [step for step in engine.model.script.steps if step.startswith("check:")]


def test_a_drafting_row_takes_the_same_steps_beside_others_as_alone():
    alone, together = checks_of_a_drafting_request(False), checks_of_a_drafting_request(True)
    assert together == alone and len(alone[1]) >= 3
