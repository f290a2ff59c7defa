"""A sequence's choice of token: OpenAI's penalties and logit_bias, the repetition penalty, masks, sampling."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from phi_api.engine import SamplingParams
from phi_api.engine.sampling.logits import LogitsEditor, Sampler, _draw, distribution, sample


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
    LogitsEditor(SamplingParams(max_tokens=1, temperature=1.0, min_p=0.2)).apply_min_p(logits)
    assert np.isfinite(logits[:3]).all() and logits[3] == -np.inf  # 0.05 < 0.2 * 0.5
    hotter = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    LogitsEditor(SamplingParams(max_tokens=1, temperature=2.0, min_p=0.2)).apply_min_p(hotter)
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


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    editor = LogitsEditor(SamplingParams(max_tokens=1, repetition_penalty=2.0), prompt=[1])
    editor.observe(2)
    logits = np.array([4.0, 4.0, -4.0, 4.0], dtype=np.float32)
    editor(logits)
    assert logits.tolist() == [4.0, 2.0, -8.0, 4.0]  # the prompt's token 1 and the generated token 2


def test_a_vanishing_repetition_penalty_pushes_seen_logits_to_infinity_without_a_warning():
    """numpy's overflow warning goes to stderr past the log's formatter: a line a client's value could cause."""
    editor = LogitsEditor(SamplingParams(max_tokens=1, repetition_penalty=1e-300), prompt=[1, 2])
    logits = np.array([4.0, 4.0, -4.0, 4.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        editor(logits)
    assert logits[1] == np.inf and logits[2] == 0 and logits[[0, 3]].tolist() == [4.0, 4.0]  # (-4 x 1e-300: 0)


def test_a_penalty_window_penalizes_only_the_last_tokens():
    editor = LogitsEditor(SamplingParams(max_tokens=1, repetition_penalty=2.0, penalty_window=2), prompt=[0, 1])
    editor.observe(2)  # the last two tokens are now 1 and 2; token 0 fell out of the window
    logits = np.array([4.0, 4.0, 4.0, 4.0], dtype=np.float32)
    editor(logits)
    assert logits.tolist() == [4.0, 2.0, 2.0, 4.0]
    off = LogitsEditor(SamplingParams(max_tokens=1, repetition_penalty=2.0, penalty_window=0), prompt=[0, 1])
    logits = np.array([4.0, 4.0, 4.0, 4.0], dtype=np.float32)
    off(logits)
    assert logits.tolist() == [4.0, 4.0, 4.0, 4.0]  # Ollama's repeat_last_n 0: no repetition penalty


def draws(probabilities, count=4000, **options):
    logits = np.log(np.array(probabilities, dtype=np.float32))
    rng = np.random.default_rng(0)
    return np.bincount([sample(logits.copy(), options.get("temperature", 1.0), options.get("top_k", 0),
                               options.get("top_p", 1.0), rng) for _ in range(count)], minlength=len(probabilities))


def test_sampling_follows_the_distribution():
    counts = draws([0.5, 0.3, 0.2])
    expected = np.array([0.5, 0.3, 0.2]) * 4000
    assert (np.abs(counts - expected) < 5 * np.sqrt(expected)).all()  # within five standard deviations


def test_top_k_and_top_p_keep_only_the_most_likely():
    assert draws([0.5, 0.3, 0.15, 0.05], top_k=2)[2:].sum() == 0
    assert draws([0.5, 0.3, 0.15, 0.05], top_p=0.75)[2:].sum() == 0  # 0.5 + 0.3 reach 0.75
    assert draws([0.5, 0.3, 0.15, 0.05], top_p=0.4).tolist() == [4000, 0, 0, 0]
    counts = draws([0.5, 0.3, 0.15, 0.05], top_p=0.75)
    assert abs(counts[0] / counts[:2].sum() - 0.5 / 0.8) < 0.05  # renormalized among those kept


def plain_sample(logits, temperature, top_k, top_p, rng):
    """The definition, written plainly (float64, one running sum): what the engine's faster sample() must
    draw, token for token (they may differ only where a draw lands within float rounding of a boundary)."""
    pool, probabilities = distribution(logits, temperature, top_k, top_p)
    choice = int(np.searchsorted(np.cumsum(probabilities), rng.random() * probabilities.sum(), side="right"))
    return int(pool[min(choice, pool.size - 1)])


@pytest.mark.parametrize("options", [
    {}, {"temperature": 0.7}, {"top_k": 40}, {"top_p": 0.9}, {"top_k": 50, "top_p": 0.8, "temperature": 1.3},
    {"masked": True}, {"masked": True, "top_k": 20, "top_p": 0.95},
])
def test_sampling_draws_exactly_what_the_plain_definition_draws(options):
    vocabulary = np.random.default_rng(3)
    scratch = np.empty(5000, dtype=np.float32)
    ours, theirs = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(200):
        logits = (vocabulary.standard_normal(5000) * 4).astype(np.float32)
        if options.get("masked"):
            logits[vocabulary.random(5000) < 0.5] = -np.inf
        args = (options.get("temperature", 1.0), options.get("top_k", 0), options.get("top_p", 1.0))
        assert sample(logits.copy(), *args, ours, scratch) == plain_sample(logits.copy(), *args, theirs)


@pytest.mark.parametrize("size", [1, 255, 256, 257, 5000, 49152])
def test_the_block_by_block_draw_finds_where_the_running_sum_passes_the_point(size):
    weights = np.random.default_rng(size).integers(0, 4, size).astype(np.float32)  # whole numbers: exact sums
    weights[-1] += 1  # never all zero
    total = float(weights.sum())
    running = np.cumsum(weights.astype(np.float64))
    for fraction in [0.0, 0.3, 0.5, 0.999999, *((running[:40] - 0.5) / total), *(running[-3:] / total)]:
        fraction = min(float(fraction), np.nextafter(1.0, 0.0))
        expected = min(int(np.searchsorted(running, fraction * total, side="right")), size - 1)
        assert _draw(weights, fraction) == expected


def test_a_low_temperature_sharpens_and_a_high_one_flattens():
    assert draws([0.5, 0.3, 0.2], temperature=0.05)[0] == 4000
    flat = draws([0.5, 0.3, 0.2], temperature=100.0)
    assert (np.abs(flat - 4000 / 3) < 5 * np.sqrt(4000 / 3)).all()


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 5e-324])
def test_a_vanishing_temperature_draws_the_most_likely_token(temperature):
    """The fuzzer's 500: logits divided by such a temperature overflowed, all to infinity, and nothing was left to
    draw from."""
    logits = np.array([0.5, 3.0, -1.0, 2.9, -np.inf], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert {sample(logits.copy(), temperature, 0, 1.0, rng) for _ in range(50)} == {1}
    pool, probabilities = distribution(logits, temperature, 0, 1.0)
    assert pool[probabilities.argmax()] == 1 and probabilities.max() == 1.0


def test_tokens_pushed_to_infinity_are_all_that_can_be_drawn():
    """The fuzzer's other 500: a repetition_penalty of 1e-40 divides positive logits to +inf."""
    logits = np.array([0.5, np.inf, -1.0, np.inf, -np.inf], dtype=np.float32)
    rng = np.random.default_rng(0)
    drawn = [sample(logits.copy(), 1.0, 0, 0.9, rng) for _ in range(400)]
    assert set(drawn) == {1, 3} and 120 < drawn.count(1) < 280
    pool, probabilities = distribution(logits, 1.0, 0, 1.0)
    assert sorted(pool[probabilities > 0].tolist()) == [1, 3]


def test_a_seed_makes_the_draws_repeatable():
    logits = np.log(np.linspace(1, 2, 50, dtype=np.float32))

    def tokens(seed):
        sampler = Sampler(SamplingParams(max_tokens=20, temperature=1.0, seed=seed), np.zeros(0, np.int32),
                          frozenset())
        return [sampler.choose(logits.copy())[0] for _ in range(20)]

    assert tokens(7) == tokens(7) and tokens(7) != tokens(8)


@pytest.mark.parametrize("seed", [-1, -2**63, 2**63 - 1])
def test_any_int64_seed_makes_repeatable_draws_of_its_own(seed):
    # numpy's generators refuse negative seeds, which the APIs allow (Ollama's clients send -1)
    logits = np.log(np.linspace(1, 2, 50, dtype=np.float32))

    def tokens(seed):
        sampler = Sampler(SamplingParams(max_tokens=20, temperature=1.0, seed=seed), np.zeros(0, np.int32),
                          frozenset())
        return [sampler.choose(logits.copy())[0] for _ in range(20)]

    assert tokens(seed) == tokens(seed) and tokens(seed) != tokens(-seed - 1) and tokens(seed) != tokens(1)


def test_the_end_of_sequence_is_masked_below_min_tokens():
    sampler = Sampler(SamplingParams(max_tokens=5, temperature=0, min_tokens=2), np.zeros(0, np.int32),
                      frozenset({0}))
    wants_to_end = np.array([5.0, 1.0, 0.0], dtype=np.float32)
    assert not sampler.plain_greedy  # the batch's argmax would not know about the mask
    assert [sampler.choose(wants_to_end.copy())[0] for _ in range(3)] == [1, 1, 0]
    assert sampler.plain_greedy  # past min_tokens, nothing is left to mask
