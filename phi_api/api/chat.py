"""POST /v1/chat/completions."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.web import endpoints
from phi_api.web.bodies import read_json_object
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.respond import needs, respond

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
@operation("Chat completion (SSE when stream is true)", request="chat_completion", media=(JSON, SSE),
           statuses=GENERATION_STATUSES)
def create_chat_completion() -> Response:
    """A chat completion: JSON, or server-sent events when ``stream`` is true."""
    return respond(endpoints.chat(read_json_object(), needs()))
