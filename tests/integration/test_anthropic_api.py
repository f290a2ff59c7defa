"""Anthropic's Messages API through the official anthropic SDK against real gunicorn on the real model: every body
and streamed event read strictly (no type coercion) by the SDK's own types.

The SDK (2.12) no longer has a ``temperature`` argument; Anthropic's default is 1.0, so the tests that compare
two answers ask for greedy decoding through ``extra_body``."""

from __future__ import annotations

from typing import Literal

import anthropic
import pytest
import requests
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from tests.integration.conftest import MODEL_ID
from tests.support.sse import parse_named_sse

SYSTEM = "Answer briefly."
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# The enum keeps the small model's input short: the call ends, whatever the weights prefer.
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
                            "required": ["city"]}}
STREAM_EVENT = TypeAdapter(RawMessageStreamEvent)
GREEDY = {"temperature": 0}


class City(BaseModel):
    name: str = Field(max_length=24)
    country: Literal["Japan", "France", "Italy"]


@pytest.fixture(scope="module")
def claude(server):
    """The official anthropic client, pointed at the server."""
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def create(claude, **body) -> Message:
    """messages.create, its raw body read strictly by the SDK's Message type."""
    raw = claude.messages.with_raw_response.create(model=MODEL_ID, extra_body=GREEDY, **body)
    return Message.model_validate(raw.http_response.json(), strict=True)


def prompt_tokens(usage) -> int:
    """The whole prompt: Anthropic's ``input_tokens`` counts only what was not read from the cache."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_create_with_exact_usage(claude, reference):
    message = create(claude, system=SYSTEM, messages=QUESTION, max_tokens=24)
    assert message.id.startswith("msg_") and message.role == "assistant" and message.model == MODEL_ID
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    if message.stop_reason == "max_tokens":
        assert message.usage.output_tokens == 24
    assert prompt_tokens(message.usage) == reference.chat_tokens([{"role": "system", "content": SYSTEM}, *QUESTION])


def test_a_final_assistant_message_is_continued(claude, reference):
    """Anthropic's prefill: the prompt stops right after the assistant's text (the template's end of its turn is left
    out), and the answer holds what follows."""
    start = "The capital of France is"
    messages = [{"role": "system", "content": SYSTEM}, *QUESTION]
    message = create(claude, system=SYSTEM, messages=[*QUESTION, {"role": "assistant", "content": start}],
                     max_tokens=8)
    assert prompt_tokens(message.usage) == reference.continued_tokens(messages, start)
    counted = claude.messages.count_tokens(model=MODEL_ID, system=SYSTEM,
                                           messages=[*QUESTION, {"role": "assistant", "content": start}])
    assert counted.input_tokens == prompt_tokens(message.usage)
    assert prompt_tokens(message.usage) < reference.chat_tokens([*messages, {"role": "assistant", "content": start}])


def test_the_raw_stream_is_anthropic_s_events(server):
    body = {"model": MODEL_ID, "system": SYSTEM, "messages": QUESTION, "max_tokens": 16, "temperature": 0,
            "stream": True}
    answer = requests.post(server.url + "/v1/messages", json=body, timeout=120,
                           headers={"x-api-key": "unused", "anthropic-version": "2023-06-01"})
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = parse_named_sse(answer.text)
    for name, data in events:
        assert name == data["type"]
        if name != "ping":
            STREAM_EVENT.validate_python(data, strict=True)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] in ("end_turn", "max_tokens")


def test_the_sdk_stream_equals_create_under_greedy_decoding(claude):
    plain = create(claude, system=SYSTEM, messages=QUESTION, max_tokens=24)
    with claude.messages.stream(model=MODEL_ID, system=SYSTEM, messages=QUESTION, max_tokens=24,
                                extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == plain.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (plain.stop_reason, plain.usage.output_tokens)


def test_a_forced_tool_use_then_its_result(claude):
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = create(claude, messages=asked, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                   max_tokens=64)
    assert first.stop_reason == "tool_use"
    (use,) = [block for block in first.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "London") and use.id.startswith("toolu_")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 degrees."}
    second = create(claude, tools=[WEATHER], max_tokens=24, messages=[
        *asked, {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [result]}])
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.content
    assert prompt_tokens(second.usage) > prompt_tokens(first.usage)  # the call and its result are in the prompt


def test_parse_with_a_pydantic_model(claude):
    parsed = claude.messages.parse(model=MODEL_ID, max_tokens=64, output_format=City, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Name a large city in Japan."}])
    assert parsed.stop_reason == "end_turn"
    assert isinstance(parsed.parsed_output, City)  # the grammar held the answer to the schema


def test_count_tokens_is_what_create_counts(claude, reference):
    counted = claude.messages.count_tokens(model=MODEL_ID, system=SYSTEM, messages=QUESTION)
    assert counted.input_tokens == reference.chat_tokens([{"role": "system", "content": SYSTEM}, *QUESTION])
    with_tools = claude.messages.count_tokens(model=MODEL_ID, messages=QUESTION, tools=[WEATHER])
    created = create(claude, messages=QUESTION, tools=[WEATHER], max_tokens=1)
    assert with_tools.input_tokens == prompt_tokens(created.usage)


def test_the_sdk_lists_and_retrieves_models(claude):
    listed = claude.models.list()
    assert [model.id for model in listed.data] == [MODEL_ID] and listed.data[0].type == "model"
    assert listed.data[0].created_at.year >= 2025 and listed.data[0].display_name
    assert claude.models.retrieve(MODEL_ID).id == MODEL_ID


def test_errors_in_anthropic_s_shape(claude):
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=MODEL_ID, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as unpaired:  # a tool_result of no tool_use
        claude.messages.create(model=MODEL_ID, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_nothing", "content": "sunny"}]}])
    assert "toolu_nothing" in unpaired.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as forced:  # a call forced with no tool to call
        claude.messages.create(model=MODEL_ID, max_tokens=8, messages=QUESTION, tool_choice={"type": "any"})
    assert "tool_choice" in forced.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        claude.messages.create(model="claude-opus-4", max_tokens=8, messages=QUESTION)
    assert unknown.value.body["error"]["type"] == "not_found_error"
