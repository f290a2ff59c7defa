"""GET /v1/models and GET /v1/models/{model}: the one model this server serves."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.errors import ModelNotFoundError
from phi_api.extensions import get_engine, get_settings
from phi_api.openapi import operation
from phi_api.service import catalog

bp = Blueprint("models", __name__)


@bp.get("/v1/models")
@operation("List the served model")
def list_models() -> Response:
    """The model list: always exactly the served model."""
    return jsonify({"object": "list", "data": [catalog.openai_model(get_settings(), get_engine())]})


@bp.get("/v1/models/<path:model>")
@operation("The served model's object (404 model_not_found for any other id)")
def retrieve_model(model: str) -> Response:
    """One model object (the SDK's ``models.retrieve``); 404 ``model_not_found`` for any other id."""
    settings = get_settings()
    if model != settings.MODEL_ID:
        raise ModelNotFoundError(f"The model '{model}' does not exist; this server serves '{settings.MODEL_ID}'.")
    return jsonify(catalog.openai_model(settings, get_engine()))
