"""One generation path for chat completions and completions, streaming or not."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from flask import Response, jsonify

from phi_api.engine import CapacityError, Finished, Generation, SamplingParams, TextDelta
from phi_api.errors import (
    APIError,
    ClientClosedRequestError,
    ContextLengthExceededError,
    GenerationTimeoutError,
    InternalError,
    ModelNotFoundError,
    RateLimitError,
    ServiceUnavailableError,
)
from phi_api.extensions import get_engine, get_limiter, get_settings, get_validator
from phi_api.logs import current_request_id
from phi_api.service.features import check_supported
from phi_api.service.formats import Format, Request
from phi_api.service.params import choices, given, sampling_params
from phi_api.service.sse import KEEPALIVE, sse_response
from phi_api.transport import disconnect_probe

KEEPALIVE_SECONDS = 1.0
DISCONNECT_POLL_SECONDS = 0.25


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


@dataclass
class Run:
    """A started generation: the request as read, its choices' parameters, the engine's handle, the slot."""

    request: Request
    params: list[SamplingParams]
    generation: Generation
    slot: Any

    def close(self) -> None:
        """Stop whatever still runs and give the slot back (idempotent)."""
        self.generation.close()
        self.slot.release()


def start(kind: Format, body: dict[str, Any]) -> Run:
    """Check ``body``, take a concurrency slot (or 429) and start generating."""
    if get_engine().draining:
        raise ServiceUnavailableError("This server is shutting down; please retry.")
    request, params = prepare(kind, body)
    try:
        get_engine().check_capacity(len(request.prompt), params[0].max_tokens, len(params))
    except CapacityError as exc:
        raise ContextLengthExceededError(f"This request is too large for this server: it {exc}.",
                                         param="max_tokens") from None
    slot = get_limiter().try_acquire()
    if slot is None:
        raise RateLimitError("Too many concurrent requests. Please try again later.")
    try:
        generation = get_engine().submit(request.prompt, params, request_id=current_request_id())
    except BaseException:
        slot.release()
        raise
    return Run(request, params, generation, slot)


def collect(run: Run, on_delta: Callable[[TextDelta], Any]) -> list[Finished]:
    """Wait for every choice to finish, passing each text delta to ``on_delta``; close the run.

    A choice that ends without an answer raises its error (engine errors are
    mapped here). A client that closes the connection meanwhile is noticed
    within ``DISCONNECT_POLL_SECONDS``: the generation is cancelled and its
    slot freed at once, rather than when an answer nobody reads is done.
    """
    finished: list[Finished | None] = [None] * len(run.params)
    gone = disconnect_probe()
    next_poll = time.monotonic() + DISCONNECT_POLL_SECONDS
    try:
        for event in run.generation.events(idle_timeout=DISCONNECT_POLL_SECONDS):
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + DISCONNECT_POLL_SECONDS
                if gone():
                    raise ClientClosedRequestError("The client closed the connection before the answer was ready.")
            if isinstance(event, TextDelta):
                on_delta(event)
            elif isinstance(event, Finished):
                if event.reason not in ("stop", "length"):
                    raise failure(event)
                finished[event.index] = event
    finally:
        run.close()
    return finished  # type: ignore[return-value]


def serve(kind: Format, body: dict[str, Any]) -> Response:
    """Generate for a schema-valid ``body`` and answer in ``kind``'s format (JSON, or SSE when streaming)."""
    run = start(kind, body)
    engine = get_engine()
    envelope = Envelope(f"{kind.id_prefix}-{uuid.uuid4().hex}", int(time.time()), get_settings().MODEL_ID,
                        engine.info.fingerprint)
    builders = [kind.new_choice(index, engine, run.request) for index in range(len(run.params))]
    if given(body, "stream", False):
        include_usage = bool(given(body, "stream_options", {}).get("include_usage"))
        return sse_response(_stream(kind, envelope, run, builders, include_usage), on_close=(run.close,))
    finished = collect(run, lambda delta: builders[delta.index].add(delta))
    results = [builder.result(done) for builder, done in zip(builders, finished)]
    return jsonify(envelope.wrap(kind.object, results, usage=usage(finished), metrics=openarc_metrics(finished)))


def openarc_metrics(finished: list[Finished]) -> dict[str, Any]:
    """Performance figures of a request, with OpenArc's names (seconds; tokens per second)."""
    prompt = finished[0].prompt_tokens
    new = sum(choice.completion_tokens for choice in finished)
    ttft = min((choice.time_to_first_token for choice in finished if choice.time_to_first_token is not None),
               default=0.0)
    decode = max(choice.decode_seconds for choice in finished)
    computed = prompt - max(choice.cached_tokens for choice in finished)
    decoded = sum(max(choice.completion_tokens - 1, 0) for choice in finished)
    return {
        "ttft": round(ttft, 6),
        "prefill_throughput": round(computed / ttft, 3) if ttft else 0.0,
        "decode_throughput": round(decoded / decode, 3) if decode else 0.0,
        "decode_duration": round(decode, 6),
        "tpot": round(decode / decoded, 6) if decoded else 0.0,
        "input_token": prompt,
        "new_token": new,
        "total_token": prompt + new,
    }


def _stream(kind: Format, envelope: Envelope, run: Run, builders: list[Any], include_usage: bool) -> Iterator[Any]:
    extra = {"usage": None} if include_usage else {}

    def chunk(choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return envelope.wrap(kind.chunk_object, choices, **{**extra, **more})

    for builder in builders:
        for choice in builder.open():
            yield chunk([choice])
    finished = []
    for event in run.generation.events(idle_timeout=KEEPALIVE_SECONDS):
        if event is None:
            yield KEEPALIVE
        elif isinstance(event, TextDelta):
            for choice in builders[event.index].add(event):
                yield chunk([choice])
        elif event.reason not in ("stop", "length"):
            yield failure(event).body()
            return
        else:
            finished.append(event)
            closing = builders[event.index].close(event)
            last = len(finished) == len(builders) and not include_usage
            for position, choice in enumerate(closing):
                # The very last chunk also carries the request's metrics (OpenArc's).
                more = {"metrics": openarc_metrics(finished)} if last and position == len(closing) - 1 else {}
                yield chunk([choice], **more)
    if include_usage:
        ordered = sorted(finished, key=lambda done: done.index)
        yield envelope.wrap(kind.chunk_object, [], usage=usage(ordered), metrics=openarc_metrics(ordered))


def failure(finished: Finished) -> APIError:
    """The error for a generation that ended without an answer (engine errors are mapped here)."""
    if finished.reason == "timeout":
        return GenerationTimeoutError("The generation took longer than the server's GENERATION_TIMEOUT.")
    return InternalError()
