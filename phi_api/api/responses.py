"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, and a background response's
cancel (POST /v1/responses/{id}/cancel) and resumed stream (GET with ``stream`` and ``starting_after``)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from phi_api.background.queue import enqueue, follow
from phi_api.errors import InvalidParameterError, ResponseNotFoundError, UnsupportedParameterError
from phi_api.protocols.response_objects import cancelled
from phi_api.protocols.responses import ResponseRenderer
from phi_api.storage.background import ACTIVE, EventsGone
from phi_api.web import endpoints
from phi_api.web.auth import current_tenant
from phi_api.web.bodies import read_json_object
from phi_api.web.framing import framed
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.paging import int_arg
from phi_api.web.resources import get_background, get_resources, get_settings, get_store
from phi_api.web.respond import current_caller, needs, respond

bp = Blueprint("responses", __name__)
MOST_EVENTS = 2**31 - 1


@bp.post("/v1/responses")
@operation("Create a model response (OpenAI's Responses API; SSE events when stream is true; queued and answered at "
           "once when background is true)", request="responses", media=(JSON, SSE), statuses=GENERATION_STATUSES)
def create_response() -> Response:
    """A response to ``input`` (after its predecessor's conversation, with ``previous_response_id``); stored for
    follow-ups unless ``store`` is false."""
    body = read_json_object()
    if body.get("background") is True:
        return _background(body)
    return respond(endpoints.response(body, needs()))


def _background(body: dict[str, Any]) -> Response:
    """Queue a background response: its queued object, or (``stream``) its events as a worker runs it."""
    if not get_settings().BACKGROUND_CONCURRENCY:
        raise UnsupportedParameterError("background responses are off on this server (BACKGROUND_CONCURRENCY is 0).",
                                        param="background")
    reading = needs()
    response, _ = enqueue(get_resources(), body, reading, current_caller())
    if not body.get("stream"):
        return jsonify(response)
    return framed(ResponseRenderer.framing, follow(get_background(), response["id"], reading.scope, -1))


@bp.get("/v1/responses/<response_id>")
@operation("A stored response (404 for any other id); a streamed background response's events with stream=true, "
           "after starting_after", media=(JSON, SSE), query=(
               ("stream", "boolean", "true: a background response's events (one created with stream: true)"),
               ("starting_after", "integer", "with stream: the events after this sequence_number (-1: all)")))
def retrieve_response(response_id: str) -> Response:
    """A stored or background response object, or a streamed background response's events."""
    scope = current_tenant().scope
    background = get_background().get(response_id, scope)
    response = background.response if background is not None else get_store().response(response_id, scope)
    if response is None:
        raise _not_found(response_id)
    if request.args.get("stream", "false").lower() != "true":
        return jsonify(response)
    if background is None or not background.stream:
        raise InvalidParameterError("Only a background response created with stream: true can be streamed.",
                                    param="stream")
    after = _starting_after()
    try:
        get_background().events(response_id, after, scope)  # events no longer kept: a 400 before the stream
    except EventsGone as gone:
        raise InvalidParameterError(str(gone), param="starting_after") from None
    return framed(ResponseRenderer.framing, follow(get_background(), response_id, scope, after))


@bp.post("/v1/responses/<response_id>/cancel")
@operation("Cancel a background response (its run stops, its slot freed, within half a second)", statuses=(400, 404))
def cancel_response(response_id: str) -> Response:
    """The response, cancelled (a queued or running one), or as it is (one cancelled before)."""
    scope = current_tenant().scope
    found = get_background().cancel(response_id, cancelled, scope)
    if found is None:
        if get_store().response(response_id, scope) is not None:
            raise InvalidParameterError("Cannot cancel a synchronous response.", param="response_id")
        raise _not_found(response_id)
    if found.state not in (*ACTIVE, "cancelled"):
        raise InvalidParameterError(f"Cannot cancel a {found.state} response.", param="response_id")
    return jsonify(found.response)


@bp.delete("/v1/responses/<response_id>")
@operation("Delete a stored response (404 for any other id); a running background response stops")
def delete_response(response_id: str) -> Response:
    """Forget a stored response (a follow-up naming it then gets previous_response_not_found)."""
    scope = current_tenant().scope
    background = get_background().delete(response_id, scope)
    if not get_store().delete(response_id, scope) and not background:
        raise _not_found(response_id)
    return jsonify({"id": response_id, "object": "response", "deleted": True})


def _starting_after() -> int:
    return int_arg("starting_after", -1, -1, MOST_EVENTS, "an event's sequence_number, an integer")


def _not_found(response_id: str) -> ResponseNotFoundError:
    return ResponseNotFoundError(f"Response with id '{response_id}' not found.")
