"""Completion features with a fake engine: n and the completion log-probability format."""

from __future__ import annotations

import math

import pytest

from tests.support.fakes import SCRIPTED_LOGIT, VOCAB, fake_engine, text_pieces
from tests.support.sse import parse_sse

BODY = {"model": "test-model", "prompt": "Once"}


def test_logprobs_in_the_completion_format(make_app):
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"upon", b" a", b" time"))
    client = make_app(engine).test_client()
    choice = client.post("/v1/completions", json={**BODY, "logprobs": 2}).get_json()["choices"][0]
    lists = choice["logprobs"]
    assert lists["tokens"] == ["upon", " a", " time"] and "".join(lists["tokens"]) == choice["text"]
    assert lists["text_offset"] == [0, 4, 6]
    scripted = SCRIPTED_LOGIT - math.log(math.exp(SCRIPTED_LOGIT) + VOCAB - 1)  # 0 but the scripted token's
    assert lists["token_logprobs"] == pytest.approx([scripted] * 3, abs=1e-5)
    assert all(len(top) >= 2 and entry in top for top, entry in zip(lists["top_logprobs"], lists["tokens"]))


def test_streamed_logprobs_continue_their_offsets(make_app):
    engine = fake_engine([1, 2, 3, 0], text_pieces(b"upon", b" a", b" time"))
    client = make_app(engine).test_client()
    events = parse_sse(client.post("/v1/completions", json={**BODY, "logprobs": 0, "stream": True})
                       .get_data(as_text=True))[:-1]
    offsets = [offset for event in events for offset in (event["choices"][0]["logprobs"] or {}).get("text_offset", [])]
    assert offsets == [0, 4, 6]


def test_n_completions(client):
    body = client.post("/v1/completions", json={**BODY, "n": 2}).get_json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 10
