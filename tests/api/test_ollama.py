"""Ollama's API with a fake engine: shapes, NDJSON framing, options, errors in Ollama's shape."""

from __future__ import annotations

import json

import pytest

from tests.conftest import HELLO_PIECES
from tests.support.fakes import fake_engine, text_pieces

GENERATE = {"model": "test-model", "prompt": "Say hello"}
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "Say hello"}]}


def ndjson(response) -> list[dict]:
    raw = response.get_data()
    assert response.mimetype == "application/x-ndjson"
    assert raw.endswith(b"\n") and b"\n\n" not in raw  # one object per line, nothing else
    lines = raw.split(b"\n")[:-1]
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("path", ["/v1/generate", "/api/generate"])
def test_generate_streams_ndjson_by_default(client, path):
    lines = ndjson(client.post(path, json=GENERATE))
    assert all(line["done"] is False for line in lines[:-1]) and lines[-1]["done"] is True
    assert "".join(line["response"] for line in lines) == "Hello, world!"
    last = lines[-1]
    assert last["done_reason"] == "stop" and last["model"] == "test-model"
    assert last["prompt_eval_count"] == len("<user>Say hello<assistant>") and last["eval_count"] == 5
    for field in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(last[field], int) and last[field] >= 0
    assert last["created_at"].endswith("Z")


def test_generate_without_streaming_is_one_object(client):
    body = client.post("/api/generate", json={**GENERATE, "stream": False}).get_json()
    assert body["response"] == "Hello, world!" and body["done"] is True and body["eval_count"] == 5


def test_system_and_raw(make_app):
    engine = fake_engine([1, 0], text_pieces(b"ok"))
    client = make_app(engine).test_client()
    client.post("/api/generate", json={**GENERATE, "system": "Be brief.", "stream": False})
    assert engine.model.rendered[-1] == "<system>Be brief.<user>Say hello<assistant>"
    body = client.post("/api/generate", json={**GENERATE, "raw": True, "stream": False}).get_json()
    assert body["prompt_eval_count"] == len("Say hello")  # the prompt as it is, no template


def test_options_map_to_the_engine(make_app):
    engine = fake_engine([1, 1, 1, 1, 0], text_pieces(b"a"))
    client = make_app(engine).test_client()
    options = {"temperature": 0.4, "top_p": 0.9, "top_k": 7, "num_predict": 3, "seed": 5, "repeat_penalty": 1.2,
               "stop": ["zzz"]}
    body = client.post("/api/generate", json={**GENERATE, "options": options, "stream": False}).get_json()
    used = engine.model.script.params[-1]
    assert (used.temperature, used.top_p, used.top_k, used.seed, used.repetition_penalty) == (0.4, 0.9, 7, 5, 1.2)
    assert body["eval_count"] == 3 and body["done_reason"] == "length"


@pytest.mark.parametrize("path,request_body", [("/api/chat", {**CHAT, "stream": False}),
                                               ("/api/generate", {**GENERATE, "stream": False})])
def test_seed_minus_one_as_ollama_s_clients_send_it(client, path, request_body):
    answers = [client.post(path, json={**request_body, "options": {"seed": -1, "temperature": 0.8}})
               for _ in range(2)]
    assert [answer.status_code for answer in answers] == [200, 200], answers[0].get_json()
    first, again = (answer.get_json() for answer in answers)
    assert first["eval_count"] == 5 and first["done_reason"] == "stop"
    assert first.get("message", first.get("response")) == again.get("message", again.get("response"))


OPEN_WEBUI_OPTIONS = {"temperature": 0, "num_predict": 24, "num_ctx": 2048, "repeat_last_n": 32, "num_thread": 2,
                      "mirostat": 0, "num_keep": 4, "num_gpu": 0, "typical_p": 0.9, "use_mmap": True,
                      "some_future_option": 1}


@pytest.mark.parametrize("path,request_body", [("/api/chat", {**CHAT, "stream": False}),
                                               ("/api/generate", {**GENERATE, "stream": False}),
                                               ("/v1/generate", {**GENERATE, "stream": False})])
def test_every_documented_option_is_accepted_the_meaningful_ones_applied(make_app, caplog, path, request_body):
    engine = fake_engine([1, 1, 1, 1, 0], text_pieces(b"a"))
    client = make_app(engine).test_client()
    with caplog.at_level("INFO", logger="phi_api.protocols.ollama"):
        answer = client.post(path, json={**request_body, "options": OPEN_WEBUI_OPTIONS})
    assert answer.status_code == 200, answer.get_json()
    used = engine.model.script.params[-1]
    assert (used.temperature, used.max_tokens, used.penalty_window) == (0.0, 24, 32)
    assert "ignored: mirostat, num_gpu, num_keep, num_thread, some_future_option, typical_p, use_mmap" in caplog.text


def test_the_ignored_options_log_line_is_bounded_whatever_the_body_holds(client, caplog):
    options = {"a" * 1_000_000: 1, **{f"future_option_{index:02}": 1 for index in range(30)}}
    with caplog.at_level("INFO", logger="phi_api.protocols.ollama"):
        answer = client.post("/api/generate", json={**GENERATE, "stream": False, "options": options})
    assert answer.status_code == 200, answer.get_json()
    [line] = [record.getMessage() for record in caplog.records if "ignored" in record.getMessage()]
    assert len(line) < 1000 and "a" * 64 + "..., future_option_00" in line and "a" * 65 not in line
    assert line.endswith("future_option_08 and 21 more")  # the names sorted: the long one, then 9 of 30


def test_repeat_last_n_defaults_to_ollama_s_64_and_minus_one_means_every_token(make_app):
    engine = fake_engine([1, 0], text_pieces(b"a"))
    client = make_app(engine).test_client()
    for options, window in (({}, 64), ({"repeat_last_n": -1}, None), ({"repeat_last_n": 0}, 0)):
        client.post("/api/chat", json={**CHAT, "stream": False, "options": options})
        assert engine.model.script.params[-1].penalty_window == window


def test_num_ctx_bounds_the_context(make_app):
    client = make_app().test_client()
    long_chat = {**CHAT, "stream": False, "messages": [{"role": "user", "content": "word " * 60}]}
    refused = client.post("/api/chat", json={**long_chat, "options": {"num_ctx": 32}})
    assert refused.status_code == 400 and "num_ctx" in refused.get_json()["error"]
    assert client.post("/api/chat", json={**long_chat, "options": {"num_ctx": 4096}}).status_code == 200


def test_format_json_is_a_grammar(make_app):
    engine = fake_engine([1, 0], text_pieces(b"{}"))
    client = make_app(engine).test_client()
    client.post("/api/generate", json={**GENERATE, "format": "json", "stream": False})
    assert engine.model.script.grammars[-1][0] == "json_schema"


def test_chat_streams_messages(client):
    lines = ndjson(client.post("/api/chat", json=CHAT))
    assert all(line["message"]["role"] == "assistant" for line in lines)
    assert "".join(line["message"]["content"] for line in lines) == "Hello, world!"
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"


def test_chat_tool_calls_in_ollama_s_form(make_app):
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    engine = fake_engine([1, 0], text_pieces(call.encode()))
    client = make_app(engine).test_client()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    body = client.post("/api/chat", json={**CHAT, "tools": tools, "stream": False}).get_json()
    assert body["message"]["tool_calls"] == [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]


def test_a_tagged_model_name(client):
    assert client.post("/api/generate", json={**GENERATE, "model": "test-model:latest",
                                              "stream": False}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/tags", "/api/tags"])
def test_tags_in_both_forms(client, path):
    body = client.get(path).get_json()
    assert body["data"][0]["id"] == "test-model" and body["data"][0]["object"] == "model"
    model = body["models"][0]
    assert model["name"] == model["model"] == "test-model"
    assert model["details"]["format"] == "onnx" and isinstance(model["size"], int)


def test_show_and_version(client):
    shown = client.post("/api/show", json={"model": "test-model"}).get_json()
    assert "template" in shown and shown["details"]["family"] == "fake"
    assert client.get("/api/version").get_json()["version"]


@pytest.mark.parametrize("path,body,status", [
    ("/api/generate", {**GENERATE, "model": "llama3"}, 404),
    ("/api/chat", {**CHAT, "model": "llama3"}, 404),
    ("/api/show", {"model": "llama3"}, 404),
    ("/api/generate", {"prompt": "hi"}, 400),
    ("/api/generate", {**GENERATE, "options": {"temperature": 9}}, 400),
    ("/api/generate", {**GENERATE, "options": {"mirostat": "2"}}, 400),  # the wrong type
    ("/api/chat", {**CHAT, "options": {"num_ctx": "2048"}}, 400),
    ("/api/generate", {**GENERATE, "images": ["aGk="]}, 400),
    ("/api/chat", {"model": "llama3", "messages": []}, 404),  # a load of a model not served
    ("/api/generate", {"model": "llama3"}, 404),
    ("/v1/generate", {**GENERATE, "think": True}, 400),
])
def test_errors_take_ollama_s_shape(client, path, body, status):
    response = client.post(path, json=body)
    assert response.status_code == status
    error = response.get_json()
    assert list(error) == ["error"] and isinstance(error["error"], str) and error["error"]


def test_bad_json_on_an_ollama_route_is_plain_too(client):
    response = client.post("/api/generate", data=b"{", content_type="application/json")
    assert response.status_code == 400 and list(response.get_json()) == ["error"]


def test_rate_limit_in_ollama_s_shape(make_app):
    client = make_app(MAX_CONCURRENT_REQUESTS=1).test_client()
    held = client.post("/api/generate", json=GENERATE, buffered=False)
    refused = client.post("/api/generate", json=GENERATE)
    assert refused.status_code == 429 and "error" in refused.get_json()
    held.close()


def test_a_keep_alive_longer_than_any_clock_keeps_the_model_and_frees_the_slot(make_app):
    client = make_app(MAX_CONCURRENT_REQUESTS=1).test_client()
    for _ in range(2):  # a slot left held by the first would make the second a 429
        answer = client.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": "1" + "0" * 300 + "h"})
        assert answer.status_code == 200, answer.get_json()


@pytest.mark.parametrize("stream", [False, True])
def test_a_renderer_that_fails_gives_the_slot_back(make_app, monkeypatch, stream):
    def failing(*args):
        raise OverflowError("a renderer's failure")

    monkeypatch.setattr("phi_api.api.ollama._note_use", failing)  # called in the renderer, after admission
    client = make_app(MAX_CONCURRENT_REQUESTS=1).test_client()
    for _ in range(2):  # a slot left held by the first would make the second a 429
        assert client.post("/api/chat", json={**CHAT, "stream": stream}).status_code == 500


@pytest.mark.parametrize("value,seconds", [("10m", 600.0), ("30s", 30.0), ("1.5h", 5400.0), (45, 45.0),
                                           ("-1", 10 * 365 * 86400.0), ("soon", None), (None, None),
                                           ("1" + "0" * 300 + "h", 10 * 365 * 86400.0),  # past any clock
                                           ("9" * 400, 10 * 365 * 86400.0)])  # float: inf
def test_keep_alive_durations_as_ollama_writes_them(value, seconds):
    from phi_api.protocols.ollama import keep_alive_seconds

    assert keep_alive_seconds({"keep_alive": value}) == seconds


def test_keep_alive_keeps_the_model_at_least_that_long_on_every_worker(make_app):
    import time

    from phi_api.web.resources import get_models

    app = make_app()
    client = app.test_client()
    assert client.post("/api/chat", json={**CHAT, "stream": False, "keep_alive": "2h"}).status_code == 200
    with app.app_context():
        keep_file = get_models().keep_alive.path("test-model")
    assert keep_file.stat().st_mtime > time.time() + 7000


@pytest.mark.parametrize("path,body,said", [
    ("/api/generate", {"model": "test-model"}, {"response": ""}),
    ("/api/generate", {"model": "test-model:latest", "prompt": "", "stream": True}, {"response": ""}),
    ("/api/chat", {"model": "test-model", "messages": []}, {"message": {"role": "assistant", "content": ""}}),
    ("/api/chat", {"model": "test-model"}, {"message": {"role": "assistant", "content": ""}}),
])
def test_a_request_without_a_prompt_only_loads_the_model_as_ollama_s_does(make_app, path, body, said):
    """``ollama run`` and UIs preload a model so: one object at once, done_reason "load", nothing generated."""
    engine = fake_engine([1, 2, 0], HELLO_PIECES)
    client = make_app(engine).test_client()
    answer = client.post(path, json=body)
    assert answer.status_code == 200 and answer.mimetype == "application/json"
    got = answer.get_json()
    assert {key: got[key] for key in (*said, "model", "done", "done_reason")} == \
        {**said, "model": "test-model", "done": True, "done_reason": "load"} and got["created_at"].endswith("Z")
    assert not engine.model.script.params  # nothing was generated


def test_a_load_with_keep_alive_0_unloads_the_model(client):
    answer = client.post("/api/generate", json={"model": "test-model", "keep_alive": 0}).get_json()
    assert answer["done_reason"] == "unload" and answer["done"] is True
    assert client.get("/api/ps").get_json()["models"] == []


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_as_ollama_writes_them(make_app, stream):
    """Ollama's logprobs (which its Python client sends): each answer token's entry, with top_logprobs alternatives,
    in the objects that carry its text."""
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"Hel", b"lo", b"!"))
    client = make_app(engine).test_client()
    body = {**CHAT, "stream": stream, "logprobs": True, "top_logprobs": 2}
    objects = [json.loads(line) for line in client.post("/api/chat", json=body).get_data(as_text=True).splitlines()]
    entries = [entry for got in objects for entry in got.get("logprobs", [])]
    assert "".join(got["message"]["content"] for got in objects) == "".join(entry["token"] for entry in entries)
    assert [entry["token"] for entry in entries] == ["Hel", "lo", "!"]
    assert all(entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 2 for entry in entries)
    assert entries[0]["top_logprobs"][0]["logprob"] == entries[0]["logprob"]  # the chosen token: the likeliest
    plain = json.loads(client.post("/api/chat", json={**CHAT, "stream": False}).get_data(as_text=True))
    assert "logprobs" not in plain
    refused = client.post("/api/generate", json={**GENERATE, "top_logprobs": 2})
    assert refused.status_code == 400 and "logprobs" in refused.get_json()["error"]
