"""Prompt reuse: which kept prefix serves a new prompt, on the chunk grid, within the memory bound."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine.cache import MIN_REUSED_TOKENS, PromptCache, common_prefix, resume_point
from tests.support.fakes import fake_engine, text_pieces
from tests.support.generations import generate


def tokens(*values):
    return np.array(values, dtype=np.int32)


def kv_of(length: int, fill: float = 1.0) -> np.ndarray:
    """Keys and values of ``length`` tokens (1 layer, 1 head, head size 2): 16 bytes a token."""
    return np.full((1, 2, 1, length, 2), fill, dtype=np.float32)


def test_common_prefix():
    assert common_prefix(tokens(1, 2, 3), tokens(1, 2, 4, 5)) == 2
    assert common_prefix(tokens(1, 2), tokens(1, 2, 3)) == 2
    assert common_prefix(tokens(9), tokens(1)) == 0


def test_takes_the_longest_usable_prefix():
    cache = PromptCache(budget_bytes=10_000)
    cache.put(np.arange(20, dtype=np.int32), kv_of(20, 1.0), "short")
    cache.put(np.arange(100, 140, dtype=np.int32), kv_of(40, 2.0), "short")
    cache.put(np.arange(40, dtype=np.int32), kv_of(40, 3.0), "short")  # replaces the first: it holds it too
    prompt = np.concatenate([np.arange(30, dtype=np.int32), tokens(99, 98)])
    reused, kv = cache.take(prompt, "short")
    assert reused == 30 and kv.shape == (1, 2, 1, 30, 2) and (kv == 3.0).all()


def test_an_identical_prompt_keeps_a_token_to_compute():
    cache = PromptCache(10_000)
    cache.put(np.arange(30, dtype=np.int32), kv_of(30), "short")
    assert cache.take(np.arange(30, dtype=np.int32), "short")[0] == 29


@pytest.mark.parametrize("shared,prompt_length,chunk,expected", [
    (30, 40, 1, 30), (30, 40, 8, 24), (32, 40, 8, 32), (31, 40, 8, 24), (40, 40, 8, 32), (41, 41, 8, 40),
    (16, 40, 16, 16), (15, 40, 16, 0), (64, 64, 64, 0), (65, 66, 64, 64),
])
def test_reuse_resumes_only_on_the_prefill_grid(shared, prompt_length, chunk, expected):
    assert resume_point(shared, prompt_length, chunk) == expected


def test_the_cache_keeps_and_resumes_on_the_chunk_grid():
    cache = PromptCache(10_000, chunk=8)
    assert cache.keepable(30) == 24 and cache.keepable(12) == 0  # below MIN_REUSED_TOKENS: not worth it
    cache.put(np.arange(24, dtype=np.int32), kv_of(24), "short")
    assert cache.take(np.arange(40, dtype=np.int32), "short")[0] == 24
    assert cache.take(np.concatenate([np.arange(20, dtype=np.int32), tokens(7, 7)]), "short")[0] == 16


def test_no_reuse_across_regimes_below_the_floor_or_for_short_prefixes():
    cache = PromptCache(10_000, chunk=8)
    cache.put(np.arange(40, dtype=np.int32), kv_of(40), "short")
    assert cache.take(np.arange(60, dtype=np.int32), "long") == (0, None)  # other rotary factors
    assert cache.take(np.arange(60, dtype=np.int32), "short", floor=48) == (0, None)
    assert cache.take(np.arange(10, dtype=np.int32), "short") == (0, None)


def test_memory_is_bounded_and_the_least_recent_goes_first():
    cache = PromptCache(budget_bytes=2 * 20 * 16)
    cache.put(np.arange(20, dtype=np.int32), kv_of(20), "short")
    cache.put(np.arange(100, 120, dtype=np.int32), kv_of(20), "short")
    cache.take(np.arange(21, dtype=np.int32), "short")  # the first is used again: now the most recent
    cache.put(np.arange(200, 220, dtype=np.int32), kv_of(20), "short")
    assert cache.held_bytes == 2 * 20 * 16
    assert cache.take(np.arange(100, 121, dtype=np.int32), "short") == (0, None)  # evicted
    assert cache.take(np.arange(21, dtype=np.int32), "short")[0] == 20
    assert cache.put(np.arange(50, dtype=np.int32), kv_of(50), "short") is False  # larger than the whole budget


def run(engine, prompt, **params):
    return generate(engine, prompt, **params)[1]


@pytest.fixture
def cached_engine():
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"a", b"b", b"c"), cache_bytes=10_000, prefill_chunk=10)
    yield engine
    engine.stop()


def test_the_next_turn_reuses_the_conversation_so_far(cached_engine):
    first_prompt = list(range(1, 31))
    assert run(cached_engine, first_prompt, max_tokens=10, temperature=0).cached_tokens == 0
    # the next turn: the whole first prompt, the answer (a, b, c), and a new message
    second = run(cached_engine, first_prompt + [1, 2, 3] + [7, 8, 9], max_tokens=10, temperature=0)
    assert second.cached_tokens == 30  # the prompt; the answer is prefilled again, for exact numerics
    assert cached_engine.model.script.chunks[-1] == (30, 6)  # the answer and the new message only


def test_any_sampling_options_reuse_a_kept_prompt(cached_engine):
    prompt = list(range(1, 31))
    run(cached_engine, prompt, max_tokens=10, temperature=0)
    assert run(cached_engine, prompt + [5], max_tokens=10, temperature=0.7, seed=3).cached_tokens == 30
    assert run(cached_engine, prompt + [5], max_tokens=10, temperature=0, ignore_eos=True).cached_tokens == 30


@pytest.mark.parametrize("chunk", [1, 3, 4, 8])
@pytest.mark.parametrize("first,extra", [(16, 1), (16, 2), (17, 5), (23, 1), (24, 1), (24, 8), (25, 9), (31, 2)])
def test_a_reused_prompt_is_computed_in_exactly_the_chunks_of_a_cold_one(chunk, first, extra):
    """What makes reuse exact on any CPU: the same shapes, offsets and past lengths as a cold prefill."""
    prompt = list(range(1, first + extra + 1))
    cold = fake_engine([0], text_pieces(b"a"), prefill_chunk=chunk)
    warm = fake_engine([0], text_pieces(b"a"), prefill_chunk=chunk, cache_bytes=10_000)
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
