"""Request schemas: each violation maps to one row of the error table."""

from __future__ import annotations

import pytest

from phi_api.errors import APIError
from phi_api.web.schemas import ERRORS_KEPT, RequestValidator

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


class CountingList(list):
    """An array that counts how many of its items the validator reads."""

    reads = 0

    def __getitem__(self, index):
        self.reads += 1
        return super().__getitem__(index)


class UnprintableList(list):
    """An array whose repr() fails: a large value must not be printed into an error nobody reads."""

    def __repr__(self):
        raise AssertionError("repr() of a request value")


@pytest.mark.parametrize("schema,body,where", [
    ("chat_completion", {**CHAT, "messages": [{"role": "user", "content": "hi"}] * 20_001}, "messages"),
    ("chat_completion", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 10_001}]},
     "messages[0].content"),
    ("ollama_chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}] * 20_001}, "messages"),
    ("responses", {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}] * 10_001}]},
     "input[0].content"),
])
def test_arrays_past_their_cap_are_a_400_naming_the_cap(schema, body, where):
    with pytest.raises(APIError) as caught:
        VALIDATOR.validate(schema, body)
    assert caught.value.status == 400 and caught.value.message == f"{where} must have at most 10000 items"


def test_an_array_past_its_cap_is_refused_without_reading_its_items():
    messages = CountingList([{"role": "x"}] * 50_000)
    assert error_of("chat_completion", {**CHAT, "messages": messages}) == ("invalid_messages", "messages")
    assert messages.reads == 0


def test_a_body_of_many_invalid_items_is_refused_after_reading_a_bounded_number_of_them():
    messages = CountingList([{"role": "x"}] * 9_999)  # each one wrong, within the cap
    with pytest.raises(APIError) as caught:
        VALIDATOR.validate("chat_completion", {**CHAT, "messages": messages})
    assert caught.value.message.startswith("messages[") and ".role must be one of" in caught.value.message
    assert messages.reads <= ERRORS_KEPT
    prompt = CountingList([-1] * 50_000)  # no cap, and in anyOf branches that each fail on every item
    assert error_of("completion", {**COMPLETION, "prompt": prompt}) == ("invalid_parameter", "prompt")
    assert prompt.reads <= 4 * ERRORS_KEPT


def test_bodies_are_checked_on_a_pooled_thread_not_the_hub(monkeypatch):
    import _thread

    from phi_api.web.schemas import RequestValidator

    seen = []
    errors = RequestValidator._errors

    def recorded(self, name, body):
        seen.append(_thread.get_ident())
        return errors(self, name, body)

    monkeypatch.setattr(RequestValidator, "_errors", recorded)
    VALIDATOR.validate("chat_completion", CHAT)
    with pytest.raises(APIError):
        VALIDATOR.validate("chat_completion", {**CHAT, "messages": [{"role": "x"}]})
    assert len(seen) == 2 and _thread.get_ident() not in seen


def test_a_large_value_is_never_printed_into_an_error():
    content = UnprintableList([{"type": "text", "text": "a"}] * 100)  # first tried as a string, then as parts
    VALIDATOR.validate("chat_completion", {**CHAT, "messages": [{"role": "user", "content": content}]})
    over = UnprintableList([{"role": "user", "content": "hi"}] * 10_001)
    assert error_of("chat_completion", {**CHAT, "messages": over}) == ("invalid_messages", "messages")
