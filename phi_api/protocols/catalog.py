"""What the server says about its models, in each API's vocabulary (OpenAI's, Anthropic's, Ollama's,
OpenArc's)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from phi_api.engine import EncoderEngine
from phi_api.models.registry import Served
from phi_api.settings import Settings
from phi_api.version import __version__

OPENARC_TYPES = {"embed": "emb", "rerank": "rerank"}  # OpenArc's model types of encoders
# Ollama's names of the sampling fields whose names differ (a Modelfile's PARAMETER lines)
OLLAMA_NAMES = {"repetition_penalty": "repeat_penalty"}


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def task_of(served: Served) -> str:
    """What the model does: ``generate``, or an encoder's ``embed`` or ``rerank``."""
    engine = served.engine
    return engine.task if isinstance(engine, EncoderEngine) else "generate"


def openai_model(served: Served) -> dict[str, Any]:
    """OpenAI's model object, with its context length (vLLM's ``max_model_len``), so clients can size prompts, its
    task (``generate``, ``embed``, ``rerank``) and, for a generator, the sampling defaults a request that omits a
    field gets (phi-api's ``sampling_defaults``)."""
    engine = served.engine
    own = {"dimensions": engine.info.dimensions} if isinstance(engine, EncoderEngine) else {
        "sampling_defaults": dict(engine.config.sampling_defaults)}
    return {"id": served.spec.id, "object": "model", "created": served.loaded_at, "owned_by": "system",
            "max_model_len": engine.info.context_length, "task": task_of(served), **own}


def openai_list(models: list[Served]) -> dict[str, Any]:
    """OpenAI's model list."""
    return {"object": "list", "data": [openai_model(served) for served in models]}


def anthropic_model(served: Served) -> dict[str, Any]:
    """Anthropic's model object (its SDK's ``ModelInfo``), with its context length."""
    return {"type": "model", "id": served.spec.id, "display_name": served.spec.id, "created_at": _iso(served.loaded_at),
            "lifecycle": "active", "max_input_tokens": served.engine.info.context_length}


def anthropic_list(models: list[Served]) -> dict[str, Any]:
    """Anthropic's model list: one page of every model."""
    data = [anthropic_model(served) for served in models]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def _details(served: Served) -> dict[str, Any]:
    info = served.engine.info
    return {"parent_model": "", "format": "onnx", "family": info.model_type, "families": [info.model_type],
            "parameter_size": "", "quantization_level": "int4" if task_of(served) == "generate" else "F32"}


def ollama_model(served: Served) -> dict[str, Any]:
    """Ollama's entry of a model in a tag list."""
    info = served.engine.info
    return {"name": served.spec.id, "model": served.spec.id, "modified_at": _iso(info.modified_at),
            "size": info.size_bytes, "digest": info.fingerprint, "details": _details(served)}


def tags(models: list[Served]) -> dict[str, Any]:
    """The model list in both forms at once: OpenAI's ``data`` and Ollama's ``models``."""
    return {**openai_list(models), "models": [ollama_model(served) for served in models]}


def running(models: list[Served]) -> dict[str, Any]:
    """Ollama's ``/api/ps``: the models loaded now (kept until unloaded: no expiry)."""
    return {"models": [{**ollama_model(served), "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0}
                       for served in models]}


def ollama_show(served: Served) -> dict[str, Any]:
    """Ollama's ``/api/show`` answer."""
    engine = served.engine
    if isinstance(engine, EncoderEngine):
        return _ollama_show_encoder(served, engine)
    info = engine.info
    return {
        "modelfile": f"# served by phi-api {__version__}\n",
        "parameters": "\n".join(f"{OLLAMA_NAMES.get(name, name)} {value}" for name, value in
                                 (("num_ctx", info.context_length), *served.engine.config.sampling_defaults)),
        "template": info.chat_template,
        "details": _details(served),
        "model_info": {"general.architecture": info.model_type, f"{info.model_type}.context_length":
                       info.context_length, "general.file_type": "onnx-int4"},
        "capabilities": ["completion", "tools"],
        "modified_at": _iso(info.modified_at),
    }


def _ollama_show_encoder(served: Served, engine: EncoderEngine) -> dict[str, Any]:
    """Ollama's ``/api/show`` of an encoder (its capability ``embedding``, as Ollama names it; a reranker's
    ``rerank``)."""
    info = engine.info
    return {"modelfile": f"# served by phi-api {__version__}\n", "parameters": f"num_ctx {info.context_length}",
            "template": "", "details": _details(served),
            "model_info": {"general.architecture": info.model_type,
                           f"{info.model_type}.context_length": info.context_length,
                           f"{info.model_type}.embedding_length": info.dimensions, "general.file_type": "onnx-f32"},
            "capabilities": ["embedding"] if info.task == "embed" else ["rerank"],
            "modified_at": _iso(info.modified_at)}


def status(settings: Settings, models: list[Served]) -> dict[str, Any]:
    """OpenArc's ``/openarc/status`` answer: every model, with the runtime it runs with."""

    def entry(served: Served) -> dict[str, Any]:
        own = dataclasses.replace(settings, **served.spec.options)
        engine = served.engine
        if isinstance(engine, EncoderEngine):
            return {"model_name": served.spec.id, "model_type": OPENARC_TYPES[engine.task], "engine": "onnxruntime",
                    "device": "CPU", "runtime_config": {
                        "workers": own.workers, "intra_op_threads": own.intra_op_threads,
                        "max_batch_rows": own.MAX_BATCH_ROWS, "encoder_batch_tokens": own.ENCODER_BATCH_TOKENS,
                        "context_length": engine.info.context_length, "dimensions": engine.info.dimensions},
                    "status": "loaded", "time_loaded": _iso(served.loaded_at)}
        return {
            "model_name": served.spec.id,
            "model_type": "llm",
            "engine": "onnxruntime",
            "device": "CPU",
            "runtime_config": {
                "workers": own.workers,
                "intra_op_threads": own.intra_op_threads,
                "kv_cache_mb_per_worker": round(own.kv_budget_bytes / 2**20),
                "max_batch_rows": own.MAX_BATCH_ROWS,
                "preload_model": own.PRELOAD_MODEL,
                "max_concurrent_requests": own.MAX_CONCURRENT_REQUESTS,
                "context_length": served.engine.info.context_length,
                "kv_cache_dtype": engine.kv_dtype,
                "attention_kernel": engine.attention_kernel,
                "kv_bytes_per_token": engine.model.spec.kv_bytes_per_token,
                "prefix_cache": own.PREFIX_CACHE,
            },
            "status": "loaded",
            "time_loaded": _iso(served.loaded_at),
        }

    return {"total_loaded_models": len(models), "models": [entry(served) for served in models],
            "openai_model_names": [served.spec.id for served in models]}
