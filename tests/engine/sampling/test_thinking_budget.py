"""A thinking budget in the sampler: once a reasoning model has thought that many tokens, its end marker is the
only token left; before the thinking opens and after it closes, nothing is masked."""

from __future__ import annotations

import numpy as np

from phi_api.engine.params import SamplingParams, ThinkingBudget
from phi_api.engine.sampling.logits import Sampler

START, END, VOCAB = 5, 6, 16


def sampler(tokens: int, inside: bool = False) -> Sampler:
    params = SamplingParams(max_tokens=32, temperature=0.0, thinking=ThinkingBudget(START, END, tokens, inside))
    return Sampler(params, np.array([1, 2], dtype=np.int32), frozenset({0}))


def pick(sampler_: Sampler, favourite: int) -> int:
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[favourite] = 5.0
    return sampler_.choose(logits)[0]


def test_the_end_marker_comes_once_the_budget_is_spent():
    thinking = sampler(2)
    assert not thinking.plain_greedy  # a batch's argmax would skip the mask
    assert [pick(thinking, token) for token in (3, START, 7, 8, 9, 10)] == [3, START, 7, 8, END, 10]


def test_a_prompt_that_opened_the_thinking_counts_from_the_first_token():
    opened = sampler(1, inside=True)
    assert [pick(opened, token) for token in (7, 8, 9)] == [7, END, 9]


def test_a_budget_of_nothing_closes_the_thinking_at_once():
    at_once = sampler(0)
    assert [pick(at_once, token) for token in (START, 7, 8)] == [START, END, 8]
