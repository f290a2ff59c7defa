"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from phi_api.errors import ResponseNotFoundError
from phi_api.protocols.responses import ResponseRenderer, ResponsesRequest, history_of, output_messages
from phi_api.service import generation
from phi_api.web.auth import current_tenant
from phi_api.web.http import answer_json, named_sse_response, read_request, start_generation
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.resources import get_store
from phi_api.web.transport import disconnect_probe

bp = Blueprint("responses", __name__)


@bp.post("/v1/responses")
@operation("Create a model response (OpenAI's Responses API; SSE events when stream is true)", request="responses",
           media=(JSON, SSE), statuses=GENERATION_STATUSES)
def create_response() -> Response:
    """A response to ``input`` (after its predecessor's conversation, with ``previous_response_id``); stored for
    follow-ups unless ``store`` is false."""
    request = ResponsesRequest.from_openai(read_request("responses"))
    store, tenant = get_store(), current_tenant()
    history = history_of(request, store, tenant.scope)
    run = start_generation(request.chat(history))
    renderer = ResponseRenderer(request, run)

    def keep(response: dict[str, Any]) -> None:
        if request.store and store.max_items:
            store.put(response, list(history or []) + list(request.input) + output_messages(response), tenant.name)

    if request.stream:
        return named_sse_response(renderer.stream(on_done=keep), on_close=(run.close,))
    results = generation.collect(run, disconnect_probe())
    return answer_json(run, lambda: renderer.whole(results[0]), then=keep)


@bp.get("/v1/responses/<response_id>")
@operation("A stored response (404 for any other id)")
def retrieve_response(response_id: str) -> Response:
    """A stored response object."""
    response = get_store().response(response_id, current_tenant().scope)
    if response is None:
        raise ResponseNotFoundError(f"Response with id '{response_id}' not found.")
    return jsonify(response)


@bp.delete("/v1/responses/<response_id>")
@operation("Delete a stored response (404 for any other id)")
def delete_response(response_id: str) -> Response:
    """Forget a stored response (a follow-up naming it then gets previous_response_not_found)."""
    if not get_store().delete(response_id, current_tenant().scope):
        raise ResponseNotFoundError(f"Response with id '{response_id}' not found.")
    return jsonify({"id": response_id, "object": "response", "deleted": True})
