"""Reranking and scoring by a cross-encoder, in the shapes clients send: Cohere's and Jina's ``/v1/rerank``,
Cohere's ``/v2/rerank``, llama.cpp's and vLLM's ``/rerank``, vLLM's ``/v1/score``. Bodies become a
:class:`ScoreRequest` of (query, document) pairs; answers are one union shape per route kind, which each of those
clients reads: results sorted by ``relevance_score`` with each document's ``index`` (and the document, when asked),
or vLLM's scores in input order."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np

from phi_api.errors import InvalidParameterError, MissingParameterError, UnsupportedParameterError
from phi_api.protocols.contract import given
from phi_api.service.requests import ScoreRequest

SCORE_SIDES = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


def rerank_request(body: dict[str, Any]) -> ScoreRequest:
    """A schema-valid rerank body: the query against each document."""
    if given(body, "rank_fields") is not None:
        raise UnsupportedParameterError("rank_fields is not supported: send each document's text.",
                                        param="rank_fields")
    if given(body, "raw_scores", False):
        raise UnsupportedParameterError("raw_scores is not supported: scores are the reranker's activation.",
                                        param="raw_scores")
    documents, param = _documents(body)
    query = body["query"]
    per_document = given(body, "max_tokens_per_doc")
    # Cohere's documents are cut to max_tokens_per_doc, and a pair still past the model's length is cut to it
    cut = given(body, "truncate_prompt_tokens", -1 if per_document is not None or given(body, "truncate") else None)
    return ScoreRequest(model=body["model"], pairs=tuple((query, text_of(document)) for document in documents),
                        input_param=param, truncate=cut, priority=given(body, "priority"),
                        document_tokens=per_document)


def _documents(body: dict[str, Any]) -> tuple[list[Any], str]:
    for param in ("documents", "texts"):
        documents = given(body, param)
        if documents is not None:
            return documents, param
    raise MissingParameterError("documents must be a non-empty list of texts.", param="documents")


def text_of(document: Any) -> str:
    """A document's text (a string, or an object's ``text``)."""
    return document if isinstance(document, str) else str(document["text"])


def rerank_answer(body: dict[str, Any], scores: np.ndarray, tokens: int, *, v2: bool) -> Any:
    """The results, best first, cut to ``top_n``; with each document unless ``return_documents`` is false (on
    ``/v2/rerank``: only when it is true, as Cohere's v2). A body naming its documents ``texts`` is answered as
    TEI (and llama.cpp for such a body) answers: a bare list of ``index`` and ``score``, with ``text`` when
    ``return_text`` is true."""
    documents, param = _documents(body)
    top_n = given(body, "top_n", 0) or len(documents)
    order = sorted(range(len(documents)), key=lambda index: (-float(scores[index]), index))[:top_n]
    if param == "texts":
        text = given(body, "return_text", False)
        return [{"index": index, "score": float(scores[index]), **({"text": text_of(documents[index])} if text else {})}
                for index in order]
    echo = given(body, "return_documents", not v2)
    results = [{"index": index, "relevance_score": float(scores[index]),
                **({"document": _echoed(documents[index])} if echo else {})} for index in order]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": body["model"], "object": "list", "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "meta": {"api_version": {"version": "2" if v2 else "1"}, "billed_units": {"search_units": 1},
                     "tokens": {"input_tokens": tokens, "output_tokens": 0}}}


def _echoed(document: Any) -> dict[str, Any]:
    return {"text": document} if isinstance(document, str) else dict(document)


def score_request(body: dict[str, Any]) -> ScoreRequest:
    """A schema-valid ``/v1/score`` body: one first text against many second ones, or as many of each, paired."""
    for first_name, second_name in SCORE_SIDES:
        if body.get(first_name) is not None and body.get(second_name) is not None:
            first, second = _listed(body[first_name]), _listed(body[second_name])
            break
    else:
        raise MissingParameterError("Give the texts to score as text_1 and text_2 (or queries and documents).",
                                    param="text_1")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise InvalidParameterError(f"{first_name} must hold one text, or as many as {second_name} "
                                    f"({len(first)} against {len(second)}).", param=first_name)
    return ScoreRequest(model=body["model"], pairs=tuple(zip(first, second, strict=True)), input_param=second_name,
                        truncate=given(body, "truncate_prompt_tokens"), priority=given(body, "priority"))


def _listed(texts: str | list[str]) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def score_answer(model: str, scores: np.ndarray, tokens: int) -> dict[str, Any]:
    """vLLM's score answer: each pair's score, in input order."""
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model,
            "data": [{"index": index, "object": "score", "score": float(score)} for index, score in enumerate(scores)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}
