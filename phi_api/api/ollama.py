"""Ollama's API, natively: seed 004's ``/v1/tags`` and ``/v1/generate``, and Ollama's own ``/api/*``.

Errors on these routes take Ollama's shape, ``{"error": "message"}`` (this
blueprint renders them; see :func:`phi_api.web.errors.render_errors`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify

from phi_api.api.models import check_pull_allowed, pull_events
from phi_api.errors import ModelLoadingError, ollama_body
from phi_api.models.registry import Models
from phi_api.protocols import catalog, ollama, ollama_embed
from phi_api.protocols.contract import EncodeReading, Framing, Reading
from phi_api.service.generation import Run
from phi_api.version import __version__
from phi_api.web.auth import is_admin, require_admin
from phi_api.web.bodies import read_request
from phi_api.web.errors import render_errors
from phi_api.web.framing import framed
from phi_api.web.openapi import GENERATION_STATUSES, JSON, NDJSON, operation
from phi_api.web.resources import get_models
from phi_api.web.respond import count_request, respond

bp = Blueprint("ollama", __name__)
render_errors(bp, ollama_body)


@bp.get("/v1/tags")
@bp.get("/api/tags")
@operation("The model list, as OpenAI and Ollama list it", errors="ollama")
def list_tags() -> Response:
    """The models, as OpenAI (``data``) and Ollama (``models``) list them."""
    return jsonify(catalog.tags(get_models().all()))


@bp.get("/api/ps")
@operation("The models loaded now (Ollama's ps)", errors="ollama")
def running() -> Response:
    """The models loaded now: every served model, kept until it is unloaded."""
    return jsonify(catalog.running(get_models().all()))


@bp.delete("/api/delete")
@operation("Unload a model (Ollama's delete; nothing is deleted from disk)", request="ollama_delete",
           errors="ollama", statuses=(400, 401, 404, 405, 413, 415))
def delete() -> Response:
    """Ollama's delete, as this server can do it: the model is unloaded on every worker."""
    body = read_request("ollama_delete", any_media_type=True)
    require_admin("unload models")
    get_models().unload(ollama.model_id(body.get("model") or body["name"]))
    return jsonify({})


def _generation(schema: str, parse: Callable[[dict[str, Any]], Any], *, chat: bool) -> Response:
    started = time.monotonic()
    body = read_request(schema, any_media_type=True)
    if ollama.only_loads(body, chat):
        return _load_only(body, chat)
    request = parse(body)
    models, keep = get_models(), _keeping(body)

    def reply(run: Run) -> ollama.Reply:
        _note_use(models, body, request.model)
        if not keep:  # keep_alive 0: unloaded once answered (if nobody did meanwhile)
            run.on_close.append(functools.partial(_unload, models, request.model))
        return ollama.Reply(run, started, chat=chat)

    return respond(Reading(request, reply))


def _load_only(body: dict[str, Any], chat: bool) -> Response:
    """A request for the model alone: every served model is loaded already, so it is only checked (404 if not
    served), kept as ``keep_alive`` asks, or unloaded (keep_alive 0, admins only)."""
    count_request()
    models, model = get_models(), ollama.model_id(body["model"])
    models.engine(model)
    keep = _keeping(body)
    _settle(models, body, model, keep)
    return jsonify(ollama.load_answer(model, chat, unloaded=not keep))


def _keeping(body: dict[str, Any]) -> bool:
    """Whether the request keeps its model loaded: keep_alive 0 unloads it for everyone (admins only)."""
    keep = ollama.keeps_alive(body)
    if not keep:
        require_admin("unload models (keep_alive 0)")
    return keep


def _settle(models: Models, body: dict[str, Any], model_id: str, keep: bool) -> None:
    """After a request that only loads or embeds: the model kept as ``keep_alive`` asks, or unloaded (``0``)."""
    if keep:
        _note_use(models, body, model_id)
    else:
        _unload(models, model_id)


def _note_use(models: Models, body: dict[str, Any], model_id: str) -> None:
    """An ordinary key's keep_alive may keep the model longer, within KEEP_ALIVE_MAX_SECONDS."""
    asked = ollama.keep_alive_seconds(body)
    if ollama.keeps_alive(body) and asked:
        models.keep_alive.note_use(model_id, asked, by_admin=is_admin())


def _embedding(schema: str, legacy: bool) -> Response:
    """Ollama's embed routes: the texts through the one gate (none: the model checked, no embeddings), then the
    model kept or unloaded as keep_alive says (a refused request leaves it as it was)."""
    started = time.monotonic()
    body = read_request(schema, any_media_type=True)
    request = ollama_embed.embed_request(body, legacy)
    models, keep = get_models(), _keeping(body)
    if request.count:
        answer = respond(EncodeReading(request, lambda run, vectors: ollama_embed.embeddings_answer(vectors) if legacy
                                       else ollama_embed.embed_answer(request.model, vectors,
                                                                      sum(len(one) for one in run.inputs), started)))
    else:
        models.encoder(request.model, "embed")  # (a 404 if it is not served)
        answer = jsonify({"embedding": []} if legacy else {"model": request.model, "embeddings": []})
    _settle(models, body, request.model, keep)
    return answer


@bp.post("/api/embed")
@operation("Ollama embed: vectors of texts", request="ollama_embed", errors="ollama", statuses=GENERATION_STATUSES)
def embed() -> Response:
    """Ollama's embed: each text's unit vector."""
    return _embedding("ollama_embed", legacy=False)


@bp.post("/api/embeddings")
@operation("Ollama's older embeddings route: one prompt's vector", request="ollama_embeddings", errors="ollama",
           statuses=GENERATION_STATUSES)
def embeddings() -> Response:
    """Ollama's older embeddings route."""
    return _embedding("ollama_embeddings", legacy=True)


def _unload(models: Models, model_id: str) -> None:
    models.unload(model_id, missing_ok=True)


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
    body = read_request("ollama_show", any_media_type=True)
    return jsonify(catalog.ollama_show(get_models().served(ollama.model_id(body.get("model") or body["name"]))))


@bp.post("/api/pull")
@operation("Download a model by name, then serve it (Ollama's pull; NDJSON progress unless stream is false)",
           request="ollama_pull", media=(JSON, NDJSON), errors="ollama", statuses=(400, 401, 403, 405, 413, 415, 500))
def pull() -> Response:
    """Ollama's pull: the model (an alias, or a Hub repository) is downloaded, checked and served under its name;
    progress as Ollama streams it, then ``success`` (403 unless API keys or ``ALLOW_PULL`` allow pulls)."""
    body = read_request("ollama_pull", any_media_type=True)
    name = ollama.model_id(body.get("model") or body["name"])
    check_pull_allowed(name)
    events = pull_events(name, models=get_models())
    if body.get("stream", True) is not False:
        return framed(Framing.NDJSON, events)
    last = list(events)[-1]
    if "error" in last:
        raise ModelLoadingError(name, last["error"], name)
    return jsonify(last)


@bp.get("/api/version")
@operation("The server's version", errors="ollama")
def version() -> Response:
    """The server's version."""
    return jsonify({"version": __version__})
