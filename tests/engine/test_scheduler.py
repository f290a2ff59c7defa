"""The engine thread: stopping rules, interleaving, cancellation, failures (fake model)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from phi_api.engine import Engine, Finished, SamplingParams, TextDelta
from tests.support.fakes import EOS, FakeModel, Script, text_pieces

PIECES = text_pieces(b"a", b"b", b"c", b"<", b"/", b">")


def run(engine: Engine, prompt_length: int = 5, **params) -> tuple[str, Finished]:
    generation = engine.submit(np.arange(1, prompt_length + 1, dtype=np.int32), SamplingParams(**params))
    text, finished = [], None
    for event in generation.events():
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            finished = event
    generation.close()
    return "".join(text), finished


@pytest.fixture
def engine_for():
    engines = []

    def build(tokens, *, gate=None, fail_at=None, prefill_chunk=4, timeout=60.0, lanes=1):
        script = Script(tokens, gate=gate, fail_at=fail_at)
        engine = Engine(FakeModel(script, PIECES), prefill_chunk=prefill_chunk, timeout=timeout, lanes=lanes)
        engines.append(engine)
        return engine, script

    yield build
    for engine in engines:
        engine.stop()


def test_end_of_sequence_finishes_with_stop_and_counts_every_generated_token(engine_for):
    engine, _ = engine_for([1, 2, 3, EOS])
    text, finished = run(engine, max_tokens=50)
    assert text == "abc"
    assert (finished.reason, finished.completion_tokens, finished.prompt_tokens) == ("stop", 4, 5)


def test_max_tokens_finishes_with_length(engine_for):
    engine, _ = engine_for([1, 2, 3])
    text, finished = run(engine, max_tokens=5)
    assert text == "abcab"
    assert (finished.reason, finished.completion_tokens) == ("length", 5)


def test_stop_string_ends_the_text_just_before_it(engine_for):
    engine, script = engine_for([1, 2, 4, 5, 6, 3, 3, 3])
    text, finished = run(engine, max_tokens=50, stop=("</>",))
    assert text == "ab"
    assert finished.reason == "stop"
    assert finished.completion_tokens == 5  # generation stopped as soon as the stop string appeared
    assert all(generator.closed for generator in engine.model.generators)


def test_ignore_eos_keeps_generating_up_to_max_tokens(engine_for):
    engine, script = engine_for([1, EOS])
    text, finished = run(engine, max_tokens=6, ignore_eos=True)
    assert finished.reason == "length" and finished.completion_tokens == 6
    assert script.options[0]["min_length"] == script.options[0]["max_length"] == 5 + 6


def test_prompt_is_prefilled_in_chunks(engine_for):
    engine, script = engine_for([EOS], prefill_chunk=4)
    run(engine, prompt_length=10, max_tokens=3)
    assert script.steps[:3] == ["prefill:4", "prefill:4", "prefill:2"]


@pytest.mark.parametrize("prompt_length", [1, 3, 4, 5, 8, 9, 13])
def test_prompt_chunks_lie_on_a_fixed_grid_whatever_the_prompt_length(engine_for, prompt_length):
    engine, script = engine_for([EOS], prefill_chunk=4)
    run(engine, prompt_length=prompt_length, max_tokens=3)
    assert script.chunks == [(offset, min(4, prompt_length - offset)) for offset in range(0, prompt_length, 4)]


def test_jobs_take_turns_step_by_step(engine_for):
    gate = threading.Semaphore(0)
    engine, script = engine_for([1, 2, 3], gate=gate, prefill_chunk=100)
    first = engine.submit(np.arange(1, 4, dtype=np.int32), SamplingParams(max_tokens=4))
    second = engine.submit(np.arange(1, 4, dtype=np.int32), SamplingParams(max_tokens=4))
    for _ in range(8):
        gate.release()
    results = []
    for generation in (first, second):
        events = list(generation.events())
        results.append(events[-1])
        generation.close()
    assert [r.reason for r in results] == ["length", "length"]
    tokens = [step for step in script.steps if step.startswith(("token", "prefill"))]
    # both prompts are prefilled before either finishes: nobody waits for a whole answer
    assert tokens.index("prefill:3", 1) < 4


def test_close_cancels_the_generation_and_frees_its_generator(engine_for):
    gate = threading.Semaphore(0)
    engine, script = engine_for([1, 2, 3], gate=gate)
    model = engine.model
    generation = engine.submit(np.arange(1, 4, dtype=np.int32), SamplingParams(max_tokens=1000))
    gate.release()
    events = generation.events()
    assert isinstance(next(events), TextDelta)
    generation.cancel()
    for _ in range(3):
        gate.release()
    finished = [event for event in events if isinstance(event, Finished)]
    generation.close()
    assert finished[0].reason == "cancelled"
    assert finished[0].completion_tokens < 1000
    assert all(generator.closed for generator in model.generators)


def test_timeout_ends_the_generation(engine_for):
    gate = threading.Semaphore(0)
    engine, _ = engine_for([1], gate=gate, timeout=0.05)
    generation = engine.submit(np.arange(1, 4, dtype=np.int32), SamplingParams(max_tokens=1000))
    released = threading.Timer(0.2, lambda: [gate.release() for _ in range(5)])
    released.start()
    finished = [event for event in generation.events() if isinstance(event, Finished)]
    generation.close()
    released.join()
    assert finished[0].reason == "timeout"


def test_an_engine_failure_ends_that_job_only(engine_for):
    engine, _ = engine_for([1, 2, 3], fail_at=1)
    text, finished = run(engine, max_tokens=10)
    assert finished.reason == "error" and "fake engine failure" in finished.error
    assert text == "a"
    engine.model.script.fail_at = None
    _, healthy = run(engine, max_tokens=3)
    assert healthy.reason == "length"


def test_search_options_are_set_explicitly():
    options = SamplingParams(max_tokens=10, temperature=0.0, seed=-1).search_options(7)
    assert options["max_length"] == 17
    assert options["do_sample"] is False
    assert options["top_k"] == 0  # never the model folder's default of 50
    assert 0 <= options["random_seed"] < 2**31
    sampled = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, top_k=5).search_options(1)
    assert (sampled["do_sample"], sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (True, 0.8, 0.9, 5)


def test_lanes_run_generations_on_separate_threads(engine_for):
    gate = threading.Semaphore(0)  # neither generation can finish before both are submitted
    engine, _ = engine_for([1, 2, 3], lanes=2, gate=gate)
    generations = [engine.submit(np.arange(1, 4, dtype=np.int32), SamplingParams(max_tokens=20)) for _ in range(2)]
    for _ in range(40):
        gate.release()
    for generation in generations:
        assert list(generation.events())[-1].reason == "length"
        generation.close()
    threads = [generator.threads for generator in engine.model.generators]
    assert all(len(used) == 1 for used in threads)  # a generation stays on its lane
    assert threads[0] != threads[1]  # the second went to the idle lane
