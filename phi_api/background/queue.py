"""A background response queued, and a streamed one followed: what ``POST /v1/responses`` with ``background: true``
and ``GET /v1/responses/{id}?stream=true`` do besides answering HTTP.

A body is read at once as a foreground one is (its schema, its fields, its conversation or predecessor, its model,
its priority: a 400 now, not a failed response later); then its queued object and, when it streams, its first
events (``response.created``, ``response.queued``) are kept in the store. A stream is followed from the store: the
events after a ``sequence_number``, as the worker that runs the response adds them, until it has ended.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import gevent

from phi_api.errors import KeyRateLimitError
from phi_api.protocols.response_objects import Identity, queued_response
from phi_api.protocols.responses_request import ResponsesRequest
from phi_api.service import admission
from phi_api.service.admission import Caller
from phi_api.service.generation import KEEPALIVE, KEEPALIVE_SECONDS
from phi_api.storage.background import TERMINAL, BackgroundFull, BackgroundStore
from phi_api.web import endpoints
from phi_api.web.endpoints import Needs
from phi_api.web.resources import Resources

FOLLOW_SECONDS = 0.1  # how often a follower looks for new events


def enqueue(resources: Resources, body: dict[str, Any], needs: Needs, caller: Caller) -> tuple[dict[str, Any],
                                                                                             list[dict[str, Any]]]:
    """Queue ``body`` as a background response of ``needs.owner``: its object as queued, and its first events."""
    identity = Identity(background=True)
    reading = endpoints.response(body, needs, identity)
    assert resources.models is not None, "the app's models are loaded before it answers"
    if resources.models.get(reading.request.model) is None:  # not served(): a queued response is no use of it yet
        raise resources.models.missing(reading.request.model)
    priority = admission.priority_of(caller, reading.request)
    response, events = queued_response(ResponsesRequest.from_openai(body), identity)
    try:
        resources.background.create(response, body, needs.owner, priority, events if body.get("stream") else [])
    except BackgroundFull as full:
        raise KeyRateLimitError(str(full)) from None
    return response, events


def follow(store: BackgroundStore, response_id: str, scope: str | None, after: int) -> Iterator[Any]:
    """A streamed background response's events after ``after``, as ``(type, event)`` pairs, as they come (with
    ``KEEPALIVE`` while none does), until it has ended or is gone."""
    quiet_since = time.monotonic()
    while True:
        current = store.get(response_id, scope)  # before the events: an end read here has its last events there
        events = store.events(response_id, after, scope)
        for event in events:
            yield event["type"], event
        if events:
            after, quiet_since = events[-1]["sequence_number"], time.monotonic()
        elif current is None or current.state in TERMINAL:
            return
        elif time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
            yield KEEPALIVE
            quiet_since = time.monotonic()
        gevent.sleep(FOLLOW_SECONDS)
