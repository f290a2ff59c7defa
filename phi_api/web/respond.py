"""The one way a generation request is answered, whatever its protocol: :func:`respond` starts it through the one
gate as this HTTP request's caller, then streams it framed as its protocol frames streams, or collects it (noticing
a client that leaves) and answers its whole object. A protocol brings its typed request and its renderer
(:class:`phi_api.protocols.contract.Renderer`); errors take its shape through its blueprint's handlers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Response, g, jsonify, request

from phi_api import jsontext
from phi_api.engine.threads.native import off_hub
from phi_api.errors import AuthenticationError, InvalidParameterError
from phi_api.limits.keys import Key
from phi_api.protocols.contract import EncodeReading, Reading, streamed
from phi_api.service import admission, encoding, generation
from phi_api.service.admission import Caller, Gate
from phi_api.service.requests import GenerationRequest
from phi_api.telemetry.logs import current_request_id
from phi_api.web.auth import current_key, current_tenant
from phi_api.web.endpoints import Needs
from phi_api.web.errors import logged
from phi_api.web.framing import framed
from phi_api.web.resources import Resources, get_resources
from phi_api.web.transport import disconnect_probe

PRIORITY_HEADER = "X-Priority"
PRIORITY_RANGE = (-2**31, 2**31 - 1)


def respond(reading: Reading | EncodeReading) -> Response:
    """Run a body's typed request and answer with its renderer's view of the run: streamed, or whole."""
    if isinstance(reading, EncodeReading):
        return _respond_encoded(reading)
    run = start_generation(reading.request)
    try:
        answer = reading.renderer(run)
        if reading.request.stream:
            return framed(answer.framing, streamed(answer, logged), on_close=(run.close,))
    except BaseException:  # the run holds a concurrency slot: given back before the error is answered
        run.close()
        raise
    results = generation.collect(run, disconnect_probe())
    return answer_json(run, lambda: answer.whole(results))


def _respond_encoded(reading: EncodeReading) -> Response:
    """An embedding or scoring request through the one gate, answered whole; the answer (thousands of numbers) is
    made and encoded on a pooled thread, in slices, while the hub serves the worker's streams."""
    run = admission.admit(gate(), current_caller(), reading.request)
    text = encoded_whole(reading, run, disconnect_probe(), jsontext.dumps_in_slices) + "\n"
    return Response(text, mimetype="application/json")


def encoded_whole(reading: EncodeReading, run: encoding.EncodeRun, gone: Callable[[], bool] = lambda: False,
                  encode: Callable[[dict[str, Any]], Any] = lambda answer: answer) -> Any:
    """An encoding run's whole answer, collected (ended early once ``gone`` says its client left; a batch line has
    no client to notice leaving), made and ``encode``-d (the body's text; by default the answer as it is) in one
    hop to a pooled thread."""
    results = encoding.collect(run, gone)
    return off_hub(lambda: encode(reading.renderer(run, results)))


def needs() -> Needs:
    """What reading a body of this HTTP request needs (:mod:`phi_api.web.endpoints`)."""
    resources, tenant = get_resources(), current_tenant()
    return Needs(resources.validator, resources.responses, resources.conversations, tenant.name, tenant.scope)


def owner_caller(resources: Resources, owner: str, request_id: str, made: str, *, batch: bool = False,
                 header_priority: int | None = None) -> Caller:
    """A request made away from its HTTP request (a batch line, a background response) as a caller of the key that
    ``made`` it, by name (no key: keys are off); 401 when that key is no longer accepted."""
    if not resources.keys.keys:
        return Caller(request_id=request_id, batch=batch, header_priority=header_priority)
    key = resources.keys.named(owner)
    if key is None:
        raise AuthenticationError(f"The key that created this {made} is no longer accepted.")
    return Caller(key=key, request_id=request_id, batch=batch, header_priority=header_priority)


def needs_of(resources: Resources, owner: str, key: Key | None) -> Needs:
    """What reading a body needs away from its HTTP request (a batch line, a background response): as ``owner``,
    seeing what ``key`` sees (every owner's for an admin key, or when keys are off)."""
    return Needs(resources.validator, resources.responses, resources.conversations, owner,
                 None if key is None or key.admin else key.name)


def gate(resources: Resources | None = None) -> Gate:
    """The gate's dependencies: an app's resources (default: the current app's)."""
    held = resources if resources is not None else get_resources()
    assert held.models is not None, "the app's models are loaded before it answers"
    return Gate(held.models, held.limiter, held.settings, held.keys, held.caps, held.line, held.metrics, held.tracing)


def start_generation(typed: GenerationRequest) -> generation.Run:
    """Start a typed request through the one gate (:func:`phi_api.service.admission.admit`) as this HTTP request's
    caller."""
    return admission.admit(gate(), current_caller(), typed)


def current_caller() -> Caller:
    """This HTTP request as the gate's caller: its key, its id, its ``X-Priority`` header (for clients that cannot
    add a ``priority`` field; the field wins), its trace headers."""
    tracing = get_resources().tracing
    caller = Caller(key=current_key(), request_id=current_request_id(), header_priority=header_priority(),
                    trace_headers=dict(request.headers) if tracing.provider is not None else {},
                    gone=disconnect_probe())
    g.rate_headers = caller.rate_headers  # filled by the gate; sent with the answer, whatever it is
    return caller


def count_request() -> None:
    """Count this request (an upload: not a generation) against its key's requests per minute, or refuse it (429,
    with the key's rate-limit headers)."""
    key = current_key()
    if key is not None:
        caller = Caller(key=key, request_id=current_request_id())
        g.rate_headers = caller.rate_headers
        admission.count_request(get_resources().keys, caller)


def header_priority() -> int | None:
    """The ``X-Priority`` header's integer (lower is sooner), if given; 400 if it is not one."""
    raw = request.headers.get(PRIORITY_HEADER)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or not PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1]:
        raise InvalidParameterError(f"The {PRIORITY_HEADER} header must be an integer from {PRIORITY_RANGE[0]} to "
                                    f"{PRIORITY_RANGE[1]} (lower is sooner).", param=PRIORITY_HEADER)
    return value


def built(run: generation.Run, build: Callable[[], Any]) -> Any:
    """A run's whole answer (``build`` makes it). One with log-probabilities may be large: it is made on a pooled
    thread, while the hub serves the worker's other streams."""
    return build() if run.request.logprobs is None else run.scored(build)


def answer_json(run: generation.Run, build: Callable[[], Any]) -> Response:
    """A run's whole answer as JSON (``build`` makes it); one with log-probabilities made and encoded on a pooled
    thread (:func:`json_answer`)."""
    if run.request.logprobs is None:
        return jsonify(build())
    return json_answer(build, run.scored)


def json_answer(build: Callable[[], Any], maker: Callable[[Callable[[], str]], str] = off_hub) -> Response:
    """``build``'s answer as JSON, made and encoded by ``maker`` (a pooled thread by default) in slices
    (:func:`phi_api.jsontext.dumps_in_slices`): an answer of megabytes must not hold the hub."""
    return Response(maker(lambda: jsontext.dumps_in_slices(build()) + "\n"), mimetype="application/json")
