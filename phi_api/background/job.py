"""One background response run by a worker: its body read as the route reads one (:mod:`phi_api.web.endpoints`),
through the one gate as a request of its key at its priority (inside the key's limits and
``MAX_CONCURRENT_REQUESTS``), rendered by the Responses API's renderer, and its end recorded in the store.

Once the gate has taken it, it is shown ``in_progress`` (until then its client sees it queued). A streamed one's
events are added to the store as they come, a few at a time, for its followers. While it runs, its claim is renewed;
when the store says it must stop (it was cancelled or deleted, or its claim was lost) the run is closed at once,
freeing its slot. A response the gate cannot take now (the server full, its key's limits used up, the worker
shutting down) goes back to the queue; any other refusal fails it, with the error a live request would get.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gevent
import gevent.event

from phi_api.errors import (
    APIError,
    KeyRequestTooLargeError,
    RateLimitError,
    ServiceUnavailableError,
)
from phi_api.protocols.contract import streamed
from phi_api.protocols.response_objects import Identity, failed
from phi_api.service import admission, generation
from phi_api.service.admission import Caller
from phi_api.service.generation import KEEPALIVE
from phi_api.storage.background import BackgroundStore, Job
from phi_api.telemetry.logs import bind_request_id, reset_request_id
from phi_api.web import endpoints
from phi_api.web.errors import logged
from phi_api.web.foreign import from_foreign
from phi_api.web.resources import Resources
from phi_api.web.respond import built, gate, needs_of, owner_caller

log = logging.getLogger(__name__)
access = logging.getLogger("phi_api.access")

FLUSH_SECONDS = 0.1  # how long a streamed response's events wait before they are added to the store
WATCH_SECONDS = 0.5  # how often a running response's claim is renewed (and a cancel noticed)
RETRY_SECONDS = 1.0  # how soon a response the gate could not take is tried again (at the least)


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``ended`` (recorded), ``stopped`` (cancelled, deleted, or its claim lost), or ``requeued``
    (back in the queue until the gate may take it)."""

    kind: str


def run_job(resources: Resources, job: Job) -> Outcome:
    """Run ``job`` to its end, or until it must stop."""
    request_id, started = uuid.uuid4().hex, time.perf_counter()
    token = bind_request_id(request_id)
    stop = gevent.event.Event()
    watcher = gevent.spawn(_watch, resources.background, job, stop)
    try:
        outcome = _run(resources, job, request_id, stop)
    finally:
        watcher.kill()
        reset_request_id(token)
    resources.metrics.ops.background_runs.labels(outcome.kind).inc()
    elapsed = (time.perf_counter() - started) * 1000
    access.info("POST /v1/responses %s %.1fms (background %s)", outcome.kind, elapsed, job.id,
                extra={"fields": {"method": "POST", "path": "/v1/responses", "key": job.owner or None,
                                  "duration_ms": round(elapsed, 1), "background": job.id, "outcome": outcome.kind}})
    return outcome


def _run(resources: Resources, job: Job, request_id: str, stop: gevent.event.Event) -> Outcome:
    store = resources.background
    caller = Caller(request_id=request_id, header_priority=job.priority)
    try:
        caller = owner_caller(resources, job.owner, request_id, "background response", header_priority=job.priority)
        identity = Identity(job.id, int(job.created), background=True)
        reading = endpoints.response(job.body, needs_of(resources, job.owner, caller.key), identity)
        run = admission.admit(gate(resources), caller, reading.request)
    except Exception as exc:  # the gate's refusal: for now (back in the queue), or for good (it fails)
        error = from_foreign(exc)
        wait = _wait(error, caller)
        if wait is not None:
            store.release(job, time.time() + wait)
            return Outcome("requeued")
        return _failed(store, job, error)
    try:
        renderer = reading.renderer(run)  # (within: the run is closed below whatever happens)
        if not store.start(job):
            return Outcome("stopped")
        if job.stream:
            return _streamed(store, job, streamed(renderer, logged), stop)
        results = generation.collect(run, stop.is_set)
        response = built(run, lambda: renderer.whole(results))
    except Exception as exc:  # the run's failure (its timeout, the engine's error), or its stop
        return Outcome("stopped") if stop.is_set() else _failed(store, job, from_foreign(exc))
    finally:
        run.close()
    return Outcome("ended" if store.finish(job, response) else "stopped")


def _streamed(store: BackgroundStore, job: Job, events: Iterator[Any], stop: gevent.event.Event) -> Outcome:
    """Add a streamed response's events to the store as they come; record its end with its last event."""
    pending: list[dict[str, Any]] = []
    flushed = time.monotonic()
    for event in events:
        if stop.is_set():
            return Outcome("stopped")
        if event is not KEEPALIVE:
            pending.append(event[1])
            if event[1]["type"] in ("response.completed", "response.incomplete", "response.failed"):
                ended = store.finish(job, event[1]["response"], pending)
                return Outcome("ended" if ended else "stopped")
        if pending and time.monotonic() - flushed >= FLUSH_SECONDS:
            if not store.add_events(job, pending):
                return Outcome("stopped")
            pending, flushed = [], time.monotonic()
    return Outcome("stopped")  # its run was closed without an end: stopped from outside


def _watch(store: BackgroundStore, job: Job, stop: gevent.event.Event) -> None:
    """Renew ``job``'s claim while it runs; set ``stop`` once the store says it must stop."""
    while not stop.is_set():
        gevent.sleep(WATCH_SECONDS)
        try:
            if not store.renew(job):
                stop.set()
        except Exception:  # the database, for now: the next renewal may reach it before the lease ends
            log.warning("background response %s: its claim could not be renewed", job.id)


def _wait(error: APIError, caller: Caller) -> float | None:
    """Seconds until a refused response may be tried again, or None when it never may (it fails)."""
    if isinstance(error, KeyRequestTooLargeError):
        return None
    if isinstance(error, RateLimitError):  # the server full (its waiting line timed out), or the key's limits
        return max(RETRY_SECONDS, caller.retry_after())
    if isinstance(error, ServiceUnavailableError):  # shutting down, its model not ready: another worker may take it
        return RETRY_SECONDS
    return None


def _failed(store: BackgroundStore, job: Job, error: APIError) -> Outcome:
    if error.status >= 500 and not isinstance(error, ServiceUnavailableError):
        log.error("background response %s failed: %s", job.id, type(error).__name__)
    store.fail(job, failed(error.message, error.status))
    return Outcome("ended")
