"""Operations: health, Prometheus metrics, OpenArc's status and bench, tokenizing."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from phi_api import extensions
from phi_api.extensions import get_engine, get_settings, get_validator
from phi_api.service import catalog, completions, prompts
from phi_api.service.body import read_json_object
from phi_api.service.formats import COMPLETION

bp = Blueprint("ops", __name__)


@bp.get("/health")
def health() -> Response:
    """200 once this worker can generate; 503 while it is starting or shutting down."""
    engine = get_engine()
    if engine.ready:
        return jsonify({"status": "ok"})
    response = jsonify({"status": "draining" if engine.draining else "starting"})
    response.status_code = 503
    return response


@bp.get("/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3.1 document of every route (generated from the JSON Schema files at start-up)."""
    return jsonify(current_app.extensions[extensions.OPENAPI])


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus text exposition, every worker's samples together."""
    return current_app.extensions[extensions.METRICS].exposition()


@bp.get("/v1/status")
@bp.get("/openarc/status")
def status() -> Response:
    """The loaded model, its engine, device and runtime configuration (OpenArc's status)."""
    return jsonify(catalog.status(get_settings(), get_engine()))


@bp.post("/v1/bench")
@bp.post("/openarc/bench")
def bench() -> Response:
    """Generate from token ids, end-of-sequence ignored, and report the metrics (OpenArc's bench)."""
    body = read_json_object()
    get_validator().validate("bench", body)
    request = {key: value for key, value in body.items() if key != "input_ids"}
    request.update({"prompt": body["input_ids"], "ignore_eos": True, "stream": False})
    run = completions.start(COMPLETION, request)
    finished = completions.collect(run, lambda delta: None)
    return jsonify({"metrics": completions.openarc_metrics(finished)})


@bp.post("/tokenize")
def tokenize() -> Response:
    """Text, or chat messages (through the chat template), to token ids."""
    body = read_json_object()
    get_validator().validate("tokenize", body)
    engine = get_engine()
    if "messages" in body:
        tokens = prompts.chat_prompt(engine, body["messages"],
                                     add_generation_prompt=body.get("add_generation_prompt") is not False,
                                     must_fit=False)
    else:
        param = "prompt" if "prompt" in body else "content"
        tokens = prompts.text_tokens(engine, body[param], param, must_fit=False)
    return jsonify({"tokens": [int(token) for token in tokens], "count": len(tokens),
                    "max_model_len": engine.info.context_length})


@bp.post("/detokenize")
def detokenize() -> Response:
    """Token ids to text (answered as vLLM's ``prompt`` and llama.cpp's ``content``)."""
    body = read_json_object()
    get_validator().validate("detokenize", body)
    engine = get_engine()
    prompts.check_token_ids(engine, body["tokens"], "tokens")
    text = engine.decode(body["tokens"]) if body["tokens"] else ""
    return jsonify({"prompt": text, "content": text})
