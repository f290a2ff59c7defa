"""Traces of generation requests on the fake engine, into the SDK's in-memory exporter: the request's span under
the caller's traceparent, its GenAI attributes, and its waiting, prompt and generation children."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from phi_api.telemetry.tracing import configured
from phi_api.web.resources import get_tracing
from tests.support.fakes import FakeModel, RecordingEngine, Script, text_pieces

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "zebra"}], "max_tokens": 5, "temperature": 0}


@pytest.fixture
def traced(make_app):
    app = make_app(RecordingEngine(FakeModel(Script([1, 2, 0]), text_pieces(b"a", b"b")), name="test-model"))
    exporter = InMemorySpanExporter()
    get_tracing(app).start_worker(exporter)
    yield app, exporter
    get_tracing(app).stop_worker()


def test_a_request_is_a_span_under_the_caller_s_with_genai_attributes_and_three_phases(traced):
    app, exporter = traced
    answer = app.test_client().post("/v1/chat/completions", json=CHAT, headers={
        "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Priority": "2"}).get_json()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    request = spans["chat test-model"]
    assert format(request.context.trace_id, "032x") == TRACE_ID and format(request.parent.span_id, "016x") == PARENT_ID
    attributes = dict(request.attributes)
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "test-model"
    assert attributes["gen_ai.usage.input_tokens"] == answer["usage"]["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == answer["usage"]["completion_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"] == (answer["choices"][0]["finish_reason"],)
    assert attributes["gen_ai.request.max_tokens"] == 5 and attributes["phi_api.priority"] == 2
    for name in ("waiting", "prompt", "generation"):
        child = spans[name]
        assert child.parent.span_id == request.context.span_id
        assert request.start_time <= child.start_time <= child.end_time <= request.end_time
    assert spans["waiting"].end_time == spans["prompt"].start_time and spans["prompt"].end_time == spans[
        "generation"].start_time
    assert "zebra" not in str(attributes)  # no prompt text


def test_a_refused_request_is_an_error_span(traced):
    app, exporter = traced
    answer = app.test_client().post("/v1/completions", json={"model": "test-model", "prompt": "x" * 5000,
                                                              "max_tokens": 10**6})
    assert answer.status_code == 400
    [span] = exporter.get_finished_spans()
    assert span.name == "text_completion test-model" and span.status.status_code is StatusCode.ERROR


def test_tracing_is_off_unless_an_endpoint_is_set(make_app):
    assert not configured({}) and configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    app = make_app()
    assert get_tracing(app).provider is None
    assert app.test_client().post("/v1/chat/completions", json=CHAT).status_code == 200


def test_a_stream_the_client_leaves_ends_its_span(traced):
    app, exporter = traced
    response = app.test_client().post("/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 50})
    next(response.response)  # the first event, then the client goes
    response.close()
    [span] = [span for span in exporter.get_finished_spans() if span.name == "chat test-model"]
    assert span.status.status_code is StatusCode.ERROR and "client" in span.status.description
