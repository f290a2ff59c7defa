"""POST /v1/chat/completions."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.protocols.openai import ChatShape
from phi_api.service.requests import ChatRequest
from phi_api.web.answers import respond
from phi_api.web.http import read_json_object
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.resources import get_validator

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
@operation("Chat completion (SSE when stream is true)", request="chat_completion", media=(JSON, SSE),
           statuses=GENERATION_STATUSES)
def create_chat_completion() -> Response:
    """A chat completion: JSON, or server-sent events when ``stream`` is true."""
    body = read_json_object()
    validator = get_validator()
    validator.validate("chat_completion", body)
    return respond(ChatShape, ChatRequest.from_openai(body, validator.known_fields("chat_completion")))
