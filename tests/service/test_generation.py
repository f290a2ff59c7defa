"""The one generation path: the error for a generation that gave no answer, and the deadline of a run's events."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from phi_api.engine import Finished
from phi_api.engine.choice import TextDelta
from phi_api.errors import ContextLengthExceededError, GenerationTimeoutError, InternalError
from phi_api.service.generation import events, failure


def choice(completion: int, cached: int = 0, ttft: float | None = 0.5, decode: float = 2.0, index: int = 0,
           first: bool = True, prompt: int = 100) -> Finished:
    return Finished("stop", prompt, completion, ttft, decode, cached_tokens=cached, index=index, first_of_prompt=first)


def test_a_timeout_is_a_timeout_error_a_request_that_no_longer_fits_a_400_and_anything_else_an_internal_one():
    assert isinstance(failure(Finished("timeout", 1, 0, None, 0.0)), GenerationTimeoutError)
    capacity = failure(Finished("capacity", 1, 0, None, 0.0))
    assert isinstance(capacity, ContextLengthExceededError) and capacity.status == 400
    grammar = failure(Finished("grammar", 1, 0, None, 0.0, "the grammar cannot continue: <the grammar>"))
    assert grammar.status == 400 and "vocabulary" in grammar.message and "<the grammar>" not in grammar.message
    assert isinstance(failure(Finished("error", 1, 0, None, 0.0, "trace")), InternalError)


def buffered_run(deadline: float, deltas: int) -> SimpleNamespace:
    """A run whose engine is done: its answer's events wait for the reader, with no silence between them."""
    generation = SimpleNamespace(events=lambda idle_timeout: iter([TextDelta("a")] * deltas))
    return SimpleNamespace(plan=SimpleNamespace(params=[None], tools=None, reasoning=None), generation=generation,
                           deadline=deadline, observe=lambda finished: None)


def test_a_reader_slower_than_the_answer_meets_the_run_s_deadline_at_its_next_event():
    told = events(buffered_run(time.monotonic() + 3600, 3))
    assert [event.text for event in told] == ["a", "a", "a"]
    late = events(buffered_run(time.monotonic() - 1, 3))  # the deadline passed while the events waited
    with pytest.raises(GenerationTimeoutError):
        next(late)


def test_a_run_s_generation_is_closed_even_when_a_close_callback_fails():
    from phi_api.service.generation import Run

    closed, released = [], []

    def close(then) -> None:
        closed.append(then)

    generation = SimpleNamespace(close=close)
    slot = SimpleNamespace(release=lambda: released.append(1))

    def failing() -> None:
        raise RuntimeError("a callback's failure")

    run = Run(None, None, None, generation, slot, on_close=[failing])
    with pytest.raises(RuntimeError):
        run.close()
    assert released == [1] and len(closed) == 1  # the slot, and the engine's rows, given back
