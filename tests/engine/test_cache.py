"""Prompt reuse: which kept generation serves a new prompt, and the memory bound."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine import Finished, SamplingParams
from phi_api.engine.cache import PromptCache, common_prefix
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


def test_an_identical_prompt_keeps_two_tokens_to_append():
    cache = PromptCache(10_000, 1)
    cache.put(Kept(), np.arange(30, dtype=np.int32), 100, "k")
    assert cache.take(np.arange(30, dtype=np.int32), 50, "k")[1] == 28


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
                         prefill_chunk=100)
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
