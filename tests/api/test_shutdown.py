"""A worker that must exit while a generation still runs (gunicorn's graceful timeout ending): the generation is
ended first, so that what the engine did for the key is counted and its client gets the protocol's error event
(a 503: retry), not a cut connection."""

from __future__ import annotations

import json
import threading

from phi_api.models.registry import end_running
from phi_api.web.resources import get_keys, get_models
from tests.support.fakes import fake_engine, text_pieces
from tests.support.server import wait_until
from tests.support.sse import parse_sse

KEY = {"Authorization": "Bearer sk-team-a-1"}


def test_a_generation_running_when_its_worker_exits_is_counted_and_its_client_told(make_app, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "key": "sk-team-a-1"}]}))
    gate = threading.Semaphore(0)
    engine = fake_engine([1, 2, 3] * 40, text_pieces(b"a", b"b", b"c"), gate=gate)
    app = make_app(engine=engine, API_KEYS_FILE=str(keys))
    held = app.test_client().post("/v1/chat/completions", headers=KEY, buffered=False, json={
        "model": "test-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 100, "stream": True})
    chunks = iter(held.response)
    for _ in range(4):  # the prompt, then three tokens
        gate.release()
    told = b""
    while told.count(b"data: ") < 3:  # the role's chunk, then the first tokens
        told += next(chunks)
    get_models(app).drain()
    end_running(get_models(app))
    for _ in range(8):  # the step the engine waits in ends; the next ends everything
        gate.release()
    events = parse_sse((told + b"".join(chunks)).decode())
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "unavailable", events[-3:]
    generated = sum(len(event["choices"][0]["delta"].get("content") or "") for event in events[:-2])
    assert generated >= 3
    usage = wait_until(lambda: get_keys(app).usage.totals().get("team-a"), timeout=10, message="the key's usage")
    assert usage["completion_tokens"] >= generated and usage["requests"] == 1
