"""OpenTelemetry traces of generation requests, through the standard SDK and its environment variables.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set: then nothing of
OpenTelemetry is even imported. On, each worker (after the fork: the exporter has a thread) sends its spans over
OTLP/HTTP in batches; ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_HEADERS`` and
the batch processor's ``OTEL_BSP_*`` variables work as the SDK documents them.

A generation request is one span, ``{operation} {model}`` (the GenAI semantic conventions: ``chat`` or
``text_completion``), the child of the caller's span when the request carries a W3C ``traceparent``, with three
children timed from the engine's own figures: ``waiting`` (until the engine admitted it), ``prompt`` (until its
first token) and ``generation`` (until its last). Attributes: ``gen_ai.operation.name``, ``gen_ai.provider.name``,
``gen_ai.request.model``, ``gen_ai.request.max_tokens``, ``gen_ai.request.temperature``, ``gen_ai.request.top_p``,
``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``, ``gen_ai.response.finish_reasons``, and
``phi_api.cached_tokens``, ``phi_api.priority``, ``phi_api.request_id``. Prompts and answers are never recorded.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from phi_api.engine import Finished

PROVIDER_NAME = "phi-api"


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces."""
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) \
        and environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


class Tracing:
    """This process's tracer provider, once set up (None: tracing is off); a resource of the app."""

    def __init__(self) -> None:
        self.provider: Any = None

    def start_worker(self, exporter: Any = None) -> None:
        """Set this process's tracer provider up (call after the fork): OTLP/HTTP, or ``exporter`` (tests)."""
        self.provider = _new_provider(exporter)

    def stop_worker(self) -> None:
        """Send what is left (the worker is exiting)."""
        if self.provider is not None:
            self.provider.shutdown()

    def start_request(self, operation: str, model: str, headers: Mapping[str, str], *, choices: int,
                      attributes: dict[str, Any]) -> RequestSpan | None:
        """The span of a generation request (None when tracing is off), the child of ``headers``' W3C
        ``traceparent``; ``attributes``: the request's (None values are left out)."""
        if self.provider is None:
            return None
        from opentelemetry import propagate, trace

        started = time.time_ns()
        given = {"gen_ai.operation.name": operation, "gen_ai.provider.name": PROVIDER_NAME,
                 "gen_ai.request.model": model, **attributes}
        span = self.provider.get_tracer(__name__).start_span(
            f"{operation} {model}", context=propagate.extract({name.lower(): value for name, value in headers.items()}),
            kind=trace.SpanKind.SERVER,
            attributes={name: value for name, value in given.items() if value is not None}, start_time=started)
        return RequestSpan(self.provider, span, started, choices)


def _new_provider(exporter: Any) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME",
                                                                                         "phi-api")}))
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@dataclass
class RequestSpan:
    """The span of one generation request, ended when its last choice has."""

    provider: Any
    span: Any
    started_ns: int
    choices: int
    finished: list[Finished] = field(default_factory=list)

    def observe(self, finished: Finished) -> None:
        if not self.span.is_recording():  # closed already: its client went before this end was read
            return
        self.finished.append(finished)
        if len(self.finished) == self.choices:
            self.end()

    def close(self) -> None:
        """The request's answer is closed: a span still open (the client went before the end) ends now."""
        if len(self.finished) < self.choices and self.span.is_recording():
            from opentelemetry.trace import Status, StatusCode

            self.span.set_status(Status(StatusCode.ERROR, "the client closed the request"))
            self.span.end()

    def fail(self, error: BaseException) -> None:
        """The request was refused before it ran."""
        from opentelemetry.trace import Status, StatusCode

        self.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self.span.end()

    def end(self) -> None:
        from opentelemetry.trace import Status, StatusCode

        first = self.finished[0]
        self.span.set_attributes({
            "gen_ai.usage.input_tokens": first.prompt_tokens,
            "gen_ai.usage.output_tokens": sum(item.completion_tokens for item in self.finished),
            "gen_ai.response.finish_reasons": [item.reason for item in self.finished],
            "phi_api.cached_tokens": first.cached_tokens,
        })
        now = time.time_ns()
        self._phases(first, now)
        if not all(item.ok for item in self.finished):
            self.span.set_status(Status(StatusCode.ERROR, ", ".join(item.reason for item in self.finished)))
        self.span.end(end_time=now)

    def _phases(self, first: Finished, now: int) -> None:
        """The children: waiting, prompt and generation, from the engine's times (seconds since submission)."""
        from opentelemetry import trace

        tracer = self.provider.get_tracer(__name__)
        context = trace.set_span_in_context(self.span)
        marks = [self.started_ns]
        if first.queue_seconds is not None:
            marks.append(self.started_ns + int(first.queue_seconds * 1e9))
            if first.time_to_first_token is not None:
                marks.append(self.started_ns + int(first.time_to_first_token * 1e9))
                marks.append(now)
        for name, start, end in zip(("waiting", "prompt", "generation"), marks, marks[1:], strict=False):
            tracer.start_span(name, context=context, start_time=start).end(end_time=max(start, end))
