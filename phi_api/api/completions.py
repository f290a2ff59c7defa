"""POST /v1/completions (OpenAI's legacy text completions)."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.extensions import get_validator
from phi_api.service import completions
from phi_api.service.body import read_json_object
from phi_api.service.formats import COMPLETION

bp = Blueprint("completions", __name__)


@bp.post("/v1/completions")
def create_completion() -> Response:
    """A text completion of the prompt as given (no chat template)."""
    body = read_json_object()
    get_validator().validate(COMPLETION.schema, body)
    return completions.serve(COMPLETION, body)
