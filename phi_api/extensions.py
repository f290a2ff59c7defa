"""What the app factory attaches to the Flask app, and how code reaches it.

Everything lives in ``app.extensions``; the accessors fail loudly when an app
was built without it, instead of letting a ``None`` travel further.
"""

from __future__ import annotations

import os
from typing import Any

from flask import current_app

from phi_api.config import Settings
from phi_api.engine import Engine
from phi_api.errors import ModelLoadingError

ENGINE = "phi_api.engine"
SETTINGS = "phi_api.settings"
LIMITER = "phi_api.limiter"
VALIDATOR = "phi_api.validator"
METRICS = "phi_api.metrics"
OPENAPI = "phi_api.openapi"


def load_engine(settings: Settings) -> Engine:
    """Load ``settings.MODEL_PATH``; raises :class:`ModelLoadingError` with the path and the cause."""
    from google.protobuf.message import DecodeError

    from phi_api.engine import oga
    from phi_api.engine.guidance import GuidanceError
    from phi_api.engine.model import LanguageModel
    from phi_api.engine.prepack import PrepackError
    from phi_api.engine.runtime import ORT_ERRORS
    from phi_api.prepare import cache_root

    path = settings.MODEL_PATH
    if not os.path.isdir(path):
        raise ModelLoadingError(path, "no such directory")
    if not os.path.isfile(os.path.join(path, "genai_config.json")):
        raise ModelLoadingError(path, "genai_config.json not found (not an ONNX Runtime GenAI model folder)")
    try:
        model = LanguageModel(path, cache_dir=cache_root() / "runtime")
    except (oga.OgaError, PrepackError, GuidanceError) as exc:
        raise ModelLoadingError(path, str(exc)) from exc
    except ORT_ERRORS + (DecodeError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadingError(path, f"unreadable model ({type(exc).__name__}: {exc})") from exc
    return Engine(model, prefill_chunk=settings.PREFILL_CHUNK_TOKENS, timeout=settings.GENERATION_TIMEOUT,
                  threads=settings.intra_op_threads, kv_budget_bytes=settings.kv_budget_bytes,
                  max_rows=settings.MAX_BATCH_ROWS, cache_bytes=int(settings.PROMPT_CACHE_MB * 2**20))


def _get(key: str) -> Any:
    try:
        return current_app.extensions[key]
    except KeyError:
        raise RuntimeError(f"{key} is not set up on this app; build it with phi_api.create_app()") from None


def get_engine() -> Engine:
    """The app's engine."""
    return _get(ENGINE)


def get_settings() -> Settings:
    """The app's settings."""
    return _get(SETTINGS)


def get_limiter() -> Any:
    """The app's server-wide concurrency limiter."""
    return _get(LIMITER)


def get_validator() -> Any:
    """The app's compiled request schemas."""
    return _get(VALIDATOR)
