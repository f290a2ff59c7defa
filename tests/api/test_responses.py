"""OpenAI's Responses API with a fake engine: the request as a chat, the response object and its events (validated
against OpenAI's published schemas, and read by the openai SDK's types), stored responses and follow-ups, and what
is refused."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response

from tests.support.fakes import fake_engine, text_pieces
from tests.support.openai_schemas import validate
from tests.support.sse import parse_named_sse

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def scripted(make_app, *pieces: bytes, **config):
    engine = fake_engine(list(range(1, len(pieces) + 1)) + [0], text_pieces(*pieces))
    return make_app(engine, **config).test_client(), engine


def create(client, **body):
    """POST /v1/responses; every answer (a response object, or each event of a stream) is checked against
    OpenAI's published schema."""
    answer = client.post("/v1/responses", json={"model": "test-model", **body})
    if answer.status_code == 200 and body.get("stream"):
        for _, data in parse_named_sse(answer.get_data(as_text=True)):
            validate("ResponseStreamEvent", data)
    elif answer.status_code == 200:
        validate("Response", answer.get_json())
    return answer


def test_a_text_answer_as_a_response_object(make_app):
    client, engine = scripted(make_app, b"Hello", b" there")
    answer = create(client, input="Say hello", instructions="Be brief.", max_output_tokens=16, metadata={"k": "v"})
    assert answer.status_code == 200, answer.get_data(as_text=True)
    body = answer.get_json()
    validate("Response", body)
    response = Response.model_validate(body)
    assert response.output_text == "Hello there" and response.status == "completed"
    assert body["id"].startswith("resp_") and body["output"][0]["id"].startswith("msg_")
    assert body["usage"]["output_tokens"] == 3 and body["usage"]["input_tokens"] > 0
    assert body["metadata"] == {"k": "v"} and body["instructions"] == "Be brief."
    assert engine.model.rendered[-1] == "<system>Be brief.<user>Say hello<assistant>"
    assert engine.model.script.params[-1].max_tokens == 16


def test_max_output_tokens_makes_it_incomplete(make_app):
    client, _ = scripted(make_app, b"a", b"b", b"c")
    body = create(client, input="Go", max_output_tokens=2).get_json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_stream_is_the_documented_sequence_of_events(make_app):
    client, _ = scripted(make_app, b"Hel", b"lo")
    raw = create(client, input="Say hello", stream=True).get_data(as_text=True)
    events = parse_named_sse(raw)
    for name, data in events:
        assert name == data["type"]
        validate("ResponseStreamEvent", data)
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "Hello"


def test_a_failure_mid_stream_ends_it_with_response_failed(make_app):
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"a", b"b", b"c"), fail_at=2)
    answer = make_app(engine).test_client().post("/v1/responses", json={"model": "test-model", "input": "Go",
                                                                       "stream": True})
    events = parse_named_sse(answer.get_data(as_text=True))
    for _, data in events:
        validate("ResponseStreamEvent", data)
    assert events[-1][0] == "response.failed"
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert "fake engine failure" not in json.dumps(failed)  # the cause is logged, not sent


def test_a_forced_function_call_and_its_output(make_app):
    client, engine = scripted(make_app, CALL.encode())
    body = create(client, input="Weather in Paris?", tools=[WEATHER], tool_choice="required").get_json()
    call = body["output"][0]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith("call_")
    assert engine.model.script.grammars  # the call was forced by the grammar
    follow_up = create(client, previous_response_id=body["id"], tools=[WEATHER],
                       input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}])
    assert follow_up.status_code == 200
    rendered = engine.model.rendered[-1]
    assert "Weather in Paris?" in rendered and "sunny" in rendered  # the conversation went on


def _call(call_id: str = "call_1") -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": '{"city": "Paris"}'}


def _output(call_id: str = "call_1") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


ASK = {"role": "user", "content": "Weather in Paris?"}


@pytest.mark.parametrize("items", [
    [ASK, _call()],  # a call without its output
    [ASK, _call(), {"role": "user", "content": "never mind"}],  # a message in the output's place
    [ASK, _output()],  # an output answering no call
    [ASK, _call(), _output(), _output()],  # a call answered twice
    [ASK, _call("call_1"), _output("call_2")],  # the output of another call
])
def test_function_calls_and_their_outputs_must_pair_up(make_app, items):
    client, engine = scripted(make_app, b"ok")
    refused = create(client, input=items, tools=[WEATHER])
    assert refused.status_code == 400, refused.get_data(as_text=True)
    assert (refused.get_json()["error"]["type"], refused.get_json()["error"]["param"]) == \
        ("invalid_request_error", "input")
    assert not engine.model.rendered
    paired = create(client, input=[ASK, _call(), _output()], tools=[WEATHER])
    assert paired.status_code == 200, paired.get_data(as_text=True)


def test_a_follow_up_to_a_call_must_carry_its_output(make_app):
    client, _ = scripted(make_app, CALL.encode())
    call = create(client, input="Weather in Paris?", tools=[WEATHER], tool_choice="required").get_json()
    refused = create(client, previous_response_id=call["id"], tools=[WEATHER], input="never mind")
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "input"
    conversation = client.post("/v1/conversations", json={"items": [ASK, _call()]}).get_json()["id"]
    refused = create(client, conversation=conversation, tools=[WEATHER], input="never mind")
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "input"


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_short_by_the_token_limit_is_incomplete(make_app, stream):
    client, _ = scripted(make_app, b'{"name": "get_weather", ', b'"arguments": {"city": ', b'"Par', b'is"}}')
    answer = create(client, input="Weather?", tools=[WEATHER], tool_choice="required", max_output_tokens=3,
                    stream=stream)
    if stream:
        body = parse_named_sse(answer.get_data(as_text=True))[-1][1]["response"]
    else:
        body = answer.get_json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(item["type"], item["status"]) for item in body["output"]] == [("function_call", "incomplete")]


def test_function_call_events_in_a_stream(make_app):
    client, _ = scripted(make_app, CALL.encode())
    events = parse_named_sse(create(client, input="Weather?", tools=[WEATHER], tool_choice={
        "type": "function", "name": "get_weather"}, stream=True).get_data(as_text=True))
    names = [name for name, _ in events]
    assert names[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done"]
    for _, data in events:
        validate("ResponseStreamEvent", data)


def test_input_items_become_the_conversation(make_app):
    client, engine = scripted(make_app, b"ok")
    items = [{"role": "developer", "content": "Rules."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
             {"role": "user", "content": "Bye"}]
    assert create(client, input=items).status_code == 200
    assert engine.model.rendered[-1] == "<system>Rules.<user>Hi<assistant>Hello<user>Bye<assistant>"


def test_stored_responses_are_retrieved_deleted_and_then_unknown(make_app):
    client, _ = scripted(make_app, b"ok")
    body = create(client, input="Hi").get_json()
    assert client.get(f"/v1/responses/{body['id']}").get_json() == body
    assert client.delete(f"/v1/responses/{body['id']}").get_json() == {"id": body["id"], "object": "response",
                                                                      "deleted": True}
    missing = client.get(f"/v1/responses/{body['id']}")
    assert missing.status_code == 404 and missing.get_json()["error"]["type"] == "invalid_request_error"
    gone = create(client, input="Again", previous_response_id=body["id"])
    error = gone.get_json()["error"]
    assert gone.status_code == 400
    assert (error["code"], error["param"]) == ("previous_response_not_found", "previous_response_id")
    assert error["message"] == f"Previous response with id '{body['id']}' not found."


def test_store_false_keeps_nothing(make_app):
    client, _ = scripted(make_app, b"ok")
    body = create(client, input="Hi", store=False).get_json()
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404


def test_the_store_is_bounded(make_app):
    client, _ = scripted(make_app, b"ok", RESPONSES_STORE_MAX=2)
    ids = [create(client, input=f"Hi {index}").get_json()["id"] for index in range(3)]
    assert [client.get(f"/v1/responses/{response_id}").status_code for response_id in ids] == [404, 200, 200]


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
])
def test_what_these_models_cannot_do_is_refused(make_app, extra, param):
    client, _ = scripted(make_app, b"ok")
    response = create(client, **{"input": "Hi", **extra})
    error = response.get_json()["error"]
    assert response.status_code == 400 and (error["code"], error["param"]) == ("unsupported_parameter", param)


def test_reasoning_is_accepted_and_has_no_effect(make_app):
    client, _ = scripted(make_app, b"ok")
    assert create(client, input="Hi", reasoning={"effort": "low"}).status_code == 200


def test_a_structured_answer_with_text_format(make_app):
    client, engine = scripted(make_app, b'{"city": "Paris"}')
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    body = create(client, input="City?", text={"format": {"type": "json_schema", "name": "City", "schema": schema,
                                                          "strict": True}}).get_json()
    assert json.loads(body["output"][0]["content"][0]["text"]) == {"city": "Paris"}
    assert json.loads(engine.model.script.grammars[-1][1])["properties"] == schema["properties"]
