"""One generation path for chat completions and completions, streaming or not."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from flask import Response, jsonify

from phi_api.engine import Finished, Generation, SamplingParams, TextDelta
from phi_api.errors import APIError, GenerationTimeoutError, InternalError, ModelNotFoundError, RateLimitError
from phi_api.extensions import get_engine, get_limiter, get_settings, get_validator
from phi_api.logs import current_request_id
from phi_api.service.features import check_supported
from phi_api.service.formats import Format, Request
from phi_api.service.params import choices, given, sampling_params
from phi_api.service.sse import KEEPALIVE, sse_response

KEEPALIVE_SECONDS = 1.0


@dataclass(frozen=True)
class Envelope:
    """The fields every response object and chunk of one request share."""

    id: str
    created: int
    model: str
    system_fingerprint: str

    def wrap(self, object: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """A response object or chunk with these ``choices``."""
        return {
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
            **extra,
        }


def usage(finished: list[Finished]) -> dict[str, Any]:
    """OpenAI's usage object for a request's choices (the prompt counts once)."""
    prompt = finished[0].prompt_tokens
    completion = sum(choice.completion_tokens for choice in finished)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": max(choice.cached_tokens for choice in finished)},
    }


def prepare(kind: Format, body: dict[str, Any]) -> tuple[Request, list[SamplingParams]]:
    """Check a schema-valid ``body`` further; build its prompt and one parameter set per choice."""
    settings = get_settings()
    engine = get_engine()
    if body["model"] != settings.MODEL_ID:
        raise ModelNotFoundError(f"The model '{body['model']}' does not exist; this server serves '{settings.MODEL_ID}'.")
    check_supported(body, kind.gates, set(get_validator().schemas[kind.schema]["properties"]))
    request = kind.read(engine, body)
    params = sampling_params(body, prompt_tokens=len(request.prompt), prompt_param=kind.prompt_param,
                             model=engine.info, settings=settings, logprobs=request.logprobs,
                             guidance=request.guidance)
    return request, choices(params, given(body, "n", 1))


def serve(kind: Format, body: dict[str, Any]) -> Response:
    """Generate for a schema-valid ``body`` and answer in ``kind``'s format (JSON, or SSE when streaming)."""
    request, params = prepare(kind, body)
    settings = get_settings()
    engine = get_engine()
    slot = get_limiter().try_acquire()
    if slot is None:
        raise RateLimitError("Too many concurrent requests. Please try again later.")
    try:
        generation = engine.submit(request.prompt, params, request_id=current_request_id())
    except BaseException:
        slot.release()
        raise
    envelope = Envelope(f"{kind.id_prefix}-{uuid.uuid4().hex}", int(time.time()), settings.MODEL_ID,
                        engine.info.fingerprint)
    builders = [kind.new_choice(index, engine, request) for index in range(len(params))]
    if given(body, "stream", False):
        include_usage = bool(given(body, "stream_options", {}).get("include_usage"))
        events = _stream(kind, envelope, generation, builders, include_usage)
        return sse_response(events, on_close=(generation.close, slot.release))
    try:
        finished = _collect(generation, builders)
    finally:
        generation.close()
        slot.release()
    results = [builder.result(done) for builder, done in zip(builders, finished)]
    return jsonify(envelope.wrap(kind.object, results, usage=usage(finished)))


def _collect(generation: Generation, builders: list[Any]) -> list[Finished]:
    finished: list[Finished | None] = [None] * len(builders)
    for event in generation.events():
        if isinstance(event, TextDelta):
            builders[event.index].add(event)
        elif isinstance(event, Finished):
            if event.reason not in ("stop", "length"):
                raise _failure(event)
            finished[event.index] = event
    return finished  # type: ignore[return-value]


def _stream(kind: Format, envelope: Envelope, generation: Generation, builders: list[Any],
            include_usage: bool) -> Iterator[Any]:
    extra = {"usage": None} if include_usage else {}

    def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
        return envelope.wrap(kind.chunk_object, choices, **extra)

    for builder in builders:
        for choice in builder.open():
            yield chunk([choice])
    finished = []
    for event in generation.events(idle_timeout=KEEPALIVE_SECONDS):
        if event is None:
            yield KEEPALIVE
        elif isinstance(event, TextDelta):
            for choice in builders[event.index].add(event):
                yield chunk([choice])
        elif event.reason not in ("stop", "length"):
            yield _failure(event).body()
            return
        else:
            finished.append(event)
            for choice in builders[event.index].close(event):
                yield chunk([choice])
    if include_usage:
        yield envelope.wrap(kind.chunk_object, [], usage=usage(sorted(finished, key=lambda done: done.index)))


def _failure(finished: Finished) -> APIError:
    """The error for a generation that ended without an answer (engine errors are mapped here)."""
    if finished.reason == "timeout":
        return GenerationTimeoutError("The generation took longer than the server's GENERATION_TIMEOUT.")
    return InternalError()
