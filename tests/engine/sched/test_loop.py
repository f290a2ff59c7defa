"""The engine thread: continuous batching, stopping rules, cancellation, failures (the real loop, fake model)."""

from __future__ import annotations

import gc
import threading
import weakref

import gevent
import numpy as np
import pytest

from phi_api.engine import CapacityError, Engine, EngineConfig, Finished, SamplingParams, TextDelta
from phi_api.engine.kv.ledger import row_bytes
from phi_api.errors import RetiredError
from tests.support.fakes import EOS, FakeDecoder, FakeModel, RecordingEngine, Script, text_pieces
from tests.support.generations import collect, generate
from tests.support.server import wait_until

PIECES = text_pieces(b"a", b"b", b"c", b"<", b"/", b">")
SPEC = FakeDecoder(Script([])).spec


def prompt(length: int, first: int = 1) -> np.ndarray:
    return np.arange(first, first + length, dtype=np.int32) % 60 + 1


def run(engine: Engine, prompt_length: int = 5, **params) -> tuple[str, Finished]:
    return generate(engine, prompt(prompt_length), **params)


@pytest.fixture
def engine_for():
    engines = []

    def build(tokens, *, gate=None, fail_at=None, prefill_chunk=4, timeout=60.0, kv_budget_bytes=1 << 20,
              max_rows=64, threads=1, rope_switch=None):
        script = Script(tokens, gate=gate, fail_at=fail_at)
        engine = RecordingEngine(FakeModel(script, PIECES, rope_switch=rope_switch), prefill_chunk=prefill_chunk,
                                 timeout=timeout, kv_budget_bytes=kv_budget_bytes, max_rows=max_rows,
                                 threads=threads)
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
    engine, _ = engine_for([1, 2, 4, 5, 6, 3, 3, 3])
    text, finished = run(engine, max_tokens=50, stop=("</>",))
    assert text == "ab"
    assert finished.reason == "stop"
    assert finished.completion_tokens == 5  # generation stopped as soon as the stop string appeared


def test_ignore_eos_and_min_tokens_hold_the_end_of_sequence_back(engine_for):
    engine, _ = engine_for([EOS])  # the model wants to end at every step
    _, finished = run(engine, max_tokens=6, ignore_eos=True)
    assert finished.reason == "length" and finished.completion_tokens == 6
    _, finished = run(engine, max_tokens=10, min_tokens=4)
    assert finished.reason == "stop" and finished.completion_tokens == 5  # EOS as soon as it is allowed


def test_prompt_is_prefilled_in_chunks(engine_for):
    engine, script = engine_for([EOS], prefill_chunk=4)
    run(engine, prompt_length=10, max_tokens=3)
    assert script.steps[:3] == ["prefill:4", "prefill:4", "prefill:2"]


@pytest.mark.parametrize("prompt_length", [1, 3, 4, 5, 8, 9, 13])
def test_prompt_chunks_lie_on_a_fixed_grid_whatever_the_prompt_length(engine_for, prompt_length):
    engine, script = engine_for([EOS], prefill_chunk=4)
    run(engine, prompt_length=prompt_length, max_tokens=3)
    assert script.chunks == [(offset, min(4, prompt_length - offset)) for offset in range(0, prompt_length, 4)]


def test_running_sequences_advance_together_in_one_step(engine_for):
    gate = threading.Semaphore(0)
    engine, script = engine_for([1, 2, 3], gate=gate, prefill_chunk=100)
    generations = [engine.submit(prompt(3, first), SamplingParams(max_tokens=6)) for first in (1, 20, 40)]
    for _ in range(100):
        gate.release()
    results = [collect(generation) for generation in generations]
    assert [(text, finished.reason) for text, finished in results] == [("abcabc", "length")] * 3
    decodes = [int(step.split(":")[1]) for step in script.steps if step.startswith("decode")]
    assert max(decodes) == 3  # all three in one batched step
    assert sum(decodes) == 3 * 5  # each row advanced once per step: no step was wasted or repeated


def test_a_new_request_joins_the_running_batch_and_a_finished_one_leaves_it(engine_for):
    gate = threading.Semaphore(0)
    engine, script = engine_for([1, 2, 3], gate=gate, prefill_chunk=100)
    long = engine.submit(prompt(3), SamplingParams(max_tokens=30))
    gate.release()  # the long one's prompt
    events = long.events()
    assert next(events).text == "a"
    short = engine.submit(prompt(4, 30), SamplingParams(max_tokens=3))
    for _ in range(200):
        gate.release()
    short_text, short_finished = collect(short)
    long_text = "a" + "".join(event.text for event in events if isinstance(event, TextDelta))
    long.close()
    assert (short_text, short_finished.reason) == ("abc", "length")  # its own script, from its own row
    assert long_text == ("abc" * 10)[:30]
    decodes = [int(step.split(":")[1]) for step in script.steps if step.startswith("decode")]
    assert 2 in decodes and decodes[-1] == 1  # joined, then left before the long one ended
    assert script.steps.index("prefill:4") < len(script.steps) - 20  # the newcomer did not wait for the end


def test_a_long_prompt_is_prefilled_between_the_running_steps(engine_for):
    gate = threading.Semaphore(0)
    engine, script = engine_for([1, 2, 3], gate=gate, prefill_chunk=4)
    running = engine.submit(prompt(2), SamplingParams(max_tokens=40))
    gate.release()
    events = running.events()
    next(events)
    newcomer = engine.submit(prompt(20, 30), SamplingParams(max_tokens=2))
    for _ in range(200):
        gate.release()
    collect(newcomer)
    running.close()
    # the newcomer's five chunks, each followed by a step of the running sequence; then it runs too
    start = script.steps.index("prefill:4", 1)
    assert script.steps[start:start + 10] == ["prefill:4", "decode:1"] * 4 + ["prefill:4", "decode:2"]


def test_n_choices_share_one_prefill_and_run_as_rows(engine_for):
    engine, script = engine_for([1, 2, 3])
    generation = engine.submit(prompt(10), [SamplingParams(max_tokens=3), SamplingParams(max_tokens=3)])
    texts = {0: "", 1: ""}
    finished = []
    for event in generation.events():
        if isinstance(event, TextDelta):
            texts[event.index] += event.text
        else:
            finished.append(event)
    generation.close()
    assert texts == {0: "abc", 1: "abc"} and {f.index for f in finished} == {0, 1}
    assert [step for step in script.steps if step.startswith("prefill")] == ["prefill:4", "prefill:4", "prefill:2"]
    assert "decode:2" in script.steps


def test_requests_beyond_the_budget_wait_for_room_then_run(engine_for):
    gate = threading.Semaphore(0)
    # Room for one request's 303 tokens, not two.
    engine, script = engine_for([1, 2, 3], gate=gate, kv_budget_bytes=int(1.5 * row_bytes(SPEC, 303)),
                                prefill_chunk=100)
    first = engine.submit(prompt(3), SamplingParams(max_tokens=300))
    second = engine.submit(prompt(3, 20), SamplingParams(max_tokens=300))
    for _ in range(1000):
        gate.release()
    results = [collect(first), collect(second)]
    assert [finished.reason for _, finished in results] == ["length", "length"]
    decodes = {int(step.split(":")[1]) for step in script.steps if step.startswith("decode")}
    assert decodes == {1}  # never together: the second waited until the first had left


def test_a_request_that_can_never_fit_is_refused_before_it_starts(engine_for):
    engine, script = engine_for([1], kv_budget_bytes=row_bytes(SPEC, 384))  # 384 tokens in all (the context: 512)
    engine.check_capacity(10, 374, 1)
    with pytest.raises(CapacityError, match="KV_CACHE_MB"):
        engine.check_capacity(10, 375, 1)
    engine.check_capacity(10, 182, 2)
    with pytest.raises(CapacityError):
        engine.check_capacity(1, 128, 3)  # 3 rows of 129 tokens: 387, in whole pages (64 tokens) 576


def test_close_cancels_the_generation(engine_for):
    gate = threading.Semaphore(0)
    engine, script = engine_for([1, 2, 3], gate=gate)
    generation = engine.submit(prompt(3), SamplingParams(max_tokens=1000))
    gate.release()
    events = generation.events()
    assert isinstance(next(events), TextDelta)
    generation.cancel()
    for _ in range(3):
        gate.release()
    finished = [event for event in events if isinstance(event, Finished)]
    generation.close()
    assert finished[0].reason == "cancelled"
    assert finished[0].completion_tokens < 10


def test_timeout_ends_the_generation(engine_for):
    gate = threading.Semaphore(0)
    engine, _ = engine_for([1], gate=gate, timeout=0.05)
    generation = engine.submit(prompt(3), SamplingParams(max_tokens=1000))
    released = threading.Timer(0.2, lambda: [gate.release() for _ in range(5)])
    released.start()
    finished = [event for event in generation.events() if isinstance(event, Finished)]
    generation.close()
    released.join()
    assert finished[0].reason == "timeout"


def test_a_failed_step_ends_its_rows_and_the_engine_goes_on(engine_for):
    engine, _ = engine_for([1, 2, 3], fail_at=1)
    text, finished = run(engine, max_tokens=10)
    assert finished.reason == "error" and "fake engine failure" in finished.error
    assert text == "ab"
    engine.model.script.fail_at = None
    _, healthy = run(engine, max_tokens=3)
    assert healthy.reason == "length"


def test_the_engine_thread_makes_its_session_with_the_worker_s_threads(engine_for):
    engine, script = engine_for([1, EOS], threads=3)
    run(engine, max_tokens=3)
    assert script.decoder_threads == [3]
    assert len(script.threads) == 1 and threading.get_ident() not in script.threads  # its own OS thread


def test_finished_rows_give_their_pages_back(engine_for):
    engine, _ = engine_for([1, EOS])
    run(engine, max_tokens=3)
    batch = engine.loop.batch
    wait_until(lambda: batch.idle, timeout=5, message="the engine idle")
    assert list(batch.rows.occupants()) == [] and batch.ledger.reserved == 0


def test_a_retired_engine_finishes_what_runs_takes_nothing_new_then_is_freed():
    gate = threading.Semaphore(0)
    engine = Engine(FakeModel(Script([1, 2, 3], gate=gate), PIECES), EngineConfig(prefill_chunk=4, timeout=60.0))
    running = engine.submit(prompt(3), SamplingParams(max_tokens=4))
    engine.retire()
    with pytest.raises(RetiredError):
        engine.submit(prompt(3), SamplingParams(max_tokens=4))
    for _ in range(8):
        gate.release()
    text, finished = collect(running)
    assert (text, finished.reason) == ("abca", "length")
    freed = weakref.ref(engine)
    del engine, running

    def engine_freed() -> bool:
        gevent.sleep(0.01)  # the hub delivers the thread's last message, which closes its relay
        return freed() is None

    gc.disable()  # freed by reference counting alone, as soon as its thread has ended
    try:
        wait_until(engine_freed, timeout=5, message="the retired engine freed")
    finally:
        gc.enable()


def test_a_sequence_reaching_the_rope_switch_is_prefilled_again_whole(engine_for):
    engine, script = engine_for([1, 2, 3], prefill_chunk=4, rope_switch=8)
    _, finished = run(engine, prompt_length=6, max_tokens=6)
    assert finished.reason == "length" and finished.completion_tokens == 6
    # 6 prompt tokens + 2 fed; the 9th would cross the switch: all nine again, in one step
    assert script.steps == ["prefill:4", "prefill:2", "decode:1", "decode:1", "prefill:9", "decode:1", "decode:1"]
    assert script.chunks[-1] == (0, 9)


def test_a_prompt_past_the_switch_starts_with_a_chunk_that_crosses_it(engine_for):
    engine, script = engine_for([1, 2, 3], prefill_chunk=4, rope_switch=8)
    run(engine, prompt_length=15, max_tokens=2)
    assert script.chunks == [(0, 12), (12, 3)]  # the first grid point past the switch, then the grid


def test_short_and_long_rows_never_share_a_step(engine_for):
    gate = threading.Semaphore(0)
    engine, script = engine_for([1, 2, 3], gate=gate, prefill_chunk=100, rope_switch=8)
    long = engine.submit(prompt(10), SamplingParams(max_tokens=12))  # long from its first chunk
    short = engine.submit(prompt(3, 30), SamplingParams(max_tokens=12))  # crosses after 5 steps
    for _ in range(500):
        gate.release()
    results = [collect(long), collect(short)]
    assert [finished.reason for _, finished in results] == ["length", "length"]
    crossing = script.steps.index("prefill:9")
    assert "decode:2" not in script.steps[:crossing]  # apart while one is short
    assert "decode:2" in script.steps[crossing:]  # together once both are long


class CountingGate:
    """A semaphore that says how many threads wait on it."""

    def __init__(self) -> None:
        self._semaphore = threading.Semaphore(0)
        self.waiting = 0

    def acquire(self) -> None:
        self.waiting += 1
        self._semaphore.acquire()
        self.waiting -= 1

    def release(self, count: int = 1) -> None:
        for _ in range(count):
            self._semaphore.release()


def _held_engine(engine_for):
    """An engine with one request running, its steps held by a gate: requests submitted now are all waiting
    when the gate opens."""
    gate = CountingGate()
    engine, script = engine_for([1, 2, 3], gate=gate, prefill_chunk=4)
    running = engine.submit(prompt(2), SamplingParams(max_tokens=400))
    gate.release(2)  # its prompt, and one step
    wait_until(lambda: gate.waiting == 1 and len(script.steps) == 2, timeout=5, message="the engine in a step")
    return engine, script, gate, running


def _prefill_owners(script: Script, firsts: dict[int, str]) -> list[str]:
    """Which request each prompt chunk after the running one's was (by the first token of each chunk)."""
    return [firsts.get(first, "?") for first in script.chunk_firsts[1:]]


def test_a_shorter_prompt_passes_the_oldest_at_most_once_in_a_row(engine_for):
    engine, script, gate, running = _held_engine(engine_for)
    # Every token of a prompt is distinct (ids 1..60), so a chunk's first token tells whose chunk it is.
    prompts = {"long": np.arange(1, 21), "short": np.arange(21, 24), "medium": np.arange(24, 32)}
    requests = [engine.submit(tokens.astype(np.int32), SamplingParams(max_tokens=1)) for tokens in prompts.values()]
    gate.release(100)
    for request in requests:
        collect(request)
    running.close()
    firsts = {int(tokens[start]): name for name, tokens in prompts.items() for start in range(0, len(tokens), 4)}
    # The shortest left first, but never twice in a row ahead of the oldest: short, long, medium, long, medium ...
    assert _prefill_owners(script, firsts) == ["short", "long", "medium", "long", "medium", "long", "long", "long"]


def test_a_long_prompt_keeps_its_place_while_short_prompts_keep_arriving(engine_for):
    engine, script, gate, running = _held_engine(engine_for)
    long_prompt = np.arange(1, 41)  # 10 chunks of 4
    shorts = [np.full(3, 41 + index % 19) for index in range(30)]  # shorter than any rest of the long prompt
    requests = [engine.submit(long_prompt.astype(np.int32), SamplingParams(max_tokens=1))]
    requests += [engine.submit(tokens.astype(np.int32), SamplingParams(max_tokens=1)) for tokens in shorts]
    gate.release(1000)
    for request in requests:
        collect(request)
    running.close()
    firsts = {int(long_prompt[start]): "long" for start in range(0, 40, 4)}
    owners = _prefill_owners(script, firsts)
    assert owners.count("long") == 10 and len(owners) == 40
    # Shortest-first alone would prefill all 30 short prompts first; by turns the long one gets every other chunk.
    assert max(index for index, owner in enumerate(owners) if owner == "long") <= 20, owners
