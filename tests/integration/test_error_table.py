"""Every row of the specification's error table, from a real server."""

from __future__ import annotations

import json

import pytest
import requests

from tests.integration.conftest import MODEL_ID
from tests.support.faults import FAIL_SEED
from tests.support.server import Server, wait_until
from tests.support.sse import parse_sse

CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


@pytest.mark.parametrize(
    ("body", "status", "type_", "code", "param"),
    [
        ({**CHAT, "model": "phi-4"}, 404, "invalid_request_error", "model_not_found", "model"),
        ({**CHAT, "temperature": 2.5}, 400, "invalid_request_error", "invalid_parameter", "temperature"),
        ({**CHAT, "top_p": 1.01}, 400, "invalid_request_error", "invalid_parameter", "top_p"),
        ({**CHAT, "frequency_penalty": 2.01}, 400, "invalid_request_error", "invalid_parameter", "frequency_penalty"),
        ({**CHAT, "presence_penalty": -2.01}, 400, "invalid_request_error", "invalid_parameter", "presence_penalty"),
        ({**CHAT, "messages": []}, 400, "invalid_request_error", "invalid_messages", "messages"),
        ({**CHAT, "messages": [{"role": "user", "content": "word " * 9000}]}, 400, "invalid_request_error",
         "context_length_exceeded", "messages"),
        ({**CHAT, "max_tokens": 9000}, 400, "invalid_request_error", "context_length_exceeded", "max_tokens"),
        ({"messages": CHAT["messages"]}, 400, "invalid_request_error", "missing_parameter", "model"),
        ({"model": MODEL_ID}, 400, "invalid_request_error", "missing_parameter", "messages"),
    ],
)
def test_client_error_rows(server, body, status, type_, code, param):
    response = requests.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == status
    assert response.json() == {"error": {"message": response.json()["error"]["message"], "type": type_,
                                         "param": param, "code": code}}


@pytest.fixture(scope="module")
def faulty_server(model_path, logs_dir):
    """The real app and model, loaded through a WSGI entry that can inject an engine failure."""
    with Server(logs_dir, app="tests.support.faulty_wsgi:app", MODEL_PATH=model_path, MODEL_ID=MODEL_ID) as running:
        yield running


def test_internal_error_row_hides_the_details(faulty_server):
    response = requests.post(faulty_server.url + "/v1/chat/completions", json={**CHAT, "seed": FAIL_SEED})
    assert response.status_code == 500
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", "internal_error", None)
    assert "injected" not in error["message"] and "/internal/" not in error["message"]
    wait_until(lambda: "injected engine failure" in faulty_server.log(), timeout=10,
               message="the engine failure in the log")  # the cause goes to the log


def test_engine_failure_mid_stream_ends_with_an_error_event_and_done(faulty_server):
    response = requests.post(faulty_server.url + "/v1/chat/completions",
                             json={**CHAT, "seed": FAIL_SEED, "stream": True, "max_tokens": 50, "ignore_eos": True})
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "internal_error"
    assert "injected" not in json.dumps(events[-2])
    healthy = requests.post(faulty_server.url + "/v1/chat/completions", json=CHAT)
    assert healthy.status_code == 200  # the worker keeps serving


def test_rate_limit_row(limited_server):
    from tests.integration.test_concurrency import hold_streams

    with hold_streams(limited_server, 2):
        response = requests.post(limited_server.url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 429
    assert response.json() == {"error": {"message": "Too many concurrent requests. Please try again later.",
                                         "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}}
