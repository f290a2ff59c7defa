"""POST /v1/chat/completions with a fake engine: shapes, streaming, usage."""

from __future__ import annotations

import re

import pytest

from tests.support.fakes import SCRIPTED_LOGIT, fake_engine, text_pieces
from tests.support.sse import chat_text, parse_sse

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Say hello"}]}


def test_non_streaming_response_has_openai_s_shape(client):
    response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    body = response.get_json()
    assert list(body) == ["id", "object", "created", "model", "system_fingerprint", "choices", "usage", "metrics"]
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", body["id"])
    assert (body["object"], body["model"]) == ("chat.completion", "test-model")
    assert body["choices"] == [{
        "index": 0,
        "message": {"role": "assistant", "content": "Hello, world!", "refusal": None},
        "logprobs": None,
        "finish_reason": "stop",
    }]
    prompt_tokens = len("<user>Say hello<assistant>")  # the fake encodes one token per character
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 5,
                             "total_tokens": prompt_tokens + 5, "prompt_tokens_details": {"cached_tokens": 0},
                             "completion_tokens_details": {"accepted_prediction_tokens": 0,
                                                           "rejected_prediction_tokens": 0}}


def test_ids_are_unique(client):
    ids = {client.post("/v1/chat/completions", json=CHAT).get_json()["id"] for _ in range(5)}
    assert len(ids) == 5


def test_streaming_sends_role_first_then_content_then_finish_then_done(client):
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.mimetype == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-cache"
    events = parse_sse(response.get_data(as_text=True))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in chunk["choices"][0]["delta"] for chunk in chunks[1:])
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert chat_text(events) == "Hello, world!"
    assert all("usage" not in chunk for chunk in chunks)


def test_include_usage_adds_a_last_chunk_and_nulls_elsewhere(client):
    response = client.post("/v1/chat/completions",
                           json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    chunks = parse_sse(response.get_data(as_text=True))[:-1]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert all(chunk["usage"] is None for chunk in chunks[:-1])


def test_stream_and_non_stream_give_the_same_text(make_app):
    pieces = text_pieces("안".encode()[:2], "안".encode()[2:] + " 😀".encode()[:3], " 😀".encode()[3:], b"!")
    app = make_app(fake_engine([1, 2, 3, 4, 0], pieces))
    client = app.test_client()
    plain = client.post("/v1/chat/completions", json=CHAT).get_json()["choices"][0]["message"]["content"]
    events = parse_sse(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).get_data(as_text=True))
    assert plain == chat_text(events) == "안 😀!"
    assert "\ufffd" not in plain


def test_stop_string_cuts_the_answer(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "stop": [" world"]}).get_json()
    assert body["choices"][0]["message"]["content"] == "Hello,"
    assert body["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_gives_length(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}).get_json()
    assert body["choices"][0]["message"]["content"] == "Hello,"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


def test_content_parts_are_joined_as_text(make_app):
    engine = fake_engine([1, 0], text_pieces(b"ok"))
    client = make_app(engine).test_client()
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    body = client.post("/v1/chat/completions", json={**CHAT, "messages": messages}).get_json()
    assert body["usage"]["prompt_tokens"] == len("<user>a\nb<assistant>")


def test_sampling_parameters_reach_the_engine(make_app):
    engine = fake_engine([1, 0], text_pieces(b"ok"))
    client = make_app(engine).test_client()
    client.post("/v1/chat/completions", json={**CHAT, "temperature": 0.3, "top_p": 0.5, "seed": 7, "top_k": 4,
                                              "max_tokens": 9})
    params = engine.model.script.params[-1]
    assert (params.temperature, params.top_p, params.top_k, params.seed, params.max_tokens) == (0.3, 0.5, 4, 7, 9)


def test_default_temperature_comes_from_settings(make_app):
    engine = fake_engine([1, 0], text_pieces(b"ok"))
    make_app(engine, DEFAULT_TEMPERATURE=0.25).test_client().post("/v1/chat/completions", json=CHAT)
    assert engine.model.script.params[-1].temperature == 0.25


def test_logit_bias_and_penalties_edit_the_logits(make_app):
    engine = fake_engine([1, 1, 1, 0], text_pieces(b"a", b"b"))
    client = make_app(engine).test_client()
    body = client.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"2": 100}, "max_tokens": 2}).get_json()
    assert body["choices"][0]["message"]["content"] == "bb"
    client.post("/v1/chat/completions", json={**CHAT, "frequency_penalty": 1.0, "max_tokens": 3})
    last = engine.model.script.logits_seen[-1]
    assert last[1] == SCRIPTED_LOGIT - 2.0  # token 1 generated twice before the third step


def test_developer_role_is_rendered_as_system(make_app):
    engine = fake_engine([1, 0], text_pieces(b"ok"))
    client = make_app(engine).test_client()
    messages = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = client.post("/v1/chat/completions", json={**CHAT, "messages": messages}).get_json()
    assert body["usage"]["prompt_tokens"] == len("<system>be brief<user>hi<assistant>")


METRICS = ["ttft", "prefill_throughput", "decode_throughput", "decode_duration", "tpot", "input_token", "new_token",
           "total_token"]


def test_responses_carry_openarc_s_metrics(client):
    metrics = client.post("/v1/chat/completions", json=CHAT).get_json()["metrics"]
    assert list(metrics) == METRICS
    assert (metrics["input_token"], metrics["new_token"]) == (len("<user>Say hello<assistant>"), 5)
    assert metrics["total_token"] == metrics["input_token"] + metrics["new_token"]
    assert metrics["ttft"] >= 0 and metrics["decode_throughput"] >= 0


def test_the_last_chunk_of_a_stream_carries_the_metrics(client):
    chunks = parse_sse(client.post("/v1/chat/completions", json={**CHAT, "stream": True}).get_data(as_text=True))[:-1]
    assert [chunk for chunk in chunks if "metrics" in chunk] == [chunks[-1]]
    assert list(chunks[-1]["metrics"]) == METRICS
    with_usage = parse_sse(client.post("/v1/chat/completions", json={
        **CHAT, "stream": True, "stream_options": {"include_usage": True}}).get_data(as_text=True))[:-1]
    assert "metrics" in with_usage[-1] and with_usage[-1]["choices"] == []


@pytest.mark.parametrize("content", ["Hello, world!", [{"type": "text", "text": "Hello, "}, {"type": "text",
                                                                                           "text": "world!"}]])
def test_a_predicted_output_reaches_the_engine_as_tokens_and_its_drafts_are_told_in_usage(make_app, content):
    engine = fake_engine([1, 0], text_pieces(b"ok"), draft_max=8)
    body = make_app(engine).test_client().post("/v1/chat/completions", json={
        **CHAT, "prediction": {"type": "content", "content": content}}).get_json()
    assert engine.model.script.params[-1].prediction == tuple(int(token) for token in
                                                               engine.model.encode("Hello, world!"))
    assert set(body["usage"]["completion_tokens_details"]) == {"accepted_prediction_tokens",
                                                               "rejected_prediction_tokens"}


@pytest.mark.parametrize("prediction", [{"type": "content"}, {"type": "image", "content": "x"}, {"content": "x"},
                                        {"type": "content", "content": 3}, {"type": "content", "content": []}])
def test_a_malformed_prediction_is_a_400(client, prediction):
    response = client.post("/v1/chat/completions", json={**CHAT, "prediction": prediction})
    assert response.status_code == 400 and response.get_json()["error"]["param"].startswith("prediction")


def test_a_prediction_longer_than_the_context_is_cut_to_it(make_app):
    engine = fake_engine([1, 0], text_pieces(b"ok"), draft_max=8, context_length=64)
    make_app(engine).test_client().post("/v1/chat/completions", json={
        **CHAT, "max_tokens": 4, "prediction": {"type": "content", "content": "x" * 500}})
    assert len(engine.model.script.params[-1].prediction) == 64  # no answer is longer: the rest is never drafted


def test_speculative_n_min_reaches_the_engine_and_other_fields_are_refused(make_app):
    engine = fake_engine([1, 0], text_pieces(b"ok"), draft_max=8)
    client = make_app(engine).test_client()
    answered = client.post("/v1/chat/completions", json={**CHAT, "speculative": {"n_min": 3, "n_max": 6}})
    assert answered.status_code == 200
    assert (engine.model.script.params[-1].draft_min, engine.model.script.params[-1].draft_max) == (3, 6)
    for speculative, param, named in (({"p_min": 0.5}, "speculative", "p_min"),
                                      ({"n_min": 5, "n_max": 2}, "speculative.n_min", "n_max"),
                                      ({"n_min": -1}, "speculative", "-1")):
        response = client.post("/v1/chat/completions", json={**CHAT, "speculative": speculative})
        assert response.status_code == 400, speculative
        error = response.get_json()["error"]
        assert error["param"] == param and named in error["message"], (speculative, error)
