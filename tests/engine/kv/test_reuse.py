"""Prefix reuse: where a request may resume (by mode), which row serves it, and reuse through the real engine loop on
the fake model: next turns (answers included, or exactly), kept prefixes living in the key/value budget, and a
shared prefix computed once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from phi_api.engine import SamplingParams
from phi_api.engine.kv.ledger import row_bytes
from phi_api.engine.kv.reuse import MIN_REUSED_TOKENS, ReusePolicy, common_prefix
from phi_api.engine.kv.sequence import Kept
from tests.support.fakes import FakeDecoder, Script, fake_engine, text_pieces
from tests.support.generations import collect, generate

SPEC = FakeDecoder(Script([])).spec


def tokens(*values):
    return np.array(values, dtype=np.int64)


def kept(values, regime="short") -> Kept:
    return Kept(np.asarray(values, dtype=np.int64), regime, slot=0, used_at=0)


def test_common_prefix():
    assert common_prefix(tokens(1, 2, 3), tokens(1, 2, 4, 5)) == 2
    assert common_prefix(tokens(1, 2), tokens(1, 2, 3)) == 2
    assert common_prefix(tokens(9), tokens(1)) == 0


@pytest.mark.parametrize("shared,prompt_length,chunk,expected", [
    (30, 40, 1, 30), (30, 40, 8, 24), (32, 40, 8, 32), (31, 40, 8, 24), (40, 40, 8, 32), (41, 41, 8, 40),
    (16, 40, 16, 16), (15, 40, 16, 0), (64, 64, 64, 0), (65, 66, 64, 64),
])
def test_exact_reuse_resumes_only_on_the_prefill_grid(shared, prompt_length, chunk, expected):
    assert ReusePolicy("exact", chunk).resume_point(shared, prompt_length) == expected


@pytest.mark.parametrize("shared,prompt_length,expected", [(30, 40, 30), (40, 40, 39), (15, 40, 0), (16, 40, 16)])
def test_past_what_was_computed_exactly_reuse_resumes_anywhere_but_keeps_a_token_to_compute(shared, prompt_length,
                                                                                           expected):
    assert ReusePolicy("on", 64).resume_point(shared, prompt_length, exact_upto=0) == expected


@pytest.mark.parametrize("shared,exact_upto,expected", [(30, 40, 24), (40, 40, 40), (44, 40, 44), (30, 24, 30)])
def test_within_what_was_computed_exactly_reuse_resumes_on_the_grid(shared, exact_upto, expected):
    """So the same request sent twice is computed in the same chunks, and answers the same."""
    assert ReusePolicy("on", 8).resume_point(shared, 50, exact_upto=exact_upto) == expected


@pytest.mark.parametrize("shared,exact_upto,expected", [(30, 40, 30), (40, 40, 40), (44, 40, 44), (50, 50, 49)])
def test_where_cuts_are_free_reuse_resumes_anywhere_it_shares(shared, exact_upto, expected):
    """A graph computing each token on its own gives a prompt the same bits however it is cut: a request sent twice
    answers the same from wherever it resumes, and computes one token again rather than up to a chunk."""
    policy = ReusePolicy("on", 8, row_wise=True)
    assert policy.free_cuts
    assert policy.resume_point(shared, 50, exact_upto=exact_upto) == expected


def test_exact_mode_keeps_its_grid_on_a_row_wise_graph_too():
    policy = ReusePolicy("exact", 8, row_wise=True)
    assert not policy.free_cuts
    assert policy.resume_point(30, 50, exact_upto=40) == 24


def test_the_longest_usable_prefix_of_the_right_regime_serves():
    policy = ReusePolicy("on", 8)
    rows = [kept(range(20)), kept(range(100, 140)), kept(range(40), "long"), kept(range(25))]
    prompt = np.concatenate([np.arange(30), tokens(99, 98)])
    assert policy.best_source(prompt, "short", 0, rows) == (rows[3], 25)
    assert policy.best_source(prompt, "long", 0, rows) == (rows[2], 30)
    assert policy.best_source(prompt, "long", 32, rows) == (None, 0)  # LongRoPE's first chunk is never split
    assert policy.best_source(np.arange(10), "short", 0, rows) == (None, 0)  # below MIN_REUSED_TOKENS
    assert ReusePolicy("off", 8).best_source(prompt, "short", 0, rows) == (None, 0)


def run(engine, prompt, **params):
    return generate(engine, prompt, **params)[1]


@pytest.fixture
def engines():
    made = []

    def make(mode="on", **options):
        engine = fake_engine([1, 2, 3, 0], text_pieces(b"a", b"b", b"c"), prefix_cache=mode,
                             prefill_chunk=options.pop("prefill_chunk", 10), **options)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.stop()


def test_the_next_turn_reuses_the_conversation_so_far_answer_included(engines):
    engine = engines("on")
    first_prompt = list(range(1, 31))
    assert run(engine, first_prompt, max_tokens=10, temperature=0).cached_tokens == 0
    # the next turn: the whole first prompt, the answer (a, b, c: fed to the model), and a new message
    second = run(engine, first_prompt + [1, 2, 3] + [7, 8, 9], max_tokens=10, temperature=0)
    assert second.cached_tokens == 33
    assert engine.model.script.chunks[-1] == (33, 3)  # only the new message is computed


def test_exactly_the_next_turn_reuses_the_prompt_and_computes_the_answer_again(engines):
    engine = engines("exact")
    first_prompt = list(range(1, 31))
    run(engine, first_prompt, max_tokens=10, temperature=0)
    second = run(engine, first_prompt + [1, 2, 3] + [7, 8, 9], max_tokens=10, temperature=0)
    assert second.cached_tokens == 30  # the prompt, on the grid of 10; the answer is prefilled again
    assert engine.model.script.chunks[-1] == (30, 6)


def test_the_same_request_twice_is_computed_in_the_same_last_chunk(engines):
    engine = engines("on", prefill_chunk=8)
    prompt = list(range(1, 38))
    run(engine, prompt, max_tokens=10, temperature=0)
    cold_chunks = list(engine.model.script.chunks)
    assert run(engine, prompt, max_tokens=10, temperature=0).cached_tokens == 32
    assert engine.model.script.chunks[len(cold_chunks):] == [cold_chunks[-1]] == [(32, 5)]


def test_nothing_is_reused_when_off(engines):
    engine = engines("off")
    prompt = list(range(1, 31))
    run(engine, prompt, max_tokens=10, temperature=0)
    assert run(engine, prompt + [5], max_tokens=10, temperature=0).cached_tokens == 0


def test_any_sampling_options_reuse_a_kept_prompt(engines):
    engine = engines("on")
    prompt = list(range(1, 31))
    run(engine, prompt, max_tokens=10, temperature=0)
    assert run(engine, prompt + [5], max_tokens=10, temperature=0.7, seed=3).cached_tokens >= 30
    assert run(engine, prompt + [5], max_tokens=10, temperature=0, ignore_eos=True).cached_tokens >= 30


@pytest.mark.parametrize("chunk", [1, 3, 4, 8])
@pytest.mark.parametrize("first,extra", [(16, 1), (16, 2), (17, 5), (23, 1), (24, 1), (24, 8), (25, 9), (31, 2)])
def test_an_exactly_reused_prompt_is_computed_in_exactly_the_chunks_of_a_cold_one(chunk, first, extra):
    """What makes reuse exact on any CPU: the same shapes, offsets and past lengths as a cold prefill."""
    prompt = list(range(1, first + extra + 1))
    cold = fake_engine([0], text_pieces(b"a"), prefill_chunk=chunk, prefix_cache="exact")
    warm = fake_engine([0], text_pieces(b"a"), prefill_chunk=chunk, prefix_cache="exact")
    try:
        run(cold, prompt, max_tokens=4, temperature=0)
        run(warm, prompt[:first], max_tokens=4, temperature=0)
        first_chunks = list(warm.model.script.chunks)
        reused = run(warm, prompt, max_tokens=4, temperature=0).cached_tokens
    finally:
        cold.stop()
        warm.stop()
    on_grid = (min(first, len(prompt) - 1) // chunk) * chunk
    assert reused == (on_grid if on_grid >= MIN_REUSED_TOKENS else 0)
    kept_chunks = [(offset, length) for offset, length in first_chunks if offset + length <= reused]
    computed = warm.model.script.chunks[len(first_chunks):]
    assert kept_chunks + computed == cold.model.script.chunks


def test_kept_prefixes_leave_least_recently_used_first_when_a_request_needs_the_room(engines):
    # Room for two requests' reserves (40 tokens each: one page of 64 tokens), not three.
    engine = engines("on", kv_budget_bytes=2 * row_bytes(SPEC, 40))
    prompts = [list(range(start, start + 20)) for start in (1, 21, 41)]
    for prompt in prompts[:2]:
        run(engine, prompt, max_tokens=20, temperature=0)
    batch = engine.loop.batch
    assert len(batch.ledger.kept) == 2  # both kept: nothing needed their room
    run(engine, prompts[0] + [9], max_tokens=20, temperature=0)  # the first is used again (and kept again)
    run(engine, prompts[2], max_tokens=20, temperature=0)  # needs room: the least recently used leaves
    assert sorted(int(kept.tokens[0]) for kept in batch.ledger.kept) == [1, 41]
    assert run(engine, prompts[0] + [9, 9], max_tokens=20, temperature=0).cached_tokens == 20  # kept: reused


def test_a_prefix_shared_by_a_burst_is_computed_once(engines):
    gate = threading.Semaphore(0)
    engine = engines("on", prefill_chunk=8, gate=gate)
    system = list(range(1, 41))
    generations = [engine.submit(np.array(system + [50 + index], dtype=np.int32),
                                 SamplingParams(max_tokens=2, temperature=0)) for index in range(4)]
    for _ in range(200):
        gate.release()
    results = [collect(generation)[1] for generation in generations]
    assert sorted(result.cached_tokens for result in results) == [0, 40, 40, 40]
    computed = sum(length for offset, length in engine.model.script.chunks)
    assert computed == 41 + 3  # the shared 40 tokens once, then each request's own last token
