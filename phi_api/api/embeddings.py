"""POST /v1/embeddings (OpenAI's): vectors of texts by an embedding model."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.web import endpoints
from phi_api.web.bodies import read_json_object
from phi_api.web.openapi import GENERATION_STATUSES, JSON, operation
from phi_api.web.respond import needs, respond

bp = Blueprint("embeddings", __name__)


@bp.post("/v1/embeddings")
@operation("Embeddings of texts or token ids (an embedding model)", request="embeddings", media=(JSON,),
           statuses=GENERATION_STATUSES)
def create_embeddings() -> Response:
    """Each input's vector, in order."""
    return respond(endpoints.embeddings(read_json_object(), needs()))
