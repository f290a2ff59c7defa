"""A stream that fails on the way for a reason nobody foresaw (a bug's exception, not one of the error tree's) ends
with its protocol's own error event, as a generic 500: its cause goes to the log, with its traceback, not to the
client; and the slot is given back."""

from __future__ import annotations

import json
import logging

import pytest

from phi_api.service.choices import ChoiceAssembler
from tests.support.fakes import fake_engine, text_pieces
from tests.support.sse import parse_named_sse, parse_sse

CAUSE = "a cause only the log may tell"
HEADERS = {"Authorization": "Bearer unused", "x-api-key": "unused", "anthropic-version": "2023-06-01"}
CHAT = {"model": "test-model", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}


def _openai_error(body: str) -> dict:
    events = parse_sse(body)
    assert events[-1] == "[DONE]" and all("choices" in event for event in events[:-2])
    return events[-2]["error"]


def _anthropic_error(body: str) -> dict:
    name, data = parse_named_sse(body)[-1]
    assert name == "error" and data["type"] == "error"
    return data["error"]


def _responses_error(body: str) -> dict:
    name, data = parse_named_sse(body)[-1]
    assert name == "response.failed" and data["response"]["status"] == "failed"
    return data["response"]["error"]


def _ollama_error(body: str) -> dict:
    last = json.loads(body.splitlines()[-1])
    return {"type": "api_error" if set(last) == {"error"} else "none", "message": last["error"]}


ROUTES = [
    ("/v1/chat/completions", CHAT, _openai_error),
    ("/v1/completions", {"model": "test-model", "max_tokens": 16, "stream": True, "prompt": "Hi"}, _openai_error),
    ("/v1/messages", CHAT, _anthropic_error),
    ("/v1/responses", {"model": "test-model", "stream": True, "input": "Hi"}, _responses_error),
    ("/api/chat", {"model": "test-model", "messages": CHAT["messages"]}, _ollama_error),
]


@pytest.mark.parametrize("path,body,error_of", ROUTES, ids=[route[0] for route in ROUTES])
def test_an_unforeseen_failure_mid_stream_ends_it_with_the_protocol_s_error(make_app, monkeypatch, caplog, path,
                                                                              body, error_of):
    app = make_app(fake_engine([1, 2, 3, 0], text_pieces(b"a", b"b", b"c")), MAX_CONCURRENT_REQUESTS=1)
    add = ChoiceAssembler.add
    seen: list[int] = []

    def failing(self, delta):
        seen.append(1)
        if len(seen) == 2:  # the answer under way: the stream's headers and first events are sent
            raise RuntimeError(CAUSE)
        return add(self, delta)

    monkeypatch.setattr(ChoiceAssembler, "add", failing)
    client = app.test_client()
    logger = logging.getLogger("phi_api")  # (the app's logging set up: its own handlers, not propagated)
    logger.addHandler(caplog.handler)
    try:
        answer = client.post(path, headers=HEADERS, json=body)
        text = answer.get_data(as_text=True)
        answer.close()  # as a server does once it is written: the run's slot is given back
    finally:
        logger.removeHandler(caplog.handler)
    assert answer.status_code == 200 and len(seen) == 2
    error = error_of(text)
    assert CAUSE not in text and error["message"]
    assert error.get("type", error.get("code")) in ("api_error", "server_error")
    assert any(CAUSE in (record.exc_text or "") for record in caplog.records)
    monkeypatch.setattr(ChoiceAssembler, "add", add)  # the one slot was given back: the next request is served
    assert client.post(path, headers=HEADERS, json={**body, "stream": False}).status_code == 200
