"""Every way a request can be wrong, on both generation routes: status, type, code, param."""

from __future__ import annotations

import logging

import pytest

from phi_api.engine import ChatTemplateError
from tests.support.fakes import fake_engine, text_pieces

ROUTES = {
    "/v1/chat/completions": {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "test-model", "prompt": "hi"},
}
PROMPT_PARAM = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}


def assert_error(response, status, type_, code, param):
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    error = response.get_json()["error"]
    assert (error["type"], error["code"], error["param"]) == (type_, code, param)
    assert isinstance(error["message"], str) and error["message"]
    return error


@pytest.fixture(params=list(ROUTES))
def route(request):
    return request.param


def test_unknown_model_is_404(client, route):
    response = client.post(route, json={**ROUTES[route], "model": "gpt-4"})
    assert_error(response, 404, "invalid_request_error", "model_not_found", "model")


@pytest.mark.parametrize("field,value", [("temperature", 3.5), ("top_p", 2), ("presence_penalty", -2.5),
                                         ("frequency_penalty", 9), ("max_tokens", -1), ("n", 20)])
def test_out_of_range_is_invalid_parameter(client, route, field, value):
    error = assert_error(client.post(route, json={**ROUTES[route], field: value}),
                         400, "invalid_request_error", "invalid_parameter", field)
    assert field in error["message"]


@pytest.mark.parametrize("field,value", [("max_tokens", 8.0), ("n", 1.0), ("seed", 3.5), ("max_tokens", "8"),
                                         ("temperature", "hot"), ("stream", "yes")])
def test_wrong_types_are_invalid_parameter(client, route, field, value):
    """Integer fields refuse 8.0 as OpenAI does (JSON Schema alone would take it)."""
    error = assert_error(client.post(route, json={**ROUTES[route], field: value}),
                         400, "invalid_request_error", "invalid_parameter", field)
    assert field in error["message"]


def test_missing_model_is_missing_parameter(client, route):
    body = {key: value for key, value in ROUTES[route].items() if key != "model"}
    assert_error(client.post(route, json=body), 400, "invalid_request_error", "missing_parameter", "model")


def test_missing_prompt_or_messages_is_missing_parameter(client, route):
    param = PROMPT_PARAM[route]
    assert_error(client.post(route, json={"model": "test-model"}), 400, "invalid_request_error",
                 "missing_parameter", param)


@pytest.mark.parametrize("messages", [[], [{"role": "user"}], [{"role": "wizard", "content": "x"}], "hi"])
def test_bad_messages_are_invalid_messages(client, messages):
    body = {**ROUTES["/v1/chat/completions"], "messages": messages}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                 "invalid_messages", "messages")


def test_a_template_refusal_is_invalid_messages_without_the_library_s_words(make_app, caplog):
    engine = fake_engine([1, 0], text_pieces(b"x"))

    def refuse(*args, **kwargs):
        raise ChatTemplateError("jinja2.exceptions.TemplateError at /usr/lib/python3/site-packages/x.py")

    engine.render_chat = refuse
    with caplog.at_level(logging.INFO, logger="phi_api"):
        response = make_app(engine).test_client().post("/v1/chat/completions", json=ROUTES["/v1/chat/completions"])
    error = assert_error(response, 400, "invalid_request_error", "invalid_messages", "messages")
    assert "jinja2" not in error["message"] and "/usr/lib" not in error["message"]
    assert "jinja2.exceptions.TemplateError" in caplog.text


def test_prompt_longer_than_the_context_is_context_length_exceeded(make_app, route):
    client = make_app(fake_engine([1, 0], text_pieces(b"x"), context_length=20)).test_client()
    body = dict(ROUTES[route])
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "x" * 50}]
    else:
        body["prompt"] = "x" * 50
    assert_error(client.post(route, json=body), 400, "invalid_request_error", "context_length_exceeded",
                 PROMPT_PARAM[route])


def test_a_prompt_too_long_in_bytes_to_fit_is_refused_without_tokenizing(make_app, route):
    engine = fake_engine([1, 0], text_pieces(b"xy"), context_length=20)  # at most 20 tokens of 2 bytes
    calls = []
    engine.model.encode = lambda text: calls.append(text) or []
    body = dict(ROUTES[route])
    text = "x y " * 20
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    assert_error(make_app(engine).test_client().post(route, json=body), 400, "invalid_request_error",
                 "context_length_exceeded", PROMPT_PARAM[route])
    assert calls == []


@pytest.mark.parametrize("run,refused", [(4096, False), (4097, True)])
def test_runs_without_whitespace_beyond_the_limit_are_refused(make_app, route, run, refused):
    client = make_app(fake_engine([1, 0], text_pieces(b"word"), context_length=100_000)).test_client()
    text = "word " + "k" * run + " word"
    body = dict(ROUTES[route])
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    response = client.post(route, json={**body, "max_tokens": 1})
    if not refused:
        assert response.status_code == 200, response.get_data(as_text=True)
        return
    code = "invalid_messages" if route == "/v1/chat/completions" else "invalid_parameter"
    error = assert_error(response, 400, "invalid_request_error", code, PROMPT_PARAM[route])
    assert "4096" in error["message"]


def test_max_tokens_beyond_the_context_is_context_length_exceeded(make_app, route):
    client = make_app(fake_engine([1, 0], text_pieces(b"x"), context_length=40)).test_client()
    assert_error(client.post(route, json={**ROUTES[route], "max_tokens": 39}), 400, "invalid_request_error",
                 "context_length_exceeded", "max_tokens")


@pytest.mark.parametrize("field,value", [
    ("audio", {"voice": "alloy", "format": "wav"}), ("store", True), ("modalities", ["text", "audio"]),
    ("reasoning_effort", "low"),
    ("web_search_options", {}), ("service_tier", "flex"), ("functions", [{"name": "f"}]),
    ("function_call", "auto"),
])
def test_valid_but_unsupported_chat_features_are_refused_not_ignored(client, field, value):
    body = {**ROUTES["/v1/chat/completions"], field: value}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                 "unsupported_parameter", field)


def test_image_parts_are_refused_saying_so(client):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    error = assert_error(client.post("/v1/chat/completions", json={**ROUTES["/v1/chat/completions"],
                                                                   "messages": messages}),
                         400, "invalid_request_error", "unsupported_parameter", "messages")
    assert "image_url" in error["message"]


@pytest.mark.parametrize("field,value", [("suffix", "tail"), ("best_of", 2)])
def test_valid_but_unsupported_completion_features_are_refused(client, field, value):
    body = {**ROUTES["/v1/completions"], field: value}
    assert_error(client.post("/v1/completions", json=body), 400, "invalid_request_error",
                 "unsupported_parameter", field)


def test_top_logprobs_needs_logprobs(client):
    body = {**ROUTES["/v1/chat/completions"], "top_logprobs": 2}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                 "invalid_parameter", "top_logprobs")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_tool_choice_needs_tools(client, choice):
    body = {**ROUTES["/v1/chat/completions"], "tool_choice": choice}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                 "invalid_parameter", "tool_choice")


def test_tool_choice_must_name_a_given_tool(client):
    body = {**ROUTES["/v1/chat/completions"], "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}}
    assert_error(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error",
                 "invalid_parameter", "tool_choice")


def test_max_tokens_0_without_echo_only_computes_the_prompt(client):
    """The way to store a prompt's keys and values ahead of the requests that will start with it."""
    body = {**ROUTES["/v1/completions"], "max_tokens": 0}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.get_json()
    [choice] = answer.get_json()["choices"]
    assert choice["text"] == "" and choice["finish_reason"] == "length"
    usage = answer.get_json()["usage"]
    assert usage["completion_tokens"] == 0 and usage["prompt_tokens"] > 0


def test_stream_options_without_stream(client, route):
    body = {**ROUTES[route], "stream_options": {"include_usage": True}}
    assert_error(client.post(route, json=body), 400, "invalid_request_error", "invalid_parameter", "stream_options")


def test_more_prompts_than_one_request_holds_are_refused(client):
    body = {**ROUTES["/v1/completions"], "prompt": ["a"] * 65, "n": 2}  # 130 choices: past 128
    assert_error(client.post("/v1/completions", json=body), 400, "invalid_request_error",
                 "invalid_parameter", "prompt")


def test_token_ids_beyond_the_vocabulary(client):
    body = {**ROUTES["/v1/completions"], "prompt": [1, 10_000]}
    assert_error(client.post("/v1/completions", json=body), 400, "invalid_request_error",
                 "invalid_parameter", "prompt")


def test_empty_prompt(client):
    assert_error(client.post("/v1/completions", json={**ROUTES["/v1/completions"], "prompt": ""}),
                 400, "invalid_request_error", "invalid_parameter", "prompt")


def test_unknown_fields_are_ignored(client, route):
    assert client.post(route, json={**ROUTES[route], "future_field": 1}).status_code == 200


def test_over_the_concurrency_limit_is_429(make_app, route):
    client = make_app(MAX_CONCURRENT_REQUESTS=1).test_client()
    held = client.post(route, json={**ROUTES[route], "stream": True}, buffered=False)
    assert held.status_code == 200
    refused = client.post(route, json=ROUTES[route])
    error = assert_error(refused, 429, "rate_limit_error", "rate_limit_exceeded", None)
    assert error["message"] == "Too many concurrent requests. Please try again later."
    assert refused.headers["Retry-After"] == "1"
    held.close()  # the stream's slot comes back when its response is closed
    assert client.post(route, json=ROUTES[route]).status_code == 200


def test_get_endpoints_are_never_limited(make_app):
    client = make_app(MAX_CONCURRENT_REQUESTS=1).test_client()
    held = client.post("/v1/completions", json={**ROUTES["/v1/completions"], "stream": True}, buffered=False)
    assert client.get("/v1/models").status_code == 200
    held.close()
