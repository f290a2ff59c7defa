"""The models: GET /v1/models and /v1/models/{model}; POST /v1/models/load and /v1/models/unload.

Loading and unloading are administrative: when ``API_KEYS`` is set they need
a key, like every route but the health check. A load names a folder on the
server's disk; nothing is downloaded. Every worker then serves (or refuses)
the model: see :mod:`phi_api.registry`.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from phi_api.api.http import read_request
from phi_api.extensions import get_models
from phi_api.openapi import operation
from phi_api.registry import ModelSpec
from phi_api.service import catalog

bp = Blueprint("models", __name__)
ADMIN_STATUSES = (400, 401, 404, 405, 413, 415, 500)


@bp.get("/v1/models")
@operation("List the served models")
def list_models() -> Response:
    """Every model this server serves."""
    return jsonify(catalog.openai_list(get_models().all()))


@bp.get("/v1/models/<path:model>")
@operation("A served model's object (404 model_not_found for any other id)")
def retrieve_model(model: str) -> Response:
    """One model object (the SDK's ``models.retrieve``); 404 ``model_not_found`` for any other id."""
    return jsonify(catalog.openai_model(get_models().served(model)))


def load_checked(model: Any, path: Any, options: Any, param: str = "options") -> dict[str, Any]:
    """Load a model on every worker of the server; its model object."""
    served = get_models().load(ModelSpec.checked(model, path, options, param=param))
    return catalog.openai_model(served)


@bp.post("/v1/models/load")
@operation("Load a model folder from the server's disk, on every worker", request="model_load",
           statuses=ADMIN_STATUSES)
def load_model() -> Response:
    """Serve another model: 400 for an id already served, past MAX_MODELS or for a folder that is not a
    model; 500 with the cause when it fails to load."""
    body = read_request("model_load")
    return jsonify({**load_checked(body["model"], body["path"], body.get("options")), "status": "loaded"})


@bp.post("/v1/models/unload")
@operation("Stop serving a model, on every worker (its running generations finish)", request="model_unload",
           statuses=ADMIN_STATUSES)
def unload_model() -> Response:
    """Unload a model: 404 for one that is not served."""
    body = read_request("model_unload")
    get_models().unload(body["model"])
    return jsonify({"id": body["model"], "object": "model", "status": "unloaded"})
