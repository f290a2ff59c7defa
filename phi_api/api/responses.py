"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.errors import ResponseNotFoundError
from phi_api.web import endpoints
from phi_api.web.auth import current_tenant
from phi_api.web.bodies import read_json_object
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.resources import get_store
from phi_api.web.respond import needs, respond

bp = Blueprint("responses", __name__)


@bp.post("/v1/responses")
@operation("Create a model response (OpenAI's Responses API; SSE events when stream is true)", request="responses",
           media=(JSON, SSE), statuses=GENERATION_STATUSES)
def create_response() -> Response:
    """A response to ``input`` (after its predecessor's conversation, with ``previous_response_id``); stored for
    follow-ups unless ``store`` is false."""
    return respond(endpoints.response(read_json_object(), needs()))


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
