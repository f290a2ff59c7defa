"""Anthropic's Messages API with a fake engine: the request as a chat, the message object and its events, tool use,
stop reasons, count_tokens, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.support.fakes import fake_engine, text_pieces
from tests.support.sse import parse_named_sse

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HEADERS = {"x-api-key": "unused", "anthropic-version": "2023-06-01"}
STREAM_EVENT = TypeAdapter(RawMessageStreamEvent)


def scripted(make_app, *pieces: bytes, **config):
    engine = fake_engine(list(range(1, len(pieces) + 1)) + [0], text_pieces(*pieces))
    return make_app(engine, **config).test_client(), engine


def create(client, **body):
    """POST /v1/messages; every answer is read strictly (no type coercion) by the anthropic SDK's types."""
    answer = client.post("/v1/messages", headers=HEADERS, json={"model": "test-model", "max_tokens": 32,
                                                                "messages": [{"role": "user", "content": "Hi"}],
                                                                **body})
    if answer.status_code == 200 and body.get("stream"):
        for name, data in parse_named_sse(answer.get_data(as_text=True)):
            if name not in ("ping", "error"):
                STREAM_EVENT.validate_python(data, strict=True)
    elif answer.status_code == 200:
        Message.model_validate(answer.get_json(), strict=True)
    return answer


def test_a_text_answer_as_a_message(make_app):
    client, engine = scripted(make_app, b"Hello", b" there")
    body = create(client, system=[{"type": "text", "text": "Be brief."}]).get_json()
    assert body["type"] == "message" and body["role"] == "assistant" and body["id"].startswith("msg_")
    assert body["content"] == [{"type": "text", "text": "Hello there"}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)
    assert body["usage"]["output_tokens"] == 3 and body["usage"]["cache_read_input_tokens"] == 0
    assert engine.model.rendered[-1] == "<system>Be brief.<user>Hi<assistant>"


def test_stop_reasons(make_app):
    client, _ = scripted(make_app, b"one", b" two", b" three")
    assert create(client, max_tokens=2).get_json()["stop_reason"] == "max_tokens"
    stopped = create(client, stop_sequences=["two"]).get_json()
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "two")
    assert stopped["content"][0]["text"] == "one "


def test_the_stream_is_anthropic_s_sequence_of_events(make_app):
    client, _ = scripted(make_app, b"Hel", b"lo")
    events = parse_named_sse(create(client, stream=True).get_data(as_text=True))
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                            "content_block_delta", "content_block_stop", "message_delta",
                                            "message_stop"]
    assert all(name == data["type"] for name, data in events)
    assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["stop_reason"] is None
    assert "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == "Hello"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn" and events[-2][1]["usage"]["output_tokens"] == 3


def test_a_failure_mid_stream_ends_it_with_an_error_event(make_app):
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"a", b"b", b"c"), fail_at=2)
    answer = make_app(engine).test_client().post("/v1/messages", headers=HEADERS, json={
        "model": "test-model", "max_tokens": 32, "messages": [{"role": "user", "content": "Hi"}], "stream": True})
    events = parse_named_sse(answer.get_data(as_text=True))
    name, data = events[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "fake engine failure" not in json.dumps(data)  # the cause is logged, not sent
    assert "message_stop" not in [name for name, _ in events]


def test_a_forced_tool_use_then_its_result(make_app):
    client, engine = scripted(make_app, CALL.encode())
    body = create(client, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}).get_json()
    assert body["stop_reason"] == "tool_use"
    block = body["content"][0]
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "get_weather", {"city": "Paris"})
    assert block["id"].startswith("toolu_") and engine.model.script.grammars
    messages = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": [block]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "sunny"},
                                             {"type": "text", "text": "Thanks"}]}]
    assert create(client, tools=[WEATHER], messages=messages).status_code == 200
    assert "sunny" in engine.model.rendered[-1] and "get_weather" in engine.model.rendered[-1]


@pytest.mark.parametrize("turns,what", [
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "sunny"}]}],
     "none of them"),  # a result of no call
    ([{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "get_weather",
                                         "input": {"city": "Paris"}}]},
      {"role": "user", "content": "And tomorrow?"}], "no answer for: toolu_a"),  # a call never answered
])
def test_tool_uses_and_results_must_pair_up_as_anthropic_requires(make_app, turns, what):
    client, _ = scripted(make_app, b"ok")
    answer = create(client, tools=[WEATHER], messages=[{"role": "user", "content": "Weather in Paris?"}, *turns])
    assert answer.status_code == 400 and answer.get_json()["error"]["type"] == "invalid_request_error"
    assert what in answer.get_json()["error"]["message"]


def test_tool_use_in_a_stream(make_app):
    client, _ = scripted(make_app, CALL.encode())
    events = parse_named_sse(create(client, tools=[WEATHER], tool_choice={"type": "any"}, stream=True)
                             .get_data(as_text=True))
    start = next(data for name, data in events if name == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    delta = next(data for name, data in events if name == "content_block_delta")
    assert json.loads(delta["delta"]["partial_json"]) == {"city": "Paris"}
    assert next(data for name, data in events if name == "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_count_tokens(make_app):
    client, engine = scripted(make_app, b"ok")
    counted = client.post("/v1/messages/count_tokens", headers=HEADERS, json={
        "model": "test-model", "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}).get_json()
    assert counted == {"input_tokens": len("<system>Be brief.<user>Hi<assistant>")}  # the fake: a token a character


@pytest.mark.parametrize("body,status,kind", [
    ({"model": "nobody"}, 404, "not_found_error"),
    ({"max_tokens": None}, 400, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400, "invalid_request_error"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error"),
    # a budget that is no integer reached the sampler of a reasoning model, a 500 there
    ({"thinking": {"type": "enabled", "budget_tokens": "x"}}, 400, "invalid_request_error"),
    ({"thinking": {"type": "sometimes"}}, 400, "invalid_request_error"),
    ({"stop_sequences": ["x" * 1001]}, 400, "invalid_request_error"),  # matched on the engine thread, every token
    # Anthropic refuses empty content but in a final assistant message (the answer's start), and empty text blocks
    ({"messages": [{"role": "user", "content": []}]}, 400, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": ""}]}, 400, "invalid_request_error"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, 400, "invalid_request_error"),
    ({"messages": [{"role": "assistant", "content": ""}, {"role": "user", "content": "Hi"}]}, 400,
     "invalid_request_error"),
])
def test_errors_in_anthropic_s_shape(make_app, body, status, kind):
    client, _ = scripted(make_app, b"ok")
    response = client.post("/v1/messages", headers=HEADERS, json={
        "model": "test-model", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
        **{key: value for key, value in body.items() if value is not None}} if "max_tokens" not in body else {
        "model": "test-model", "messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == status
    error = response.get_json()
    assert error["type"] == "error" and error["error"]["type"] == kind and error["error"]["message"]


def test_a_final_assistant_message_may_be_empty(make_app):
    client, _ = scripted(make_app, b"ok")
    answer = create(client, messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}])
    assert answer.status_code == 200 and answer.get_json()["content"][0]["text"] == "ok"


def test_a_final_assistant_message_is_the_answer_s_start(make_app):
    """Anthropic's prefill: the prompt stops within the assistant's turn, right after its text, and the answer holds
    only what follows."""
    client, engine = scripted(make_app, b" 4.")
    answer = create(client, messages=[{"role": "user", "content": "What is 2+2?"},
                                      {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]}])
    assert answer.status_code == 200 and answer.get_json()["content"][0]["text"] == " 4."
    assert engine.model.rendered[-1] == "<user>What is 2+2?<assistant>The answer is"
    prefilled = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "The answer is"}]
    counted = client.post("/v1/messages/count_tokens", headers=HEADERS, json={"model": "test-model",
                                                                              "messages": prefilled}).get_json()
    assert counted == {"input_tokens": len("<user>What is 2+2?<assistant>The answer is")}  # as create reads it
    create(client, messages=[{"role": "user", "content": "What is 2+2?"}])
    assert engine.model.rendered[-1] == "<user>What is 2+2?<assistant>"  # no prefill: the turn opened, empty


def test_a_stream_s_usage_is_the_whole_answer_s(make_app):
    """message_delta carries the whole usage, as Anthropic's does: the share of the prompt read from the cache is
    known only once the prompt is read, after message_start."""
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"a", b"b", b"c"), prefix_cache="on")
    client = make_app(engine).test_client()
    long = [{"role": "user", "content": "Tell me about it. " * 8}]
    create(client, messages=long)
    whole = create(client, messages=long).get_json()["usage"]
    streamed = parse_named_sse(create(client, messages=long, stream=True).get_data(as_text=True))
    usage = dict(next(data for name, data in streamed if name == "message_start")["message"]["usage"])
    usage.update(next(data for name, data in streamed if name == "message_delta")["usage"])  # as the SDK adds them
    assert whole["cache_read_input_tokens"] > 0 and usage == whole


def test_a_prefill_ending_in_blanks_is_refused_as_anthropic_does(make_app):
    client, _ = scripted(make_app, b"ok")
    answer = create(client, messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "So "}])
    assert answer.status_code == 400 and "trailing whitespace" in answer.get_json()["error"]["message"]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_a_call_forced_without_tools_is_anthropic_s_400(make_app, choice):
    client, engine = scripted(make_app, b"ok")
    answer = create(client, tool_choice=choice)
    assert answer.status_code == 400 and answer.get_json()["error"]["type"] == "invalid_request_error"
    assert not engine.model.rendered
    assert create(client, tool_choice={"type": "auto"}).status_code == 200  # nothing forced: nothing to refuse


def test_thinking_and_cache_control_are_accepted_without_effect(make_app):
    client, _ = scripted(make_app, b"ok")
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}]
    assert create(client, messages=messages, thinking={"type": "enabled", "budget_tokens": 1024}).status_code == 200


def test_structured_output_holds_the_answer_to_its_schema(make_app):
    client, engine = scripted(make_app, b'{"city": "Paris"}')
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    body = create(client, output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    assert body.status_code == 200 and json.loads(body.get_json()["content"][0]["text"]) == {"city": "Paris"}
    assert json.loads(engine.model.script.grammars[-1][1])["properties"] == schema["properties"]


@pytest.mark.parametrize("output_config", [
    {"format": {"type": "json_schema"}},  # no schema
    {"format": {"type": "xml", "schema": {}}},
    {"effort": "extreme"},
    {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}}},
])
def test_a_bad_output_config_is_anthropic_s_400(make_app, output_config):
    client, _ = scripted(make_app, b"ok")
    response = create(client, output_config=output_config)
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"


def test_anthropic_s_clients_list_models_in_anthropic_s_shape(client):
    """The anthropic SDK's models.list() and retrieve() send anthropic-version; OpenAI's clients get OpenAI's list."""
    from anthropic.types import ModelInfo

    listed = client.get("/v1/models", headers=HEADERS).get_json()
    [model] = [ModelInfo.model_validate(item) for item in listed["data"]]
    assert (model.type, model.id, model.display_name) == ("model", "test-model", "test-model")
    assert (listed["has_more"], listed["first_id"], listed["last_id"]) == (False, "test-model", "test-model")
    assert set(listed["data"][0]) <= set(ModelInfo.model_fields) and model.lifecycle == "active"
    assert model.max_input_tokens == client.get("/v1/models").get_json()["data"][0]["max_model_len"]
    retrieved = client.get("/v1/models/test-model", headers=HEADERS).get_json()
    assert ModelInfo.model_validate(retrieved).id == "test-model"
    assert client.get("/v1/models").get_json()["data"][0]["object"] == "model"  # no anthropic-version: OpenAI's
