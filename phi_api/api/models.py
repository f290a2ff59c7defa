"""GET /v1/models: the one model this server serves."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.extensions import get_engine, get_settings
from phi_api.service import catalog

bp = Blueprint("models", __name__)


@bp.get("/v1/models")
def list_models() -> Response:
    """The model list: always exactly the served model."""
    return jsonify({"object": "list", "data": [catalog.openai_model(get_settings(), get_engine())]})
