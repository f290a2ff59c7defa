"""Operations: health, Prometheus metrics, the API's description, and tokenizing."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.engine import Engine
from phi_api.service import prompts
from phi_api.web.auth import is_admin
from phi_api.web.bodies import read_request
from phi_api.web.openapi import operation
from phi_api.web.resources import get_document, get_metrics, get_models
from phi_api.web.respond import count_request, json_answer

bp = Blueprint("operations", __name__)
KEY_SERIES = b"phi_api_key_"  # the per-key series (telemetry.metrics), and their HELP and TYPE lines


@bp.get("/health")
@operation("200 when this worker can serve, 503 while it starts or drains", errors="health", statuses=(503,))
def health() -> Response:
    """200 once this worker can generate with every model it serves (also with none: it can load one), naming
    the models whose requests wait for key/value memory; 503 while it is starting or shutting down."""
    models = get_models()
    if models.ready:
        waiting = [served.spec.id for served in models.all() if served.engine.waiting_for_memory]
        if waiting:  # still serving: requests of these models wait, in order, for key/value memory to be given back
            return jsonify({"status": "ok", "waiting_for_memory": waiting})
        return jsonify({"status": "ok"})
    response = jsonify({"status": "draining" if models.draining else "starting"})
    response.status_code = 503
    return response


@bp.get("/openapi.json")
@operation("This document")
def openapi() -> Response:
    """The OpenAPI 3.1 document of every route (generated from the JSON Schema files at start-up)."""
    return jsonify(get_document())


@bp.get("/metrics")
@operation("Prometheus metrics", media=("text/plain",))
def metrics() -> Response:
    """Prometheus text exposition, every worker's samples together; the series by API key only for admin keys."""
    body, content_type = get_metrics().exposition()
    if not is_admin():
        body = b"".join(line for line in body.splitlines(keepends=True) if KEY_SERIES not in line)
    return Response(body, content_type=content_type)


@bp.post("/tokenize")
@operation("Text or chat messages to token ids", request="tokenize")
def tokenize() -> Response:
    """Text, or chat messages (through the chat template), to token ids."""
    body = read_request("tokenize")
    count_request()  # as an upload is: tokenizing is work the server does for the key
    engine = _engine_for(body)
    if "messages" in body:
        tokens = prompts.chat_prompt(engine, body["messages"],
                                     add_generation_prompt=body.get("add_generation_prompt") is not False,
                                     must_fit=False)
    else:
        param = "prompt" if "prompt" in body else "content"
        tokens = prompts.text_tokens(engine, body[param], param, must_fit=False)
    answer = {"count": len(tokens), "max_model_len": engine.info.context_length}
    # made and encoded on a pooled thread: a long text's answer is megabytes of JSON
    return json_answer(lambda: {"tokens": tokens.tolist(), **answer})


@bp.post("/detokenize")
@operation("Token ids to text", request="detokenize")
def detokenize() -> Response:
    """Token ids to text (answered as vLLM's ``prompt`` and llama.cpp's ``content``)."""
    body = read_request("detokenize")
    count_request()  # as /tokenize is
    engine = _engine_for(body)
    text = prompts.detokenized(engine, body["tokens"], "tokens")
    return json_answer(lambda: {"prompt": text, "content": text})


def _engine_for(body: dict) -> Engine:
    """The engine of the model ``body`` names, or of the first one served when it names none."""
    models = get_models()
    return models.engine(body.get("model") or next(iter(models.ids()), ""))
