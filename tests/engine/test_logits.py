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


def test_min_p_keeps_tokens_near_the_most_likely_at_the_request_s_temperature():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    LogitsEditor(SamplingParams(max_tokens=1, temperature=1.0, min_p=0.2))(logits)
    assert np.isfinite(logits[:3]).all() and logits[3] == -np.inf  # 0.05 < 0.2 * 0.5
    hotter = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    LogitsEditor(SamplingParams(max_tokens=1, temperature=2.0, min_p=0.2))(hotter)
    assert np.isfinite(hotter).all()  # at temperature 2 the distribution is flatter: all stay


def test_min_p_is_moot_for_greedy_decoding():
    assert not SamplingParams(max_tokens=1, temperature=0, min_p=0.5).edits_logits


def test_logprobs_come_from_the_model_s_distribution_before_edits():
    editor = LogitsEditor(SamplingParams(max_tokens=1, logprobs=2, logit_bias=((0, 100.0),)))
    logits = np.array([1.0, 3.0, 2.0, 0.0], dtype=np.float32)
    editor(logits)
    record = editor.observe(0)  # the bias made token 0 the choice
    normalizer = np.log(np.exp([1.0, 3.0, 2.0, 0.0]).sum())
    assert record.logprob == pytest.approx(1.0 - normalizer, rel=1e-5)
    assert [token for token, _ in record.top] == [1, 2]
    assert record.top[0][1] == pytest.approx(3.0 - normalizer, rel=1e-5)


def test_no_records_unless_asked():
    editor = LogitsEditor(SamplingParams(max_tokens=1, presence_penalty=1.0))
    editor(np.zeros(4, dtype=np.float32))
    assert editor.observe(1) is None


def test_asking_for_more_alternatives_than_the_vocabulary_holds_lists_them_all():
    editor = LogitsEditor(SamplingParams(max_tokens=1, logprobs=20))
    editor(np.array([1.0, 3.0, 2.0], dtype=np.float32))
    assert [token for token, _ in editor.observe(1).top] == [1, 2, 0]
