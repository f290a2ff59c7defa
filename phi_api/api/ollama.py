"""Ollama's API, natively: seed 004's ``/v1/tags`` and ``/v1/generate``, and Ollama's own ``/api/*``.

Errors on these routes take Ollama's shape, ``{"error": "message"}``.
"""

from __future__ import annotations

from typing import Callable

from flask import Blueprint, Response, jsonify

from phi_api import __version__
from phi_api.extensions import get_engine, get_settings, get_validator
from phi_api.service import catalog, ollama
from phi_api.service.body import read_json_object

bp = Blueprint("ollama", __name__)
bp.plain_errors = True  # read by the error handlers


@bp.get("/v1/tags")
@bp.get("/api/tags")
def list_tags() -> Response:
    """The model, as OpenAI (``data``) and Ollama (``models``) list it."""
    return jsonify(catalog.tags(get_settings(), get_engine()))


def _generation(schema: str, translate: Callable, chat: bool) -> Response:
    body = read_json_object(any_media_type=True)
    get_validator().validate(schema, body)
    kind, translated = translate(body)
    return ollama.serve(kind, translated, chat=chat)


@bp.post("/v1/generate")
@bp.post("/api/generate")
def generate() -> Response:
    """Ollama's generate: a prompt (templated unless ``raw``); NDJSON unless ``stream`` is false."""
    return _generation("ollama_generate", ollama.generate_request, chat=False)


@bp.post("/api/chat")
def chat() -> Response:
    """Ollama's chat."""
    return _generation("ollama_chat", ollama.chat_request, chat=True)


@bp.post("/api/show")
def show() -> Response:
    """Details of the model."""
    body = read_json_object(any_media_type=True)
    get_validator().validate("ollama_show", body)
    ollama.check_model(body.get("model") or body["name"])
    return jsonify(catalog.ollama_show(get_settings(), get_engine()))


@bp.get("/api/version")
def version() -> Response:
    """The server's version."""
    return jsonify({"version": __version__})
