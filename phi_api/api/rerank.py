"""Reranking and scoring by a cross-encoder: Cohere's and Jina's ``POST /v1/rerank``, Cohere's ``/v2/rerank``,
llama.cpp's ``/rerank``, vLLM's ``/v1/score`` and ``/score``. Errors carry Cohere's ``message`` beside OpenAI's
``error`` (:func:`phi_api.errors.rerank_body`)."""

from __future__ import annotations

from flask import Blueprint, Response

from phi_api.errors import rerank_body
from phi_api.web import endpoints
from phi_api.web.bodies import read_json_object
from phi_api.web.errors import render_errors
from phi_api.web.openapi import GENERATION_STATUSES, JSON, operation
from phi_api.web.respond import needs, respond

bp = Blueprint("rerank", __name__)
render_errors(bp, rerank_body)


@bp.post("/v1/rerank")
@bp.post("/rerank")
@operation("Rerank documents against a query (Cohere's, Jina's, llama.cpp's, vLLM's shape)", request="rerank",
           media=(JSON,), errors="rerank", statuses=GENERATION_STATUSES)
def rerank() -> Response:
    """The documents, most relevant first, each with its score and index (and text, unless not asked)."""
    return respond(endpoints.rerank(read_json_object(), needs()))


@bp.post("/v2/rerank")
@operation("Rerank documents against a query (Cohere's v2 shape)", request="rerank", media=(JSON,),
           errors="rerank", statuses=GENERATION_STATUSES)
def rerank_v2() -> Response:
    """As /v1/rerank; documents are echoed only when return_documents is true."""
    return respond(endpoints.rerank(read_json_object(), needs(), v2=True))


@bp.post("/v1/score")
@bp.post("/score")
@operation("Scores of text pairs (vLLM's): one text against many, or pairwise", request="score", media=(JSON,),
           errors="rerank", statuses=GENERATION_STATUSES)
def score() -> Response:
    """Each pair's score, in input order."""
    return respond(endpoints.score(read_json_object(), needs()))
