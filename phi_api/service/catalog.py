"""What the server says about its model, in each API's vocabulary."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from phi_api.version import __version__
from phi_api.config import Settings
from phi_api.engine import Engine


def openai_model(settings: Settings, engine: Engine) -> dict[str, Any]:
    """OpenAI's model object."""
    return {"id": settings.MODEL_ID, "object": "model", "created": engine.loaded_at, "owned_by": "system"}


def _details(engine: Engine) -> dict[str, Any]:
    info = engine.info
    return {"parent_model": "", "format": "onnx", "family": info.model_type, "families": [info.model_type],
            "parameter_size": "", "quantization_level": "int4"}


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


def ollama_model(settings: Settings, engine: Engine) -> dict[str, Any]:
    """Ollama's entry of a model in a tag list."""
    return {
        "name": settings.MODEL_ID,
        "model": settings.MODEL_ID,
        "modified_at": _iso(engine.info.modified_at),
        "size": engine.info.size_bytes,
        "digest": engine.info.fingerprint,
        "details": _details(engine),
    }


def tags(settings: Settings, engine: Engine) -> dict[str, Any]:
    """The model list in both forms at once: OpenAI's ``data`` and Ollama's ``models``."""
    return {"object": "list", "data": [openai_model(settings, engine)], "models": [ollama_model(settings, engine)]}


def ollama_show(settings: Settings, engine: Engine) -> dict[str, Any]:
    """Ollama's ``/api/show`` answer."""
    info = engine.info
    return {
        "modelfile": f"# served by phi-api {__version__}\n",
        "parameters": "",
        "template": info.chat_template,
        "details": _details(engine),
        "model_info": {"general.architecture": info.model_type, f"{info.model_type}.context_length":
                       info.context_length, "general.file_type": "onnx-int4"},
        "capabilities": ["completion", "tools"],
        "modified_at": _iso(info.modified_at),
    }


def status(settings: Settings, engine: Engine) -> dict[str, Any]:
    """OpenArc's ``/openarc/status`` answer."""
    return {
        "total_loaded_models": 1,
        "models": [{
            "model_name": settings.MODEL_ID,
            "model_type": "llm",
            "engine": "onnxruntime",
            "device": "CPU",
            "runtime_config": {
                "workers": settings.workers,
                "intra_op_threads": settings.intra_op_threads,
                "kv_cache_mb_per_worker": round(settings.kv_budget_bytes / 2**20),
                "max_batch_rows": settings.MAX_BATCH_ROWS,
                "preload_model": settings.PRELOAD_MODEL,
                "max_concurrent_requests": settings.MAX_CONCURRENT_REQUESTS,
                "context_length": engine.info.context_length,
            },
            "status": "loaded",
            "time_loaded": _iso(engine.loaded_at),
        }],
        "openai_model_names": [settings.MODEL_ID],
    }
