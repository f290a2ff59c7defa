"""Prompt reuse: which kept generation serves a new prompt, and the memory bound."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine import Finished, SamplingParams
from phi_api.engine.cache import MIN_REUSED_TOKENS, PromptCache, common_prefix, resume_point
from tests.support.fakes import fake_engine, text_pieces


class Kept:
    def __init__(self):
        self.rewound_to = None
        self.closed = False

    def rewind_to(self, length):
        self.rewound_to = length

    def close(self):
        self.closed = True


def tokens(*values):
    return np.array(values, dtype=np.int32)


def test_common_prefix():
    assert common_prefix(tokens(1, 2, 3), tokens(1, 2, 4, 5)) == 2
    assert common_prefix(tokens(1, 2), tokens(1, 2, 3)) == 2
    assert common_prefix(tokens(9), tokens(1)) == 0


def test_takes_the_longest_usable_prefix_and_rewinds_to_it():
    cache = PromptCache(budget_bytes=10_000, bytes_per_token=1)
    short, long = Kept(), Kept()
    cache.put(short, np.arange(20, dtype=np.int32), 100, "k")
    cache.put(long, np.arange(40, dtype=np.int32), 100, "k")
    prompt = np.concatenate([np.arange(30, dtype=np.int32), tokens(99, 98)])
    generator, reused, capacity = cache.take(prompt, 80, "k")
    assert generator is long and reused == 30 and long.rewound_to == 30 and capacity == 100
    assert cache.take(prompt, 80, "k")[0] is short  # taken generators leave the cache


def test_an_identical_prompt_keeps_a_token_to_compute():
    cache = PromptCache(10_000, 1)
    cache.put(Kept(), np.arange(30, dtype=np.int32), 100, "k")
    assert cache.take(np.arange(30, dtype=np.int32), 50, "k")[1] == 29


@pytest.mark.parametrize("shared,prompt_length,chunk,expected", [
    (30, 40, 1, 30), (30, 40, 8, 24), (32, 40, 8, 32), (31, 40, 8, 24), (40, 40, 8, 32), (41, 41, 8, 40),
    (16, 40, 16, 16), (15, 40, 16, 0), (64, 64, 64, 0), (65, 66, 64, 64),
])
def test_reuse_resumes_only_on_the_prefill_grid(shared, prompt_length, chunk, expected):
    assert resume_point(shared, prompt_length, chunk) == expected


def test_the_cache_resumes_kept_generators_on_the_chunk_grid():
    cache = PromptCache(10_000, 1, chunk=8)
    kept = Kept()
    cache.put(kept, np.arange(30, dtype=np.int32), 100, "k")
    generator, reused, _ = cache.take(np.arange(40, dtype=np.int32), 50, "k")
    assert (generator, reused, kept.rewound_to) == (kept, 24, 24)


@pytest.mark.parametrize("key,needed,prompt_length", [("other", 50, 30), ("k", 101, 30), ("k", 50, 10)])
def test_no_reuse_across_options_beyond_capacity_or_for_short_prefixes(key, needed, prompt_length):
    cache = PromptCache(10_000, 1)
    cache.put(Kept(), np.arange(40, dtype=np.int32), 100, "k")
    assert cache.take(np.arange(prompt_length, dtype=np.int32), needed, key) is None


def test_memory_is_bounded_and_the_least_recent_goes_first():
    cache = PromptCache(budget_bytes=250, bytes_per_token=1)
    first, second, third = Kept(), Kept(), Kept()
    cache.put(first, np.arange(20, dtype=np.int32), 100, "k")
    cache.put(second, np.arange(20, dtype=np.int32), 100, "k")
    cache.put(third, np.arange(20, dtype=np.int32), 100, "k")
    assert first.closed and not second.closed and not third.closed
    assert cache.held_bytes == 200
    too_big = Kept()
    assert cache.put(too_big, np.arange(20, dtype=np.int32), 300, "k") is False


def run(engine, prompt, **params):
    generation = engine.submit(np.asarray(prompt, dtype=np.int32), SamplingParams(**params))
    finished = [event for event in generation.events() if isinstance(event, Finished)][0]
    generation.close()
    return finished


@pytest.fixture
def cached_engine():
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"a", b"b", b"c"), cache_bytes=10_000, cache_headroom=50,
                         prefill_chunk=10)
    yield engine
    engine.stop()


def test_the_next_turn_reuses_the_conversation_so_far(cached_engine):
    first_prompt = list(range(1, 31))
    assert run(cached_engine, first_prompt, max_tokens=10, temperature=0).cached_tokens == 0
    # the next turn: the whole first prompt, the answer (a, b, c), and a new message
    second = run(cached_engine, first_prompt + [1, 2, 3] + [7, 8, 9], max_tokens=10, temperature=0)
    assert second.cached_tokens == 30  # the prompt; the answer is prefilled again, for exact numerics
    steps = cached_engine.model.script.steps
    assert "rewind:30" in steps
    assert steps[steps.index("rewind:30") + 1] == "prefill:6"  # the answer and the new message only
    assert len(cached_engine.model.generators) == 1  # no new generator was made


def test_different_sampling_or_a_seed_starts_fresh(cached_engine):
    prompt = list(range(1, 31))
    run(cached_engine, prompt, max_tokens=10, temperature=0)
    assert run(cached_engine, prompt + [5], max_tokens=10, temperature=0.7).cached_tokens == 0
    assert run(cached_engine, prompt + [5], max_tokens=10, temperature=0.7, seed=3).cached_tokens == 0
    assert run(cached_engine, prompt + [5], max_tokens=10, temperature=0, ignore_eos=True).cached_tokens == 0


def test_kept_generators_have_room_for_the_next_turn(cached_engine):
    run(cached_engine, list(range(1, 31)), max_tokens=10, temperature=0)
    assert cached_engine.model.script.options[0]["max_length"] == 30 + 10 + 50


@pytest.mark.parametrize("chunk", [1, 3, 4, 8])
@pytest.mark.parametrize("first,extra", [(16, 1), (16, 2), (17, 5), (23, 1), (24, 1), (24, 8), (25, 9), (31, 2)])
def test_a_reused_prompt_is_computed_in_exactly_the_chunks_of_a_cold_one(chunk, first, extra):
    """What makes reuse exact on any CPU: the same shapes, offsets and past lengths as a cold prefill."""
    prompt = list(range(1, first + extra + 1))
    cold = fake_engine([0], text_pieces(b"a"), prefill_chunk=chunk)
    warm = fake_engine([0], text_pieces(b"a"), prefill_chunk=chunk, cache_bytes=10_000, cache_headroom=50)
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
    kept = [(offset, length) for offset, length in first_chunks if offset + length <= reused]
    computed = warm.model.script.chunks[len(first_chunks):]
    assert kept + computed == cold.model.script.chunks
