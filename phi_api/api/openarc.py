"""OpenArc's model management and bench: /openarc/status, /openarc/load, /openarc/unload, /openarc/bench (and
/v1/status, /v1/bench)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from phi_api.api.models import ADMIN_STATUSES, load_checked
from phi_api.protocols import catalog
from phi_api.protocols.contract import Reading
from phi_api.protocols.openarc import BenchReport, bench_request
from phi_api.web.auth import require_admin
from phi_api.web.bodies import read_request
from phi_api.web.openapi import GENERATION_STATUSES, operation
from phi_api.web.resources import get_models, get_settings
from phi_api.web.respond import respond

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
    return respond(Reading(bench_request(read_request("bench")), BenchReport))
