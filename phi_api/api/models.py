"""GET /v1/models: the one model this server serves."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from phi_api.extensions import get_engine, get_settings

bp = Blueprint("models", __name__)


def model_object(model_id: str, created: int) -> dict[str, Any]:
    """OpenAI's model object."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": "system"}


@bp.get("/v1/models")
def list_models() -> Response:
    """The model list: always exactly the served model."""
    return jsonify({"object": "list", "data": [model_object(get_settings().MODEL_ID, get_engine().loaded_at)]})
