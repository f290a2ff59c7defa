"""Tool calls in a model family's own format, with a fake engine: found wherever they start, streamed as
``tool_calls`` deltas, the text before them told as it comes and their markup never in the content; the tools
reach Phi-4-mini's prompt the way its template reads them."""

from __future__ import annotations

import json

from phi_api.service.tool_formats import FORMATS
from phi_api.service.tools import template_messages, tool_plan
from tests.support.fakes import fake_engine, text_pieces
from tests.support.sse import parse_named_sse, parse_sse

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
HERMES = text_pieces(b"I will check.", b" <tool", b"_call>\n",
                     b'{"name": "get_weather", "arguments": {"city": "Paris"}}', b"\n</tool_call>")
BODY = {"model": "test-model", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}


def hermes_client(make_app):
    return make_app(engine=fake_engine([1, 2, 3, 4, 5, 0], HERMES, tool_parser="hermes")).test_client()


def test_a_call_after_some_text_is_a_call_and_the_text_stays_the_content(make_app):
    choice = hermes_client(make_app).post("/v1/chat/completions", json=BODY).get_json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "I will check."
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_streaming_tells_the_text_then_the_call_and_never_the_markup(make_app):
    events = parse_sse(hermes_client(make_app).post("/v1/chat/completions", json={**BODY, "stream": True})
                       .get_data(as_text=True))[:-1]
    deltas = [event["choices"][0]["delta"] for event in events]
    content = "".join(delta.get("content") or "" for delta in deltas)
    assert content.strip() == "I will check." and "<tool" not in content
    calls = [delta["tool_calls"][0] for delta in deltas if delta.get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(call["function"].get("arguments", "") for call in calls)) == {"city": "Paris"}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    first_text = next(i for i, delta in enumerate(deltas) if delta.get("content"))
    assert first_text < next(i for i, delta in enumerate(deltas) if delta.get("tool_calls"))


def test_the_text_before_a_call_is_kept_whole_and_streamed_in_responses_and_anthropic(make_app):
    """A whole answer says what its stream tells: the text, then the call."""
    client = hermes_client(make_app)
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    for stream in (False, True):
        answer = client.post("/v1/responses", json={"model": "test-model", "input": "Weather in Paris?",
                                                    "tools": [tool], "stream": stream})
        if stream:
            events = parse_named_sse(answer.get_data(as_text=True))
            output = next(data for name, data in events if name == "response.completed")["response"]["output"]
        else:
            output = answer.get_json()["output"]
        assert [item["type"] for item in output] == ["message", "function_call"], stream
        assert output[0]["content"][0]["text"].strip() == "I will check." and output[1]["name"] == "get_weather"
    message = client.post("/v1/messages", json={
        "model": "test-model", "max_tokens": 64, "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]}).get_json()
    assert [block["type"] for block in message["content"]] == ["text", "tool_use"]
    assert message["content"][0]["text"].strip() == "I will check." and message["stop_reason"] == "tool_use"


def test_text_that_only_looked_like_a_marker_is_told(make_app):
    pieces = text_pieces(b"Use", b" <b>", b"bold</b>.")
    client = make_app(engine=fake_engine([1, 2, 3, 0], pieces, tool_parser="hermes")).test_client()
    choice = client.post("/v1/chat/completions", json=BODY).get_json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "Use <b>bold</b>."


def test_phi4_mini_reads_its_tools_from_the_system_message():
    plan = tool_plan([WEATHER])
    phi4 = plan.__class__(plan.functions, plan.forced, plan.parallel, FORMATS["phi4_mini"])
    rendered = template_messages([{"role": "user", "content": "hi"}], phi4, template_knows_tools=True)
    assert rendered[0]["role"] == "system" and json.loads(rendered[0]["tools"]) == [WEATHER["function"]]
    assert template_messages([{"role": "user", "content": "hi"}], plan, template_knows_tools=True)[0]["role"] == "user"
