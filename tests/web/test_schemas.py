"""Request schemas: each violation maps to one row of the error table."""

from __future__ import annotations

import pytest

from phi_api.errors import APIError
from phi_api.web.schemas import RequestValidator

VALIDATOR = RequestValidator()
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def error_of(schema: str, body: dict) -> tuple[str, str | None]:
    with pytest.raises(APIError) as caught:
        VALIDATOR.validate(schema, body)
    return caught.value.code, caught.value.param


@pytest.mark.parametrize("schema,body", [("chat_completion", CHAT), ("completion", COMPLETION)])
def test_minimal_requests_are_valid(schema, body):
    VALIDATOR.validate(schema, body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 2.01), ("temperature", -0.1), ("temperature", "hot"),
        ("top_p", 1.5), ("top_p", -0.5),
        ("frequency_penalty", 2.5), ("frequency_penalty", -2.5),
        ("presence_penalty", 3), ("presence_penalty", -3),
        ("max_tokens", -1), ("max_tokens", 1.5), ("max_tokens", "10"), ("max_tokens", True),
        ("max_tokens", 1e309),
        ("n", 0), ("n", 9),
        ("stop", ["a", "b", "c", "d", "e"]), ("stop", ""), ("stop", 5), ("stop", [1]),
        ("stream", "yes"),
        ("seed", 1.5),
        ("logit_bias", {"abc": 1}), ("logit_bias", {"1": 101}), ("logit_bias", {"1": -101}),
        ("user", 12),
        ("top_k", -2), ("repetition_penalty", 0), ("min_tokens", -1),
    ],
)
@pytest.mark.parametrize("schema,base", [("chat_completion", CHAT), ("completion", COMPLETION)])
def test_out_of_range_or_mistyped_parameters(schema, base, field, value):
    assert error_of(schema, {**base, field: value}) == ("invalid_parameter", field)


def test_max_tokens_0_is_for_completions_only():
    """0 only computes a completion's prompt (to score it, or to store it); a chat always generates."""
    assert error_of("chat_completion", {**CHAT, "max_tokens": 0}) == ("invalid_parameter", "max_tokens")
    VALIDATOR.validate("completion", {**COMPLETION, "max_tokens": 0, "echo": True})
    VALIDATOR.validate("completion", {**COMPLETION, "max_tokens": 0})


@pytest.mark.parametrize("schema,base,required", [
    ("chat_completion", CHAT, "model"), ("chat_completion", CHAT, "messages"),
    ("completion", COMPLETION, "model"), ("completion", COMPLETION, "prompt"),
])
def test_missing_required_parameters(schema, base, required):
    body = {key: value for key, value in base.items() if key != required}
    assert error_of(schema, body) == ("missing_parameter", required)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        [{"content": "no role"}],
        [{"role": "robot", "content": "hi"}],
        [{"role": "user"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": 42}],
        [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": [{"type": "video", "url": "x"}]}],
        [{"role": "assistant"}],
        [{"role": "tool", "content": "result"}],
        ["not an object"],
    ],
)
def test_malformed_messages(messages):
    assert error_of("chat_completion", {**CHAT, "messages": messages}) == ("invalid_messages", "messages")


def test_messages_error_says_where():
    with pytest.raises(APIError) as caught:
        VALIDATOR.validate("chat_completion", {**CHAT, "messages": [{"role": "user", "content": "a"}, {"role": "x"}]})
    assert "messages[1].role" in caught.value.message


def test_range_message_gives_the_bounds_and_the_value():
    with pytest.raises(APIError) as caught:
        VALIDATOR.validate("chat_completion", {**CHAT, "temperature": 3.5})
    assert caught.value.message == "temperature must be between 0.0 and 2.0, got 3.5"


def test_unknown_fields_are_allowed():
    VALIDATOR.validate("chat_completion", {**CHAT, "some_future_field": {"x": 1}})


def test_nulls_are_allowed_where_openai_allows_them():
    nulls = {key: None for key in ("temperature", "top_p", "max_tokens", "stop", "n", "seed", "stream", "logit_bias",
                                   "frequency_penalty", "presence_penalty", "user", "stream_options")}
    VALIDATOR.validate("chat_completion", {**CHAT, **nulls})
