"""The models: GET /v1/models and /v1/models/{model}; POST /v1/models/load and /v1/models/unload.

Loading and unloading are administrative: when ``API_KEYS`` is set they need
a key, like every route but the health check. A load names a folder on the
server's disk, or a model by name, which is pulled first (:mod:`phi_api.models.pull`:
only with API keys or ``ALLOW_PULL``). Every worker then serves (or refuses)
the model: see :mod:`phi_api.models.registry`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, jsonify, request

from phi_api.errors import APIError, InvalidParameterError, ModelLoadingError, PermissionDeniedError, PullError
from phi_api.models.pull import in_subprocess, parse
from phi_api.models.registry import Models
from phi_api.models.specs import ModelSpec
from phi_api.protocols import catalog
from phi_api.web.auth import require_admin
from phi_api.web.bodies import read_request
from phi_api.web.openapi import operation
from phi_api.web.resources import get_models, get_settings

bp = Blueprint("models", __name__)
ADMIN_STATUSES = (400, 401, 403, 404, 405, 413, 415, 500)
ANTHROPIC_VERSION = "anthropic-version"  # the header every Anthropic client sends


@bp.get("/v1/models")
@operation("List the served models")
def list_models() -> Response:
    """Every model this server serves, in Anthropic's shape for Anthropic's clients (they send
    ``anthropic-version``, as its SDK's ``models.list`` does), else in OpenAI's."""
    if ANTHROPIC_VERSION in request.headers:
        return jsonify(catalog.anthropic_list(get_models().all()))
    return jsonify(catalog.openai_list(get_models().all()))


@bp.get("/v1/models/<path:model>")
@operation("A served model's object (404 model_not_found for any other id)")
def retrieve_model(model: str) -> Response:
    """One model object (the SDK's ``models.retrieve``, OpenAI's or Anthropic's); 404 ``model_not_found`` for any
    other id."""
    served = get_models().served(model)
    if ANTHROPIC_VERSION in request.headers:
        return jsonify(catalog.anthropic_model(served))
    return jsonify(catalog.openai_model(served))


def load_checked(model: Any, path: Any, options: Any, param: str = "options",
                 draft: str | None = None) -> dict[str, Any]:
    """Load a model on every worker of the server (``draft``: the id of a served model to draft for it); its model
    object (admin keys only)."""
    require_admin("load models")
    spec = ModelSpec.checked(model, path, options, param=param)
    if draft is not None:
        found = get_models().get(draft)
        if found is None:
            raise InvalidParameterError(f"No served model '{draft}' to draft for {spec.id}.", param="draft")
        spec = spec.with_draft_folder(found.spec.path)
    return catalog.openai_model(get_models().load(spec))


def check_pull_allowed(name: str, param: str = "model") -> None:
    """A pull makes the server download gigabytes, and it listens on every address by default: only with API keys
    (the request then carries one) or ``ALLOW_PULL`` (403 otherwise); and ``name`` must be one (400)."""
    require_admin("pull models")
    settings = get_settings()
    if not (settings.ALLOW_PULL or settings.api_keys or settings.API_KEYS_FILE):
        raise PermissionDeniedError("This server does not download models on request: set API_KEYS (and send a "
                                    "key) or ALLOW_PULL=true to allow it.")
    try:
        parse(name)
    except PullError as error:
        raise InvalidParameterError(str(error), param=param) from None


def pull_events(name: str, options: Any = None, models: Models | None = None) -> Iterator[dict[str, Any]]:
    """Pull ``name`` (in a process of its own) and then serve it under that name: the pull's events, then
    ``{"status": "success"}`` or ``{"error": ...}`` (``models``: the app's, for a stream outside its context)."""
    models = models if models is not None else get_models()
    for event in in_subprocess(name):
        if "error" in event:
            yield {"error": event["error"]}
            return
        if event.get("status") != "success":
            yield event
            continue
        if name not in {served.spec.id for served in models.all()}:
            try:
                models.load(ModelSpec.checked(name, event["path"], options))
            except APIError as error:
                yield {"error": error.message}
                return
        yield {"status": "success"}


@bp.post("/v1/models/load")
@operation("Load a model folder from the server's disk, on every worker", request="model_load",
           statuses=ADMIN_STATUSES)
def load_model() -> Response:
    """Serve another model: 400 for an id already served, past MAX_MODELS or for a folder that is not a
    model; 500 with the cause when it fails to load."""
    body = read_request("model_load")
    if body.get("path") is None:  # a model by name: pulled first
        check_pull_allowed(body["model"])
        last = [event for event in pull_events(body["model"], body.get("options"))][-1]
        if "error" in last:
            raise ModelLoadingError(body["model"], last["error"], body["model"])
        return jsonify({**catalog.openai_model(get_models().served(body["model"])), "status": "loaded"})
    return jsonify({**load_checked(body["model"], body["path"], body.get("options"), draft=body.get("draft")),
                    "status": "loaded"})


@bp.post("/v1/models/unload")
@operation("Stop serving a model, on every worker (its running generations finish)", request="model_unload",
           statuses=ADMIN_STATUSES)
def unload_model() -> Response:
    """Unload a model: 404 for one that is not served."""
    body = read_request("model_unload")
    require_admin("unload models")
    get_models().unload(body["model"])
    return jsonify({"id": body["model"], "object": "model", "status": "unloaded"})
