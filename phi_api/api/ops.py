"""Operations: health, Prometheus metrics, OpenArc's status and bench, tokenizing, the API's description."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.api.models import ADMIN_STATUSES, load_checked
from phi_api.engine import Engine
from phi_api.protocols import catalog
from phi_api.service import generation, prompts
from phi_api.service.requests import CompletionRequest, Sampling
from phi_api.telemetry.logs import current_request_id
from phi_api.web.http import read_request, services
from phi_api.web.openapi import GENERATION_STATUSES, operation
from phi_api.web.resources import get_document, get_metrics, get_models, get_settings
from phi_api.web.transport import disconnect_probe

bp = Blueprint("ops", __name__)


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
    """Prometheus text exposition, every worker's samples together."""
    return get_metrics().exposition()


@bp.get("/v1/status")
@bp.get("/openarc/status")
@operation("The loaded models and their runtime (OpenArc's status)")
def status() -> Response:
    """The loaded models, their engine, device and runtime configuration (OpenArc's status)."""
    return jsonify(catalog.status(get_settings(), get_models().all()))


@bp.post("/openarc/load")
@operation("Load a model (OpenArc's fields): 400 for a name already loaded, 500 when loading fails",
           request="openarc_load", statuses=ADMIN_STATUSES)
def openarc_load() -> Response:
    """OpenArc's load: ``model_path`` as ``model_name``, its ``runtime_config`` as the engine's options."""
    body = read_request("openarc_load")
    model = load_checked(body["model_name"], body["model_path"], body.get("runtime_config"), param="runtime_config")
    return jsonify({"model_id": model["id"], "model_name": model["id"], "status": "loaded"})


@bp.post("/openarc/unload")
@operation("Unload a model (OpenArc's fields): 404 for an unknown one", request="openarc_unload",
           statuses=ADMIN_STATUSES)
def openarc_unload() -> Response:
    """OpenArc's unload: new requests get 404 at once; running generations finish."""
    body = read_request("openarc_unload")
    get_models().unload(body["model_name"])
    return jsonify({"model_name": body["model_name"], "status": "unloading"})


@bp.post("/v1/bench")
@bp.post("/openarc/bench")
@operation("Generate from token ids and report metrics (OpenArc's bench)", request="bench",
           statuses=GENERATION_STATUSES)
def bench() -> Response:
    """Generate from token ids, end-of-sequence ignored, and report the metrics (OpenArc's bench)."""
    body = read_request("bench")
    sampling = Sampling(max_tokens=body.get("max_tokens"), temperature=body.get("temperature"),
                        top_p=body.get("top_p"), top_k=body.get("top_k"),
                        repetition_penalty=body.get("repetition_penalty"), ignore_eos=True)
    run = generation.start(services(), CompletionRequest(model=body["model"], prompt=body["input_ids"],
                                                         sampling=sampling), current_request_id())
    results = generation.collect(run, disconnect_probe())
    return jsonify({"metrics": generation.openarc_metrics([result.ended.finished for result in results])})


@bp.post("/tokenize")
@operation("Text or chat messages to token ids", request="tokenize")
def tokenize() -> Response:
    """Text, or chat messages (through the chat template), to token ids."""
    body = read_request("tokenize")
    engine = _engine_for(body)
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
@operation("Token ids to text", request="detokenize")
def detokenize() -> Response:
    """Token ids to text (answered as vLLM's ``prompt`` and llama.cpp's ``content``)."""
    body = read_request("detokenize")
    engine = _engine_for(body)
    prompts.check_token_ids(engine, body["tokens"], "tokens")
    text = engine.decode(body["tokens"]) if body["tokens"] else ""
    return jsonify({"prompt": text, "content": text})


def _engine_for(body: dict) -> Engine:
    """The engine of the model ``body`` names, or of the first one served when it names none."""
    models = get_models()
    return models.engine(body.get("model") or next(iter(models.ids()), ""))
