"""From request bodies to engine parameters: defaults, limits and the context window."""

from __future__ import annotations

import pytest

from phi_api.engine import ModelInfo
from phi_api.errors import ContextLengthExceededError, InvalidParameterError
from phi_api.protocols.openai.parse import sampling
from phi_api.settings import Settings

MODEL = ModelInfo(path="/m", model_type="llama", context_length=100, vocab_size=50, eos_token_ids=frozenset({2}),
                  has_chat_template=True, fingerprint="fp_test")
SETTINGS = Settings(DEFAULT_MAX_TOKENS=30, DEFAULT_TEMPERATURE=0.7)


def params(body, prompt_tokens=10):
    return sampling(body).to_params(prompt_tokens=prompt_tokens, prompt_param="messages", model=MODEL,
                                   settings=SETTINGS)[0]


def test_defaults_come_from_the_settings():
    result = params({})
    assert (result.max_tokens, result.temperature, result.top_p, result.stop) == (30, 0.7, 1.0, ())


def test_null_counts_as_not_given():
    result = params({"max_tokens": None, "temperature": None, "stop": None, "seed": None})
    assert (result.max_tokens, result.temperature, result.stop, result.seed) == (30, 0.7, (), None)


def test_default_max_tokens_is_clamped_to_the_room_left():
    assert params({}, prompt_tokens=90).max_tokens == 10


def test_explicit_max_tokens_beyond_the_room_left_is_refused():
    with pytest.raises(ContextLengthExceededError) as caught:
        params({"max_tokens": 11}, prompt_tokens=90)
    assert caught.value.param == "max_tokens"
    assert "100" in caught.value.message and "101" in caught.value.message


def test_max_completion_tokens_wins_over_max_tokens():
    assert params({"max_tokens": 5, "max_completion_tokens": 7}).max_tokens == 7
    with pytest.raises(ContextLengthExceededError) as caught:
        params({"max_tokens": 5, "max_completion_tokens": 95})
    assert caught.value.param == "max_completion_tokens"


def test_a_prompt_that_fills_the_context_is_refused_naming_the_prompt():
    with pytest.raises(ContextLengthExceededError) as caught:
        params({}, prompt_tokens=100)
    assert caught.value.param == "messages"


def test_stop_string_becomes_a_tuple():
    assert params({"stop": "END"}).stop == ("END",)
    assert params({"stop": ["a", "b"]}).stop == ("a", "b")


def test_logit_bias_keys_are_token_ids_within_the_vocabulary():
    assert params({"logit_bias": {"3": 5, "1": -1}}).logit_bias == ((1, -1.0), (3, 5.0))
    with pytest.raises(InvalidParameterError) as caught:
        params({"logit_bias": {"50": 1}})
    assert caught.value.param == "logit_bias"


def test_min_tokens_may_not_exceed_max_tokens():
    with pytest.raises(InvalidParameterError) as caught:
        params({"max_tokens": 3, "min_tokens": 4})
    assert caught.value.param == "min_tokens"


def test_top_k_minus_one_means_disabled():
    assert params({"top_k": -1}).top_k == 0


def test_top_k_beyond_the_vocabulary_keeps_every_token():
    assert params({"top_k": 10**6}).top_k == 0  # the engine would refuse it
    assert params({"top_k": 5}).top_k == 5


MODEL_DEFAULTS = {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
                  "presence_penalty": 0.5, "frequency_penalty": 0.25}


def defaulted(body):
    return sampling(body).to_params(prompt_tokens=10, prompt_param="messages", model=MODEL, settings=SETTINGS,
                                   defaults=MODEL_DEFAULTS)[0]


def test_a_models_defaults_fill_what_a_request_omits():
    result = defaulted({})
    assert (result.temperature, result.top_p, result.top_k, result.min_p, result.repetition_penalty,
            result.presence_penalty, result.frequency_penalty) == (0.2, 0.9, 40, 0.05, 1.1, 0.5, 0.25)


def test_what_a_request_sets_wins_over_the_models_defaults_even_neutral_values():
    body = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0}
    result = defaulted(body)
    assert (result.temperature, result.top_p, result.top_k, result.min_p, result.repetition_penalty,
            result.presence_penalty, result.frequency_penalty) == (1.0, 1.0, 0, 0.0, 1.0, 0.0, 0.0)


def test_default_temperature_stays_the_fallback_of_a_model_without_one():
    result = sampling({}).to_params(prompt_tokens=10, prompt_param="messages", model=MODEL, settings=SETTINGS,
                                    defaults={"top_p": 0.8})[0]
    assert (result.temperature, result.top_p) == (0.7, 0.8)


def test_a_models_repeat_last_n_is_the_penalty_window_unless_the_request_gives_one():
    def window(defaults, given=None):
        request = sampling({})
        if given is not None:
            import dataclasses
            request = dataclasses.replace(request, penalty_window=given)
        return request.to_params(prompt_tokens=10, prompt_param="messages", model=MODEL, settings=SETTINGS,
                                 defaults=defaults)[0].penalty_window

    assert (window({}), window({"repeat_last_n": 64}), window({"repeat_last_n": -1})) == (None, 64, None)
    assert window({"repeat_last_n": 64}, given=16) == 16
