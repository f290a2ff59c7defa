"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

The key arrives in ``x-api-key`` (one of the headers phi-api reads); ``anthropic-version`` is accepted. Errors on
these routes take Anthropic's shape (this blueprint renders them; see :func:`phi_api.web.errors.render_errors`).
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.errors import anthropic_body
from phi_api.protocols.anthropic import MessageRenderer, MessagesRequest
from phi_api.protocols.contract import Reading
from phi_api.service import prompts
from phi_api.web.bodies import read_request
from phi_api.web.errors import render_errors
from phi_api.web.openapi import GENERATION_STATUSES, JSON, SSE, operation
from phi_api.web.resources import get_models
from phi_api.web.respond import count_request, respond

bp = Blueprint("messages", __name__)
render_errors(bp, anthropic_body)


@bp.post("/v1/messages")
@operation("Create a message (Anthropic's Messages API; SSE events when stream is true)", request="messages",
           media=(JSON, SSE), errors="anthropic", statuses=GENERATION_STATUSES)
def create_message() -> Response:
    """The assistant's next message: text, or tool_use blocks."""
    request = MessagesRequest.from_anthropic(read_request("messages"))
    return respond(Reading(request.chat, lambda run: MessageRenderer(request, run)))


@bp.post("/v1/messages/count_tokens")
@operation("Count a message request's input tokens (Anthropic's count_tokens)", request="messages_count_tokens",
           errors="anthropic", statuses=(400, 401, 404, 405, 413, 415))
def count_tokens() -> Response:
    """The input tokens the same request would use: system, messages and tools through the chat template."""
    request = MessagesRequest.from_anthropic({**read_request("messages_count_tokens"), "max_tokens": 1})
    count_request()  # tokenizing is work the server does for the key, as /tokenize's is
    engine = get_models().engine(request.model)
    tokens = prompts.chat_prompt(engine, list(request.chat.messages), request.chat.tools, must_fit=False,
                                 continue_final=request.chat.continue_final)
    return jsonify({"input_tokens": len(tokens)})
