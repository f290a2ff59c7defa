"""POST /v1/chat/completions."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.extensions import get_validator
from phi_api.service import completions
from phi_api.service.body import read_json_object
from phi_api.service.formats import CHAT

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
def create_chat_completion() -> Response:
    """A chat completion: JSON, or server-sent events when ``stream`` is true."""
    body = read_json_object()
    get_validator().validate(CHAT.schema, body)
    return completions.serve(CHAT, body)
