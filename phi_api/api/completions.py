"""POST /v1/completions (OpenAI's legacy text completions)."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.web import endpoints
from phi_api.web.bodies import read_json_object
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.respond import needs, respond

bp = Blueprint("completions", __name__)


@bp.post("/v1/completions")
@operation("Text completion (SSE when stream is true)", request="completion", media=(JSON, SSE),
           statuses=GENERATION_STATUSES)
def create_completion() -> Response:
    """A text completion of the prompt as given (no chat template)."""
    return respond(endpoints.completion(read_json_object(), needs()))
