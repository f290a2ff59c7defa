"""The official openai package against a real gunicorn serving the real model."""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import MODEL_ID

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models_list(client):
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL_ID]
    assert models.data[0].owned_by == "system"


def test_models_retrieve(client):
    assert client.models.retrieve(MODEL_ID) == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found"


def test_the_message_carries_refusal_null_as_openai_s_schema_requires(client):
    message = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=4).choices[0].message
    assert "refusal" in message.model_fields_set and message.refusal is None


def test_chat_completion_with_exact_usage(client, reference):
    completion = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=24, temperature=0)
    choice = completion.choices[0]
    assert completion.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert choice.message.content.strip()
    usage = completion.usage
    assert usage.prompt_tokens == reference.chat_tokens(QUESTION)
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_streaming_equals_non_streaming_under_greedy_decoding(client):
    plain = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=40, temperature=0)
    stream = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=40, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks[:-2])
    assert chunks[-2].choices[0].finish_reason == plain.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert streamed == plain.choices[0].message.content
    assert len({chunk.id for chunk in chunks}) == 1


def test_completions_stream_and_not(client, reference):
    prompt = "Once upon a time"
    plain = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=20, temperature=0)
    assert plain.object == "text_completion" and plain.id.startswith("cmpl-")
    assert plain.usage.prompt_tokens == reference.tokens(prompt)
    assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 20
    chunks = list(client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=20, temperature=0,
                                            stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == plain.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_sequence_streamed_and_not(client):
    plain = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=40, temperature=0)
    text = plain.choices[0].text
    stop = text[5:9]  # a string the greedy answer is known to contain
    cut = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=40, temperature=0,
                                    stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    chunks = list(client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=40,
                                            temperature=0, stop=[stop], stream=True))
    pieces = [chunk.choices[0].text for chunk in chunks]
    assert "".join(pieces) == cut.choices[0].text
    assert not any(stop in piece for piece in pieces)


def test_korean_text_streams_whole_characters(client):
    messages = [{"role": "user", "content": "한국어로 인사해 주세요. 안녕하세요! 😀"}]
    kwargs = dict(model=MODEL_ID, prompt="안녕하세요! 오늘은 날씨가 정말 좋네요. 우리는", max_tokens=48, temperature=0)
    plain = client.completions.create(**kwargs).choices[0].text
    pieces = [chunk.choices[0].text for chunk in client.completions.create(**kwargs, stream=True)]
    assert "".join(pieces) == plain
    assert any(ord(character) > 0x3000 for character in plain), plain  # the model did answer in Korean
    assert "\ufffd" not in plain
    chat = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=32, temperature=0)
    assert "\ufffd" not in chat.choices[0].message.content


def test_sdk_errors(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=3.5)
    assert (bad.value.code, bad.value.param) == ("invalid_parameter", "temperature")
    assert bad.value.body["message"] == "temperature must be between 0.0 and 2.0, got 3.5"
