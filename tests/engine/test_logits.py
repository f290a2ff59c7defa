"""OpenAI's presence/frequency penalties and logit_bias, applied to logits."""

from __future__ import annotations

import numpy as np
import pytest

from phi_api.engine import SamplingParams
from phi_api.engine.logits import LogitsEditor


def edited(params: SamplingParams, seen: list[int], size: int = 8) -> np.ndarray:
    editor = LogitsEditor(params)
    for token in seen:
        editor.observe(token)
    logits = np.zeros(size, dtype=np.float32)
    editor(logits)
    return logits


def test_frequency_penalty_scales_with_the_count_and_presence_penalty_does_not():
    logits = edited(SamplingParams(max_tokens=1, frequency_penalty=0.5, presence_penalty=0.25), [3, 3, 3, 5])
    assert logits[3] == pytest.approx(-(3 * 0.5 + 0.25))
    assert logits[5] == pytest.approx(-(1 * 0.5 + 0.25))
    assert logits[0] == 0 and logits[7] == 0


def test_negative_penalties_encourage_repetition():
    logits = edited(SamplingParams(max_tokens=1, presence_penalty=-2.0), [1])
    assert logits[1] == pytest.approx(2.0)


def test_logit_bias_adds_to_the_listed_tokens_from_the_first_step():
    logits = edited(SamplingParams(max_tokens=1, logit_bias=((2, 100.0), (4, -100.0))), [])
    assert (logits[2], logits[4], logits[0]) == (100.0, -100.0, 0.0)


def test_only_requests_that_need_it_pay_for_logits_processing():
    assert not SamplingParams(max_tokens=1).edits_logits
    assert SamplingParams(max_tokens=1, presence_penalty=0.1).edits_logits
    assert SamplingParams(max_tokens=1, logit_bias=((1, 1.0),)).edits_logits
