"""POST /v1/completions (OpenAI's legacy text completions)."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.protocols.openai import CompletionShape
from phi_api.service.requests import CompletionRequest
from phi_api.web.answers import respond
from phi_api.web.http import read_json_object
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.resources import get_validator

bp = Blueprint("completions", __name__)


@bp.post("/v1/completions")
@operation("Text completion (SSE when stream is true)", request="completion", media=(JSON, SSE),
           statuses=GENERATION_STATUSES)
def create_completion() -> Response:
    """A text completion of the prompt as given (no chat template)."""
    body = read_json_object()
    validator = get_validator()
    validator.validate("completion", body)
    return respond(CompletionShape, CompletionRequest.from_openai(body, validator.known_fields("completion")))
