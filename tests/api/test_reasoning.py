"""A reasoning model's thinking, told apart from its answer in every protocol's own field, with a fake engine whose
tokenizer has thinking markers; models without them are unchanged, and refuse requests about thinking."""

from __future__ import annotations

import json

import pytest

from tests.support.fakes import fake_engine, text_pieces
from tests.support.sse import parse_sse

PIECES = text_pieces(b"<think>", b"\nThe user", b" says hi.\n", b"</think>", b"\n\nHi", b" there")
TOKENS = [1, 2, 3, 4, 5, 6, 0]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def thinker(make_app):
    engine = fake_engine(TOKENS, PIECES, think_markers=("<think>", "</think>"))
    return make_app(engine=engine).test_client()


def chat(client, **extra):
    return client.post("/v1/chat/completions", json={"model": "test-model", "messages": MESSAGES, **extra})


def test_chat_answers_carry_the_thinking_apart(thinker):
    message = chat(thinker).get_json()["choices"][0]["message"]
    assert message["content"] == "Hi there"
    assert message["reasoning_content"] == message["reasoning"] == "The user says hi."


def test_chat_streams_thinking_deltas_then_content_deltas(thinker):
    events = parse_sse(chat(thinker, stream=True).get_data(as_text=True))[:-1]
    deltas = [event["choices"][0]["delta"] for event in events]
    thinking = "".join(delta.get("reasoning_content", "") for delta in deltas)
    content = "".join(delta.get("content") or "" for delta in deltas)
    assert (thinking, content) == ("The user says hi.", "Hi there")
    last_thought = max(i for i, delta in enumerate(deltas) if "reasoning_content" in delta)
    first_word = min(i for i, delta in enumerate(deltas) if delta.get("content"))
    assert last_thought < first_word


def test_a_call_written_while_thinking_is_not_a_call(make_app):
    pieces = text_pieces(b"<think>", b'{"name": "f", "arguments": {}}', b"</think>", b"No call.")
    client = make_app(engine=fake_engine([1, 2, 3, 4, 0], pieces, think_markers=("<think>", "</think>"))).test_client()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    choice = chat(client, tools=tools).get_json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "No call."
    assert "tool_calls" not in choice["message"]


def test_a_model_that_does_not_reason_is_unchanged_and_refuses_requests_about_thinking(client):
    message = chat(client).get_json()["choices"][0]["message"]
    assert "reasoning_content" not in message and "reasoning" not in message
    refused = chat(client, reasoning_effort="high")
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "reasoning_effort"
    assert chat(client, reasoning_effort="none").status_code == 200  # it does not think anyway
    ollama = client.post("/api/chat", json={"model": "test-model", "messages": MESSAGES, "think": True,
                                            "stream": False})
    assert ollama.status_code == 400 and "reasoning models only" in ollama.get_json()["error"]


def test_thinking_that_cannot_be_turned_off_is_a_400(thinker):
    refused = chat(thinker, reasoning_effort="none")
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "reasoning_effort"
    assert "enable_thinking" in refused.get_json()["error"]["message"]
    assert chat(thinker, reasoning_effort="low").status_code == 200


def test_a_template_with_enable_thinking_turns_thinking_off(make_app):
    engine = fake_engine(TOKENS, PIECES, think_markers=("<think>", "</think>"),
                         chat_template="{% if enable_thinking is false %}...{% endif %}")
    client = make_app(engine=engine).test_client()
    assert chat(client, reasoning_effort="none").status_code == 200
    ollama = client.post("/api/chat", json={"model": "test-model", "messages": MESSAGES, "think": False,
                                            "stream": False})
    assert ollama.status_code == 200
    assert engine.model.rendered[-2:] == ["<user>hi<enable_thinking=False><assistant>"] * 2


def test_chat_template_kwargs_reach_the_template_and_cannot_replace_the_conversation(client, make_app):
    engine = fake_engine(TOKENS, PIECES)
    app_client = make_app(engine=engine).test_client()
    assert chat(app_client, chat_template_kwargs={"custom_flag": True}).status_code == 200
    assert engine.model.rendered[-1] == "<user>hi<custom_flag=True><assistant>"
    refused = chat(client, chat_template_kwargs={"messages": []})
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "chat_template_kwargs"
    bad_name = chat(client, chat_template_kwargs={"not a name": 1})
    assert bad_name.status_code == 400


def test_ollama_gives_the_thinking_as_message_thinking(thinker):
    body = {"model": "test-model", "messages": MESSAGES, "think": True}
    whole = thinker.post("/api/chat", json={**body, "stream": False}).get_json()
    assert whole["message"]["thinking"] == "The user says hi." and whole["message"]["content"] == "Hi there"
    lines = [json.loads(line) for line in thinker.post("/api/chat", json=body).get_data(as_text=True).splitlines()]
    assert "".join(line["message"].get("thinking", "") for line in lines) == "The user says hi."
    assert "".join(line["message"]["content"] for line in lines) == "Hi there" and lines[-1]["done"]
    generated = thinker.post("/api/generate", json={"model": "test-model", "prompt": "hi", "stream": False}).get_json()
    assert generated["thinking"] == "The user says hi." and generated["response"] == "Hi there"


def test_anthropic_gives_a_thinking_block_before_the_text(thinker):
    body = {"model": "test-model", "max_tokens": 64, "messages": MESSAGES}
    whole = thinker.post("/v1/messages", json=body).get_json()
    assert whole["content"] == [{"type": "thinking", "thinking": "The user says hi.", "signature": ""},
                                {"type": "text", "text": "Hi there"}]
    raw = thinker.post("/v1/messages", json={**body, "stream": True}).get_data(as_text=True)
    data = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    starts = [event["content_block"]["type"] for event in data if event["type"] == "content_block_start"]
    deltas = [event["delta"]["type"] for event in data if event["type"] == "content_block_delta"]
    assert starts == ["thinking", "text"] and deltas[0] == "thinking_delta" and deltas[-1] == "text_delta"
    assert [event["index"] for event in data if event["type"] == "content_block_stop"] == [0, 1]


def test_the_responses_api_gives_a_reasoning_item_before_the_message(thinker):
    body = {"model": "test-model", "input": "hi"}
    output = thinker.post("/v1/responses", json=body).get_json()["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "The user says hi."}]
    raw = thinker.post("/v1/responses", json={**body, "stream": True}).get_data(as_text=True)
    data = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    kinds = [event["type"] for event in data]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    done = [event for event in data if event["type"] == "response.output_item.done"]
    assert [(event["output_index"], event["item"]["type"]) for event in done] == [(0, "reasoning"), (1, "message")]
    assert data[-1]["response"]["output"][0]["content"][0]["text"] == "The user says hi."


def test_a_thinking_budget_ends_the_thinking_with_its_end_marker(make_app):
    script = [1, 2, 3, 5, 6, 0]  # left alone, the model never closes its thinking
    engine = fake_engine(script, PIECES, think_markers=("<think>", "</think>"), think_token_ids=(1, 4))
    client = make_app(engine=engine).test_client()
    unbounded = chat(client, temperature=0).get_json()["choices"][0]["message"]
    assert unbounded["content"] == "" and unbounded["reasoning_content"].endswith("Hi there")
    bounded = chat(client, temperature=0, thinking_token_budget=1).get_json()["choices"][0]["message"]
    assert (bounded["reasoning_content"], bounded["content"]) == ("The user", "Hi there")
    anthropic = client.post("/v1/messages", json={"model": "test-model", "max_tokens": 64, "messages": MESSAGES,
                                                  "thinking": {"type": "enabled", "budget_tokens": 1}}).get_json()
    assert [block.get("thinking") or block.get("text") for block in anthropic["content"]] == ["The user", "Hi there"]


def test_a_model_that_does_not_think_keeps_any_thinking_budget(client):
    answer = chat(client, thinking_token_budget=0)
    assert answer.status_code == 200 and answer.get_json()["choices"][0]["message"]["content"] == "Hello, world!"


def test_reasoning_parser_think_reads_the_markers_in_the_text_of_a_model_without_their_tokens(make_app):
    engine = fake_engine(TOKENS, PIECES, reasoning_parser="think")  # the tokenizer holds no thinking markers
    client = make_app(engine=engine).test_client()
    message = chat(client).get_json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("The user says hi.", "Hi there")
    # the budget ends the thinking with the end marker's token, which this model does not have
    refused = chat(client, thinking_token_budget=4)
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "thinking_token_budget"
    assert "text" in refused.get_json()["error"]["message"]


def test_reasoning_parser_none_leaves_a_thinker_s_thinking_in_its_answer(make_app):
    engine = fake_engine(TOKENS, PIECES, think_markers=("<think>", "</think>"), reasoning_parser="none")
    message = chat(make_app(engine=engine).test_client()).get_json()["choices"][0]["message"]
    assert message["content"] == "<think>\nThe user says hi.\n</think>\n\nHi there"
    assert "reasoning_content" not in message
