"""Raw HTTP against the real server: SSE bytes, headers, CORS, JSON errors for everything."""

from __future__ import annotations

import http.client
import json

import requests

from tests.integration.conftest import MODEL_ID
from tests.support.sse import chat_text, parse_sse

CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12,
        "temperature": 0}


def raw_post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[http.client.HTTPResponse, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response, data


def test_sse_bytes_on_the_wire(server):
    response, data = raw_post(server, "/v1/chat/completions", json.dumps({**CHAT, "stream": True}).encode())
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    assert response.getheader("Cache-Control") == "no-cache"
    assert response.getheader("X-Accel-Buffering") == "no"
    assert response.getheader("Transfer-Encoding") == "chunked"
    text = data.decode("utf-8")
    assert text.startswith('data: {"id":"chatcmpl-')
    assert text.endswith("\n\ndata: [DONE]\n\n")
    events = parse_sse(text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chat_text(events)


def test_completion_sse_bytes(server):
    body = {"model": MODEL_ID, "prompt": "Hello", "max_tokens": 5, "temperature": 0, "stream": True}
    _, data = raw_post(server, "/v1/completions", json.dumps(body).encode())
    events = parse_sse(data.decode("utf-8"))
    assert [event["object"] for event in events[:-1]] == ["text_completion.chunk"] * (len(events) - 1)


def test_every_response_carries_a_request_id(server):
    response = requests.get(server.url + "/v1/models", headers={"X-Request-Id": "trace-123"})
    assert response.headers["X-Request-Id"] == "trace-123"
    assert len(requests.get(server.url + "/v1/models").headers["X-Request-Id"]) == 32


def test_cors_preflight_and_actual_request(server):
    preflight = requests.options(server.url + "/v1/chat/completions", headers={
        "Origin": "http://localhost:5173",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization",
    })
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] in ("*", "http://localhost:5173")
    assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
    assert "content-type" in preflight.headers["Access-Control-Allow-Headers"].lower()
    actual = requests.get(server.url + "/v1/models", headers={"Origin": "http://localhost:5173"})
    assert actual.headers["Access-Control-Allow-Origin"] in ("*", "http://localhost:5173")


def test_body_over_the_size_limit_is_413_json(server):
    huge = b'{"model": "x", "prompt": "' + b"a" * (11 * 1024 * 1024) + b'"}'
    response, data = raw_post(server, "/v1/completions", huge)
    assert response.status == 413
    assert json.loads(data)["error"]["code"] == "request_too_large"


def test_malformed_json_unknown_routes_and_wrong_methods_are_json(server):
    response, data = raw_post(server, "/v1/chat/completions", b'{"model": ')
    assert response.status == 400 and json.loads(data)["error"]["code"] == "invalid_json"
    for call, status, code in [
        (lambda: requests.get(server.url + "/v1/nothing"), 404, "not_found"),
        (lambda: requests.post(server.url + "/v1/moderations", json={}), 404, "not_found"),
        (lambda: requests.get(server.url + "/v1/chat/completions"), 405, "method_not_allowed"),
        (lambda: requests.delete(server.url + "/v1/models"), 405, "method_not_allowed"),
    ]:
        answer = call()
        assert answer.status_code == status
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.json()["error"]["code"] == code
