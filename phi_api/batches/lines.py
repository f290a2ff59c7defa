"""A Batch API line run as a request of the key that created its batch: its body read as its endpoint's route reads
one (:mod:`phi_api.web.endpoints`), through the one gate as a batch line (the lowest priority, outside
``MAX_CONCURRENT_REQUESTS``), collected, and answered with its renderer's whole object, or with the error a live
request would get, in OpenAI's shape. What the runner records is that object, as it is.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from phi_api.errors import (
    APIError,
    InvalidParameterError,
    KeyRateLimitError,
    KeyRequestTooLargeError,
    ServiceUnavailableError,
    openai_body,
)
from phi_api.protocols.contract import EncodeReading
from phi_api.service import admission, generation
from phi_api.service.admission import Caller
from phi_api.storage.batches import Line
from phi_api.telemetry.logs import bind_request_id, reset_request_id
from phi_api.web.endpoints import BATCHABLE
from phi_api.web.foreign import from_foreign
from phi_api.web.resources import Resources
from phi_api.web.respond import built, encoded_whole, gate, needs_of, owner_caller

log = logging.getLogger(__name__)
access = logging.getLogger("phi_api.access")


@dataclass(frozen=True)
class Answer:
    """A line's answer: its status and body, its request id; when its key's limits refused it for now, how many
    seconds until they may not (``wait``: then it goes back to the queue)."""

    status: int
    body: dict[str, Any]
    request_id: str
    wait: float | None = None
    unavailable: bool = False  # the server could not take it now (shutting down, its model not ready)


def answer_line(resources: Resources, line: Line) -> Answer:
    """Run ``line`` as a request of its batch's key; its answer, whatever happens."""
    request_id, started = uuid.uuid4().hex, time.perf_counter()
    token = bind_request_id(request_id)
    caller = Caller(key=None, request_id=request_id, batch=True)
    try:
        caller = _caller(resources, line, request_id)
        reading = BATCHABLE[line.url](line.body, needs_of(resources, line.owner, caller.key))
        if isinstance(reading, EncodeReading):
            answered = Answer(200, encoded_whole(reading, admission.admit(gate(resources), caller, reading.request)),
                              request_id)
        else:
            run = admission.admit(gate(resources), caller, reading.request)
            answer = reading.renderer(run)
            results = generation.collect(run)
            answered = Answer(200, built(run, lambda: answer.whole(results)), request_id)
    except Exception as exc:  # the error a live request would get, in OpenAI's shape
        answered = _refusal(from_foreign(exc), caller, request_id)
    try:
        _count(resources, line, answered, started)
    finally:
        reset_request_id(token)
    return answered


def _count(resources: Resources, line: Line, answered: Answer, started: float) -> None:
    """Counted and logged as a request to its endpoint is (by route and status), its batch and line named."""
    resources.metrics.requests.labels(line.url, "POST", str(answered.status)).inc()
    if answered.status == 429:
        resources.metrics.rate_limited.inc()
    if line.owner and answered.status >= 400:
        resources.metrics.ops.key_errors.labels(line.owner, str(answered.status)).inc()
    elapsed = (time.perf_counter() - started) * 1000
    access.info("POST %s %d %.1fms (batch %s line %d)", line.url, answered.status, elapsed, line.batch_id, line.line,
                extra={"fields": {"method": "POST", "path": line.url, "status": answered.status,
                                  "key": line.owner or None, "duration_ms": round(elapsed, 1),
                                  "batch": line.batch_id, "line": line.line}})


def _caller(resources: Resources, line: Line, request_id: str) -> Caller:
    """The line as a request of the key that created its batch (none: keys are off)."""
    if line.body.get("stream"):
        raise InvalidParameterError("A batch request cannot stream.", param="stream")
    return owner_caller(resources, line.owner, request_id, "batch", batch=True)


def _refusal(error: APIError, caller: Caller, request_id: str) -> Answer:
    if error.status >= 500 and not isinstance(error, ServiceUnavailableError):
        log.error("a batch line failed: %s", type(error).__name__)
    wait = None
    if isinstance(error, KeyRateLimitError) and not isinstance(error, KeyRequestTooLargeError):
        wait = caller.retry_after()
    return Answer(error.status, openai_body(error), request_id, wait=wait,
                  unavailable=isinstance(error, ServiceUnavailableError))
