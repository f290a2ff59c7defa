"""POST /infill: llama.cpp server's fill-in-the-middle, for the editor plugins that call it."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.protocols.contract import Reading
from phi_api.protocols.llamacpp import InfillReply, infill_request
from phi_api.web.bodies import read_request
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.resources import get_models
from phi_api.web.respond import respond

bp = Blueprint("infill", __name__)


@bp.post("/infill")
@operation("Fill the hole between input_prefix and input_suffix (llama.cpp's; SSE when stream is true)",
           request="infill", media=(JSON, SSE), statuses=GENERATION_STATUSES)
def infill() -> Response:
    """Code for the hole, with the model's fill-in-the-middle tokens (400 for a model without them)."""
    body = read_request("infill")
    return respond(Reading(infill_request(body, next(iter(get_models().ids()), "")), InfillReply))
