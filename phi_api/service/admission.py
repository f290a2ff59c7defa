"""The one gate every generation request passes, whatever its protocol or route, before the generation path (and
every embedding or scoring request, before the encoding path).

OpenAI's chat and completions, the Responses API, Anthropic's Messages, Ollama's generate and chat, OpenArc's
bench and the Batch API's lines all come through :func:`admit`: the caller's key and what it may do, its limits
(429 with its rate-limit headers); its worst case in tokens, reserved against the key's token limits before any
work (429 when it cannot fit) and settled when it ends; its usage, each choice's as it ends however it ends
(finished, stopped, timed out, failed, its client gone); the request's priority; the cache key its prompts are
reused under; a generation slot (its key's cap and the server's, or a place in the waiting line); and its trace
span. The web layer only says who asks (:class:`Caller`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import overload

from phi_api.engine import Finished
from phi_api.errors import ClientClosedRequestError, KeyRateLimitError, KeyRequestTooLargeError, PermissionDeniedError
from phi_api.limits.keys import Key, Keys
from phi_api.limits.line import KeyCaps, WaitingLine
from phi_api.limits.slots import Limiter, Slot, Unlimited
from phi_api.models.registry import Models
from phi_api.service import encoding, generation
from phi_api.service.requests import CompletionRequest, EncodeRequest, GenerationRequest
from phi_api.settings import Settings
from phi_api.telemetry.metrics import Metrics
from phi_api.telemetry.tracing import RequestSpan, Tracing

BATCH_PRIORITY = 2**62  # below every live request's (theirs are 32-bit integers)
SPAN_OPERATIONS = {"embed": "embeddings", "rerank": "rerank"}  # OpenTelemetry's gen_ai operation names
RESERVATION_MARGIN_SECONDS = 60.0  # a reservation outlives its request's longest run by this much


@dataclass(frozen=True)
class Caller:
    """Who asks: the key (None when keys are off), the request's id, the ``X-Priority`` header's value, the headers
    a trace continues from, and whether it is a Batch API line (of the key that created the batch)."""

    key: Key | None = None
    request_id: str = "-"
    header_priority: int | None = None
    trace_headers: Mapping[str, str] = field(default_factory=dict)
    batch: bool = False
    rate_headers: dict[str, str] = field(default_factory=dict)  # set here: the key's, for the answer whatever it is
    gone: Callable[[], bool] = lambda: False  # whether the client has left (a waiter in line gives up its place)

    def retry_after(self) -> float:
        """Seconds the gate's refusal said to wait (its ``Retry-After`` header; 0 when it said none)."""
        retry = self.rate_headers.get("Retry-After", "")
        return float(retry) if retry.isdigit() else 0.0


@dataclass(frozen=True)
class Gate:
    """What the gate works with, handed to it by the web layer."""

    models: Models
    limiter: Limiter  # the server's MAX_CONCURRENT_REQUESTS
    settings: Settings
    keys: Keys
    caps: KeyCaps
    line: WaitingLine
    metrics: Metrics
    tracing: Tracing


@overload
def admit(gate: Gate, caller: Caller, request: EncodeRequest) -> encoding.EncodeRun: ...
@overload
def admit(gate: Gate, caller: Caller, request: GenerationRequest) -> generation.Run: ...


def admit(gate: Gate, caller: Caller,
          request: GenerationRequest | EncodeRequest) -> generation.Run | encoding.EncodeRun:
    """Let ``caller``'s ``request`` onto the generation path (or, for embeddings and scores, the encoding path), or
    refuse it (403, 429, and every error of the path's ``prepare`` and ``launch``)."""
    request = dataclasses.replace(request, priority=priority_of(caller, request))
    span = _span(gate.tracing, caller, request)
    services = generation.Services(gate.models, Unlimited() if caller.batch else _Slots(gate, caller), gate.settings)
    held = ""
    try:
        generation.check_open(gate.models.draining)  # before counting: a retry is not a second request
        if caller.key is not None:
            count_request(gate.keys, caller)
        prepared = (encoding.prepare(services, request) if isinstance(request, EncodeRequest)
                    else generation.prepare(services, request))
        if caller.key is not None:
            held = _reserve(gate, caller, prepared.worst_tokens)
        observers, on_done = _accounting(gate, caller, span, held)
        run: generation.Run | encoding.EncodeRun
        if isinstance(prepared, encoding.EncodePrepared):
            run = encoding.launch(services, prepared, caller.request_id, observers=observers, on_done=on_done)
        else:
            run = generation.launch(services, prepared, caller.request_id, cache_key(gate.settings, caller, request),
                                    observers=observers, on_done=on_done)
    except BaseException as error:
        if held:
            gate.keys.usage.settle(held)
        if span is not None:
            span.fail(error)
        raise
    if span is not None:
        run.on_close.append(span.close)
    return run


def _accounting(gate: Gate, caller: Caller, span: RequestSpan | None,
                held: str) -> tuple[tuple[Callable[[Finished], None], ...], tuple[Callable[[], None], ...]]:
    """What a run tells as its choices end: the key's usage and the trace span; once every choice has ended, the
    key's reservation is released. Bound now: a streamed answer's choices end after the request's context has
    gone, and a client that left is not there to read them."""
    observers: list[Callable[[Finished], None]] = []
    on_done: list[Callable[[], None]] = []
    if caller.key is not None:
        observers.append(functools.partial(_count_usage, gate.keys, gate.metrics, caller.key))
        if held:
            on_done.append(functools.partial(gate.keys.usage.settle, held))
    if span is not None:
        observers.append(span.observe)
    return tuple(observers), tuple(on_done)


def _reserve(gate: Gate, caller: Caller, tokens: int) -> str:
    """Hold the request's worst case (``tokens``) against its key's token limits while it runs, or refuse it (429)
    when that cannot fit; the reservation's id ("" when the key has no token limit)."""
    key = caller.key
    assert key is not None
    settings = gate.settings
    lasts = settings.QUEUE_TIMEOUT + settings.GENERATION_TIMEOUT + RESERVATION_MARGIN_SECONDS
    decision = gate.keys.usage.reserve(key, tokens, lasts)
    caller.rate_headers.update(decision.headers)
    if not decision.allowed:
        if decision.reason == "too_large":
            raise KeyRequestTooLargeError(f"Request too large for key '{key.name}': it may use up to {tokens} tokens "
                                    f"(its prompts and max_tokens for each choice), more than the key's token limit "
                                    "allows. Lower max_tokens, n or the prompt.")
        limit = decision.reason.replace("_", " ")
        raise KeyRateLimitError(f"Rate limit reached for key '{key.name}': {limit} ({getattr(key, decision.reason)}); "
                                f"this request may use up to {tokens} tokens. Retry after "
                                f"{decision.headers['Retry-After']} seconds.")
    return decision.held


def priority_of(caller: Caller, request: GenerationRequest | EncodeRequest) -> int:
    """The field, else the header, else 0 (lower is sooner); a batch line's comes after every live request's. Only
    the operator's chosen keys may ask for sooner than the default (``raise_priority`` in the keys file)."""
    if caller.batch:
        return BATCH_PRIORITY
    priority = request.priority if request.priority is not None else caller.header_priority or 0
    key = caller.key
    if priority < 0 and key is not None and not (key.admin or key.raise_priority):
        raise PermissionDeniedError(f"The key '{key.name}' may not raise a request's priority (a priority below 0).",
                                    param="priority")
    return priority


def cache_key(settings: Settings, caller: Caller, request: GenerationRequest | EncodeRequest) -> str:
    """Whose prompts this request may reuse, and leave for reuse: its key's (unless the operator shares them,
    ``PREFIX_CACHE_SHARED``), narrowed by the request's ``cache_salt``."""
    owner = "" if settings.PREFIX_CACHE_SHARED or caller.key is None else caller.key.name
    salt = getattr(request, "cache_salt", None)  # an encoder keeps nothing between requests: it has none
    if not owner and not salt:
        return ""
    return hashlib.sha256(f"{owner}\0{salt or ''}".encode()).hexdigest()[:32]


def count_request(keys: Keys, caller: Caller) -> None:
    """Count a request of the caller's key, or refuse it (429) when the key has used up a limit; the rate-limit
    headers go on the answer either way."""
    assert caller.key is not None
    key = caller.key
    decision = keys.usage.admit(key)
    caller.rate_headers.update(decision.headers)
    if not decision.allowed:
        limit = decision.reason.replace("_", " ")
        raise KeyRateLimitError(f"Rate limit reached for key '{key.name}': {limit} ({getattr(key, decision.reason)}). "
                                f"Retry after {decision.headers['Retry-After']} seconds.")


def _count_usage(keys: Keys, metrics: Metrics, key: Key, finished: Finished) -> None:
    """A choice of ``key``'s request ended: its tokens count (each prompt once, with its first choice), and so do the
    tokens of its prediction that the engine checked and refused (OpenAI bills them as completion tokens)."""
    prompt = finished.prompt_tokens if finished.first_of_prompt else 0
    cached = finished.cached_tokens if finished.first_of_prompt else 0
    completion = finished.completion_tokens + finished.predicted_rejected
    keys.usage.record(key, prompt, cached, completion)
    metrics.observe_key(key.name, prompt, cached, completion, requests=int(finished.index == 0))


class _Slots:
    """The caller's way to a slot: its key's cap and the server's, through the worker's waiting line."""

    def __init__(self, gate: Gate, caller: Caller) -> None:
        self._gate, self._caller = gate, caller

    def try_acquire(self) -> Slot | None:
        key = self._caller.key
        own = self._gate.caps.limiter(key.name, key.max_concurrent_requests) if key is not None else None
        slot = self._gate.line.acquire(key.name if key is not None else "", self._gate.limiter, own,
                                       self._caller.gone)
        if slot is None and self._caller.gone():  # it left while it waited: a 499 in the log and metrics, not a 429
            raise ClientClosedRequestError("The client closed the connection while the request waited in line.")
        return slot


def _span(tracing: Tracing, caller: Caller, request: GenerationRequest | EncodeRequest) -> RequestSpan | None:
    """The request's trace span (None when tracing is off, at no cost)."""
    if tracing.provider is None:
        return None
    if isinstance(request, EncodeRequest):
        return tracing.start_request(SPAN_OPERATIONS[request.task], request.model, caller.trace_headers, choices=1,
                                     attributes={"phi_api.priority": request.priority,
                                                 "phi_api.request_id": caller.request_id,
                                                 "phi_api.inputs": request.count})
    sampling = request.sampling
    operation = "text_completion" if isinstance(request, CompletionRequest) else "chat"
    return tracing.start_request(operation, request.model, caller.trace_headers, choices=sampling.n, attributes={
        "gen_ai.request.max_tokens": sampling.max_tokens, "gen_ai.request.temperature": sampling.temperature,
        "gen_ai.request.top_p": sampling.top_p, "phi_api.priority": request.priority,
        "phi_api.request_id": caller.request_id})
