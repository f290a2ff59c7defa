"""A choice: the events the engine thread publishes, drained in order by the request side; cancellation."""

from __future__ import annotations

import threading

import numpy as np

from phi_api.engine.choice import Choice, Finished, TextDelta
from phi_api.engine.params import SamplingParams


def test_events_come_out_in_the_order_they_were_emitted_and_each_notifies():
    notified = []
    choice = Choice(np.array([1, 2]), SamplingParams(max_tokens=3), timeout=10, notify=lambda: notified.append(1))
    events = [TextDelta("a"), TextDelta("b"), Finished("stop", 2, 2, 0.1, 0.2)]
    for event in events:
        choice.emit(event)
    assert choice.drain() == events and choice.drain() == [] and len(notified) == 3


def test_events_emitted_from_another_thread_all_arrive():
    choice = Choice(np.array([1]), SamplingParams(max_tokens=1), timeout=10, notify=lambda: None)
    writer = threading.Thread(target=lambda: [choice.emit(TextDelta(str(i))) for i in range(5000)])
    writer.start()
    seen: list = []
    while writer.is_alive() or len(seen) < 5000:
        seen += choice.drain()
    writer.join()
    assert [event.text for event in seen] == [str(i) for i in range(5000)]


def test_the_deadline_is_the_submission_plus_the_timeout_and_cancel_is_a_flag():
    choice = Choice(np.array([1]), SamplingParams(max_tokens=1), timeout=7.5, notify=lambda: None)
    assert choice.deadline - choice.submitted_at == 7.5 and not choice.cancelled
    choice.cancel()
    assert choice.cancelled


def test_finished_says_whether_it_answered_and_its_decode_rate():
    assert Finished("length", 3, 5, 0.1, 2.0).ok and Finished("stop", 3, 5, 0.1, 2.0).ok
    assert not Finished("timeout", 3, 0, None, 0.0).ok
    assert Finished("stop", 3, 5, 0.1, 2.0).decode_tokens_per_second == 2.0  # 4 tokens after the first
    assert Finished("stop", 3, 1, 0.1, 0.0).decode_tokens_per_second is None
