"""POST /infill: llama.cpp server's fill-in-the-middle, for the editor plugins that call it."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.protocols.llamacpp import InfillReply, infill_request
from phi_api.service import generation
from phi_api.web.http import read_request, sse_response, start_generation
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.resources import get_models
from phi_api.web.transport import disconnect_probe

bp = Blueprint("infill", __name__)


@bp.post("/infill")
@operation("Fill the hole between input_prefix and input_suffix (llama.cpp's; SSE when stream is true)",
           request="infill", media=(JSON, SSE), statuses=GENERATION_STATUSES)
def infill() -> Response:
    """Code for the hole, with the model's fill-in-the-middle tokens (400 for a model without them)."""
    body = read_request("infill")
    run = start_generation(infill_request(body, next(iter(get_models().ids()), "")))
    reply = InfillReply(run)
    if run.request.stream:
        return sse_response(reply.events(), on_close=(run.close,), done=False)
    return jsonify(reply.whole(generation.collect(run, disconnect_probe())[0]))
