"""Ollama's API, natively: seed 004's ``/v1/tags`` and ``/v1/generate``, and Ollama's own ``/api/*``.

Errors on these routes take Ollama's shape, ``{"error": "message"}`` (this
blueprint renders them; see :func:`phi_api.api.http.render_errors`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from flask import Blueprint, Response, jsonify

from phi_api.api.http import ndjson_response, read_json_object, render_errors, services
from phi_api.errors import ollama_body
from phi_api.extensions import get_engine, get_settings
from phi_api.logs import current_request_id
from phi_api.openapi import GENERATION_STATUSES, JSON, NDJSON, operation
from phi_api.schemas import get_validator
from phi_api.service import catalog, generation, ollama
from phi_api.transport import disconnect_probe
from phi_api.version import __version__

bp = Blueprint("ollama", __name__)
render_errors(bp, ollama_body)


@bp.get("/v1/tags")
@bp.get("/api/tags")
@operation("The model list, as OpenAI and Ollama list it", errors="ollama")
def list_tags() -> Response:
    """The model, as OpenAI (``data``) and Ollama (``models``) list it."""
    return jsonify(catalog.tags(get_settings(), get_engine()))


def _generation(schema: str, parse: Callable[[dict[str, Any], str], Any], *, chat: bool) -> Response:
    started = time.monotonic()
    body = read_json_object(any_media_type=True)
    get_validator().validate(schema, body)
    context = services()
    request = parse(body, context.settings.MODEL_ID)
    run = generation.start(context, request, current_request_id())
    reply = ollama.Reply(run, started, chat=chat)
    if request.stream:
        return ndjson_response(reply.lines(), on_close=(run.close,))
    return jsonify(reply.whole(generation.collect(run, disconnect_probe())[0]))


@bp.post("/v1/generate")
@bp.post("/api/generate")
@operation("Ollama generate (NDJSON unless stream is false)", request="ollama_generate", media=(JSON, NDJSON),
           errors="ollama", statuses=GENERATION_STATUSES)
def generate() -> Response:
    """Ollama's generate: a prompt (templated unless ``raw``); NDJSON unless ``stream`` is false."""
    return _generation("ollama_generate", ollama.generate_request, chat=False)


@bp.post("/api/chat")
@operation("Ollama chat (NDJSON unless stream is false)", request="ollama_chat", media=(JSON, NDJSON),
           errors="ollama", statuses=GENERATION_STATUSES)
def chat() -> Response:
    """Ollama's chat."""
    return _generation("ollama_chat", ollama.chat_request, chat=True)


@bp.post("/api/show")
@operation("Ollama's model details", request="ollama_show", errors="ollama")
def show() -> Response:
    """Details of the model."""
    body = read_json_object(any_media_type=True)
    get_validator().validate("ollama_show", body)
    settings = get_settings()
    ollama.served_model(body.get("model") or body["name"], settings.MODEL_ID)
    return jsonify(catalog.ollama_show(settings, get_engine()))


@bp.get("/api/version")
@operation("The server's version", errors="ollama")
def version() -> Response:
    """The server's version."""
    return jsonify({"version": __version__})
