"""Every range bound of the data model (seed 002): the bounds pass, one step beyond is invalid_parameter."""

from __future__ import annotations

import pytest

from tests.api.test_request_errors import assert_error

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "test-model", "prompt": "hi"}

BOUNDS = [
    # (route body, field, lowest, highest, below, above, extra fields)
    (CHAT, "n", 1, 8, 0, 9, {}),
    (COMPLETION, "n", 1, 8, 0, 9, {}),
    (CHAT, "top_logprobs", 0, 20, -1, 21, {"logprobs": True}),
    (COMPLETION, "logprobs", 0, 20, -1, 21, {}),
    (CHAT, "presence_penalty", -2.0, 2.0, -2.01, 2.01, {}),
    (CHAT, "frequency_penalty", -2.0, 2.0, -2.01, 2.01, {}),
    (COMPLETION, "presence_penalty", -2.0, 2.0, -2.01, 2.01, {}),
    (COMPLETION, "frequency_penalty", -2.0, 2.0, -2.01, 2.01, {}),
    (CHAT, "temperature", 0.0, 2.0, -0.01, 2.01, {}),
    (CHAT, "top_p", 0.0, 1.0, -0.01, 1.01, {}),
]


def route_of(body):
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


@pytest.mark.parametrize("body,field,lowest,highest,below,above,extra", BOUNDS)
def test_bounds_are_accepted(client, body, field, lowest, highest, below, above, extra):
    for value in (lowest, highest):
        response = client.post(route_of(body), json={**body, **extra, field: value})
        assert response.status_code == 200, (field, value, response.get_data(as_text=True))


@pytest.mark.parametrize("body,field,lowest,highest,below,above,extra", BOUNDS)
def test_one_step_beyond_is_invalid_parameter(client, body, field, lowest, highest, below, above, extra):
    for value in (below, above):
        error = assert_error(client.post(route_of(body), json={**body, **extra, field: value}), 400,
                             "invalid_request_error", "invalid_parameter", field)
        assert field in error["message"]


def test_logit_bias_bounds(client):
    assert client.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"1": -100, "2": 100}}).status_code == 200
    assert_error(client.post("/v1/chat/completions", json={**CHAT, "logit_bias": {"1": 100.5}}), 400,
                 "invalid_request_error", "invalid_parameter", "logit_bias")
