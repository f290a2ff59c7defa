"""LOG_FORMAT=json: every line one JSON object, with the request's and the generation's fields."""

from __future__ import annotations

import io
import json
import logging
import sys

import gevent

from phi_api.telemetry.logs import JSONFormatter, TextFormatter, configure_logging
from tests.support.fakes import FakeModel, RecordingEngine, Script, text_pieces
from tests.support.server import wait_until


def test_json_lines_carry_the_request_and_generation_fields(make_app):
    engine = RecordingEngine(FakeModel(Script([1, 0]), text_pieces(b"hi")), name="test-model")
    app = make_app(engine, LOG_FORMAT="json")
    logger = logging.getLogger("phi_api")
    [ours] = [handler for handler in logger.handlers if type(handler).__name__ == "_PhiApiHandler"]
    assert isinstance(ours.formatter, JSONFormatter)
    stream = io.StringIO()
    ours.setStream(stream)
    try:
        answer = app.test_client().post("/v1/chat/completions", headers={"X-Request-Id": "req-1", "X-Priority": "3"},
                                        json={"model": "test-model", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200
        answer.close()  # the access line is written once the response is sent
        # The generation's line is written on the hub, when the engine's report reaches it.
        wait_until(lambda: gevent.sleep(0.01) or '"finish_reason"' in stream.getvalue(), 10, message="its line")
    finally:
        ours.setStream(sys.stderr)
        configure_logging("INFO", "text")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    generation = next(line for line in lines if line.get("finish_reason"))
    access = next(line for line in lines if line.get("path") == "/v1/chat/completions")
    assert generation["request_id"] == access["request_id"] == "req-1"
    assert generation["model"] == "test-model" and generation["priority"] == 3
    assert generation["prompt_tokens"] > 0 and generation["completion_tokens"] == answer.get_json()["usage"][
        "completion_tokens"]
    assert access["status"] == 200 and access["method"] == "POST" and access["duration_ms"] >= 0
    assert {"time", "level", "pid", "logger", "message"} <= set(access)


def test_text_stays_the_default():
    configure_logging("INFO")
    [ours] = [handler for handler in logging.getLogger("phi_api").handlers
              if type(handler).__name__ == "_PhiApiHandler"]
    assert not isinstance(ours.formatter, JSONFormatter)


def test_the_request_line_names_the_key_never_the_key_itself(make_app):
    app = make_app(API_KEYS="sk-secret-123", LOG_FORMAT="json")
    [ours] = [handler for handler in logging.getLogger("phi_api").handlers
              if type(handler).__name__ == "_PhiApiHandler"]
    stream = io.StringIO()
    ours.setStream(stream)
    try:
        app.test_client().get("/v1/models", headers={"Authorization": "Bearer sk-secret-123"}).close()
    finally:
        ours.setStream(sys.stderr)
        configure_logging("INFO", "text")
    [line] = [json.loads(text) for text in stream.getvalue().splitlines() if '"path": "/v1/models"' in text]
    assert line["key"] == "key-1" and "sk-secret-123" not in stream.getvalue()


def test_text_lines_escape_what_a_client_sends_and_indent_tracebacks():
    formatter = TextFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("phi_api.access", logging.INFO, __file__, 1, "%s %s %d", ("GET", "/y\x1b[31m\r\n2026 "
                               "INFO forged\x9b\x7f", 401), None)
    line = formatter.format(record)
    assert line == "INFO GET /y\\x1b[31m\\r\\n2026 INFO forged\\x9b\\x7f 401" and "\n" not in line
    failed = logging.LogRecord("phi_api.engine", logging.ERROR, __file__, 1, "generation failed", (), None)
    failed.traceback = "Traceback (most recent call last):\n  File x\nValueError: bad\n2026-01-01 forged"
    lines = formatter.format(failed).splitlines()
    assert lines[0] == "ERROR generation failed" and all(line.startswith("  ") for line in lines[1:])


def test_unicode_line_separators_and_bidi_controls_are_escaped_in_both_formats():
    """splitlines() and log viewers break lines at U+2028 and U+2029; U+202E reverses how the rest of a line reads."""
    path = "/v1/x\u20282026 INFO phi_api.access: POST /admin 200\u2029\u202egpj.exe"
    record = logging.LogRecord("phi_api.access", logging.INFO, __file__, 1, "GET %s", (path,), None)
    text = TextFormatter("%(levelname)s %(message)s").format(record)
    assert text.splitlines() == [text] and "\\u2028" in text and "\\u202e" in text
    assert not any(char in text for char in "\u2028\u2029\u202e")
    line = JSONFormatter().format(record)
    assert line.splitlines() == [line] and json.loads(line)["message"] == f"GET {path}"
