"""Request priority: the ``priority`` field (vLLM's: lower is sooner) and the ``X-Priority`` header reach the engine."""

from __future__ import annotations

import pytest

from tests.api.test_request_errors import ROUTES, assert_error
from tests.support.fakes import fake_engine, text_pieces

OLLAMA = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": False}
MESSAGES = {"model": "test-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def engine():
    return fake_engine([1, 0], text_pieces(b"ok"))


@pytest.mark.parametrize("route", list(ROUTES))
def test_the_field_and_the_header_set_the_priority_and_the_field_wins(make_app, engine, route):
    client = make_app(engine).test_client()
    for body, headers in (({}, {}), ({"priority": -3}, {}), ({}, {"X-Priority": "7"}),
                          ({"priority": 2}, {"X-Priority": "7"})):
        assert client.post(route, json={**ROUTES[route], **body}, headers=headers).status_code == 200
    assert engine.model.script.priorities == [0, -3, 7, 2]


@pytest.mark.parametrize("route,body", [("/api/chat", OLLAMA), ("/v1/messages", MESSAGES)])
def test_other_protocols_take_the_header(make_app, engine, route, body):
    client = make_app(engine).test_client()
    assert client.post(route, json=body, headers={"X-Priority": "-5"}).status_code == 200
    assert engine.model.script.priorities == [-5]


@pytest.mark.parametrize("header", ["soon", "1.5", str(2**31), ""])
def test_a_header_that_is_not_an_integer_in_range_is_a_400_naming_it(make_app, engine, header):
    client = make_app(engine).test_client()
    response = client.post("/v1/chat/completions", json=ROUTES["/v1/chat/completions"], headers={"X-Priority": header})
    assert_error(response, 400, "invalid_request_error", "invalid_parameter", "X-Priority")
    assert engine.model.script.priorities == []


@pytest.mark.parametrize("value", ["high", 1.5, 2**31])
def test_a_priority_field_that_is_not_an_integer_in_range_is_a_400(make_app, engine, value):
    client = make_app(engine).test_client()
    response = client.post("/v1/completions", json={**ROUTES["/v1/completions"], "priority": value})
    assert_error(response, 400, "invalid_request_error", "invalid_parameter", "priority")
