"""How much prompt one iteration computes: the grid in exact mode, whole chunks alone, a time slice when others
wait or run (on the fake model's clock, so the plan does not depend on this machine)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from phi_api.engine import SamplingParams
from phi_api.engine.sched.prefill import MIN_TOKENS, ChunkPlanner
from phi_api.engine.sched.stepcost import StepCosts
from tests.support.fakes import fake_engine, text_pieces
from tests.support.generations import collect, generate


def planner(**options) -> ChunkPlanner:
    made = ChunkPlanner(64, grid=False, slice_seconds=0.2, costs=StepCosts(), **options)
    made.costs.observe_step(1, 0.1)  # a step's fixed cost: 0.1 s
    made.costs.observe_prefill(64, 0.1 + 64 * 0.01)  # 10 ms a prompt token beyond it
    return made


def test_alone_a_prompt_goes_in_whole_chunks_on_the_grid():
    assert planner().end(0, 300, 0, crowded=False) == 64
    assert planner().end(70, 300, 0, crowded=False) == 128
    assert planner().end(256, 300, 0, crowded=False) == 300


def test_where_cuts_are_free_a_prompt_goes_in_whole_chunks_from_where_it_resumed():
    """A conversation's next turn, resumed past its last answer, goes in at once rather than in a few tokens up to
    the grid's line first (each chunk a whole step of the model)."""
    free = planner(free=True)
    assert free.end(0, 300, 0, crowded=False) == 64
    assert free.end(70, 300, 0, crowded=False) == 134
    assert free.end(511, 558, 0, crowded=False) == 558
    assert free.end(0, 300, 0, crowded=True) == 10  # crowded: the time slice, as elsewhere
    assert free.end(0, 9000, 4160, crowded=False) == 4160  # LongRoPE's first long chunk


def test_batch_invariant_with_free_cuts_whole_chunks_from_where_it_resumed_whatever_the_crowd():
    both = ChunkPlanner(64, grid=True, slice_seconds=0.2, costs=StepCosts(), free=True)
    assert [both.end(start, 300, 0, crowded=True) for start in (0, 70, 270)] == [64, 134, 300]


def test_crowded_a_chunk_fits_the_time_slice():
    assert planner().end(0, 300, 0, crowded=True) == 10  # (0.2 - 0.1) / 0.01
    assert planner().end(295, 300, 0, crowded=True) == 300


def test_never_less_than_a_few_tokens_and_never_more_than_a_chunk():
    slow = ChunkPlanner(64, grid=False, slice_seconds=0.2, costs=StepCosts())
    slow.costs.observe_step(1, 0.5)
    slow.costs.observe_prefill(64, 0.5 + 64)
    assert slow.bounded_tokens() == MIN_TOKENS
    fast = ChunkPlanner(64, grid=False, slice_seconds=10, costs=StepCosts())
    fast.costs.observe_step(1, 0.001)
    fast.costs.observe_prefill(64, 0.002)
    assert fast.bounded_tokens() == 64


def test_a_chunk_timed_faster_than_the_step_floor_plans_whole_chunks():
    """A noisy floor (a one-row step timed while the machine was busy) can exceed a whole chunk's time: a prompt
    token would then measure as free: the chunk tells nothing, and the plan takes whole chunks rather than dividing
    by zero (it failed every request of the worker in a clean run); a measured cost stays where it was."""
    noisy = ChunkPlanner(64, grid=False, slice_seconds=0.2, costs=StepCosts())
    noisy.costs.observe_step(1, 0.3)
    noisy.costs.observe_prefill(64, 0.1)
    assert noisy.costs.per_token is None
    assert noisy.bounded_tokens() == 64
    assert noisy.end(64, 300, 0, crowded=True) == 128
    noisy.costs.observe_prefill(64, 0.3 + 64 * 0.001)
    noisy.costs.observe_prefill(64, 0.2)
    assert noisy.costs.per_token == pytest.approx(0.001)


def test_the_exact_grid_whatever_the_crowd():
    exact = ChunkPlanner(64, grid=True, slice_seconds=0.2, costs=StepCosts())
    assert [exact.end(start, 300, 0, crowded=True) for start in (0, 64, 256)] == [64, 128, 300]


def test_longrope_s_first_long_chunk_is_never_cut():
    assert planner().end(0, 9000, 4160, crowded=True) == 4160


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_short_request_waits_for_one_slice_of_a_long_prompt_not_a_chunk(mode):
    engine = fake_engine([1, 2, 3], text_pieces(b"a", b"b", b"c"), prefill_chunk=64, prefix_cache=mode)
    script = engine.model.script
    script.step_seconds, script.token_seconds = 0.1, 0.01  # the slice (0.2 s) holds 10 prompt tokens
    try:
        generate(engine, np.arange(1, 21), max_tokens=3, temperature=0)  # the engine learns its step costs
        measured = len(script.chunks)
        gate = script.gate = threading.Semaphore(0)
        long = engine.submit(np.arange(100, 400) % 60 + 1, SamplingParams(max_tokens=2, temperature=0))
        gate.release()  # the long prompt's first chunk, alone: a whole one
        while len(script.chunks) == measured:
            pass
        short = engine.submit(np.arange(30, 45), SamplingParams(max_tokens=5, temperature=0))
        for _ in range(1000):
            gate.release()
        collect(short)
        collect(long)
    finally:
        engine.stop()
    chunks = script.chunks[measured:]
    # The long prompt alone: whole chunks; its second was already under way when the short one came.
    assert chunks[:2] == [(0, 64), (64, 64)]
    # Then the short prompt: its 15 tokens fit in two slices of 10 (0.2 s), so they go in at once, before the long
    # one goes on, in slices while the short one runs; alone again, in whole chunks.
    assert chunks[2] == (0, 15)
    assert chunks[3:6] == [(128, 10), (138, 10), (148, 10)]  # while the short one decodes its 4 more tokens
    assert chunks[6:] == [(158, 34), (192, 64), (256, 44)]
