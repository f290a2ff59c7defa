"""One generation path for chat completions and completions, streaming or not."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from flask import Response, jsonify

from phi_api.engine import Finished, Generation, SamplingParams, TextDelta
from phi_api.errors import (
    APIError,
    GenerationTimeoutError,
    InternalError,
    ModelNotFoundError,
    RateLimitError,
)
from phi_api.extensions import get_engine, get_limiter, get_settings, get_validator
from phi_api.logs import current_request_id
from phi_api.service.features import check_supported
from phi_api.service.formats import Format, role_delta
from phi_api.service.params import given, sampling_params
from phi_api.service.sse import KEEPALIVE, sse_response

log = logging.getLogger(__name__)

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


def usage(finished: Finished) -> dict[str, int]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
    }


def prepare(kind: Format, body: dict[str, Any]) -> tuple[np.ndarray, str, SamplingParams]:
    """Check a schema-valid ``body`` further and build its prompt (ids, echo text) and parameters."""
    settings = get_settings()
    engine = get_engine()
    if body["model"] != settings.MODEL_ID:
        raise ModelNotFoundError(f"The model '{body['model']}' does not exist; this server serves '{settings.MODEL_ID}'.")
    check_supported(body, kind.gates, set(get_validator().schemas[kind.schema]["properties"]))
    prompt, echo = kind.build_prompt(engine, body)
    params = sampling_params(body, prompt_tokens=len(prompt), prompt_param=kind.prompt_param,
                             model=engine.info, settings=settings)
    return prompt, echo, params


def serve(kind: Format, body: dict[str, Any]) -> Response:
    """Generate for a schema-valid ``body`` and answer in ``kind``'s format (JSON, or SSE when streaming)."""
    prompt, echo, params = prepare(kind, body)
    settings = get_settings()
    engine = get_engine()
    slot = get_limiter().try_acquire()
    if slot is None:
        raise RateLimitError("Too many concurrent requests. Please try again later.")
    try:
        generation = engine.submit(prompt, params, request_id=current_request_id())
    except BaseException:
        slot.release()
        raise
    envelope = Envelope(f"{kind.id_prefix}-{uuid.uuid4().hex}", int(time.time()), settings.MODEL_ID,
                        engine.info.fingerprint)
    if given(body, "stream", False):
        include_usage = bool(given(body, "stream_options", {}).get("include_usage"))
        events = _stream(kind, envelope, generation, echo, include_usage)
        return sse_response(events, on_close=(generation.close, slot.release))
    try:
        text, finished = _collect(generation)
    finally:
        generation.close()
        slot.release()
    return jsonify(envelope.wrap(kind.object, [kind.choice(echo + text, finished.reason)], usage=usage(finished)))


def _collect(generation: Generation) -> tuple[str, Finished]:
    parts = []
    for event in generation.events():
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, Finished):
            if event.reason not in ("stop", "length"):
                raise _failure(event)
            return "".join(parts), event
    raise InternalError()  # events() always ends with Finished


def _stream(kind: Format, envelope: Envelope, generation: Generation, echo: str,
            include_usage: bool) -> Iterator[Any]:
    extra = {"usage": None} if include_usage else {}
    if kind.opens_with_role:
        yield envelope.wrap(kind.chunk_object, [role_delta()], **extra)
    if echo:
        yield envelope.wrap(kind.chunk_object, [kind.delta(echo, None)], **extra)
    for event in generation.events(idle_timeout=KEEPALIVE_SECONDS):
        if event is None:
            yield KEEPALIVE
        elif isinstance(event, TextDelta):
            yield envelope.wrap(kind.chunk_object, [kind.delta(event.text, None)], **extra)
        elif event.reason not in ("stop", "length"):
            yield _failure(event).body()
        else:
            yield envelope.wrap(kind.chunk_object, [kind.delta("", event.reason)], **extra)
            if include_usage:
                yield envelope.wrap(kind.chunk_object, [], usage=usage(event))


def _failure(finished: Finished) -> APIError:
    """The error for a generation that ended without an answer (engine errors are mapped here)."""
    if finished.reason == "timeout":
        return GenerationTimeoutError("The generation took longer than the server's GENERATION_TIMEOUT.")
    return InternalError()
