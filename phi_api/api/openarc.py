"""OpenArc's model management and bench: /openarc/status, /openarc/load, /openarc/unload, /openarc/bench (and
/v1/status, /v1/bench)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.api.models import ADMIN_STATUSES, load_checked
from phi_api.protocols import catalog
from phi_api.service import generation
from phi_api.service.requests import CompletionRequest, Sampling
from phi_api.web.auth import require_admin
from phi_api.web.http import read_request, start_generation
from phi_api.web.openapi import GENERATION_STATUSES, operation
from phi_api.web.resources import get_models, get_settings
from phi_api.web.transport import disconnect_probe

bp = Blueprint("openarc", __name__)


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
    require_admin("unload models")
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
    run = start_generation(CompletionRequest(model=body["model"], prompt=body["input_ids"], sampling=sampling))
    results = generation.collect(run, disconnect_probe())
    return jsonify({"metrics": generation.openarc_metrics([result.ended.finished for result in results])})
