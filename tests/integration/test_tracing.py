"""Traces from real gunicorn workers reach a real OTLP/HTTP receiver (started here, on loopback) through the SDK's
exporter and the standard environment variables; the caller's traceparent is honoured."""

from __future__ import annotations

import http.server
import threading

from openai import OpenAI
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, free_port, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        self.resources: list = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource_spans in request.resource_spans:
                    receiver.resources.append(resource_spans.resource)
                    for scope in resource_spans.scope_spans:
                        receiver.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)


def test_spans_reach_an_otlp_receiver_under_the_caller_s_trace(model_path, logs_dir):
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    try:
        with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2,
                    OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="phi-api-under-test",
                    OTEL_BSP_SCHEDULE_DELAY=100) as server:
            client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120,
                            default_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
            answer = client.chat.completions.create(model=MODEL_ID, max_tokens=6, temperature=0,
                                                    messages=[{"role": "user", "content": "Hello!"}])
            names = lambda: {span.name for span in receiver.spans}  # noqa: E731
            wait_until(lambda: {f"chat {MODEL_ID}", "waiting", "prompt", "generation"} <= names(), 30,
                       message="the spans at the receiver")
    finally:
        receiver.shutdown()
    request = next(span for span in receiver.spans if span.name == f"chat {MODEL_ID}")
    assert request.trace_id.hex() == TRACE_ID and request.parent_span_id.hex() == PARENT_ID
    attributes = {item.key: item.value for item in request.attributes}
    assert attributes["gen_ai.request.model"].string_value == MODEL_ID
    assert attributes["gen_ai.usage.input_tokens"].int_value == answer.usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"].int_value == answer.usage.completion_tokens
    children = [span for span in receiver.spans if span.parent_span_id == request.span_id]
    assert sorted(span.name for span in children) == ["generation", "prompt", "waiting"]
    services = {item.value.string_value for resource in receiver.resources for item in resource.attributes
                if item.key == "service.name"}
    assert services == {"phi-api-under-test"}
