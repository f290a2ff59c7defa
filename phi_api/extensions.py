"""The engine and the settings as app resources: their ``init_app`` and accessors (see :mod:`phi_api.resources`).

The engine package knows nothing of Flask; this module is where the app meets it.
"""

from __future__ import annotations

import os

from flask import Flask

from phi_api.config import Settings
from phi_api.engine import Engine
from phi_api.errors import ModelLoadingError
from phi_api.resources import keep, kept

_ENGINE = "phi_api.engine"
_SETTINGS = "phi_api.settings"


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


def init_settings(app: Flask, settings: Settings) -> None:
    """Keep the app's settings."""
    keep(app, _SETTINGS, settings)


def get_settings(app: Flask | None = None) -> Settings:
    """The app's settings."""
    return kept(_SETTINGS, app)


def init_engine(app: Flask, settings: Settings, engine: Engine | None = None) -> Engine:
    """Keep the app's engine: ``engine`` (tests pass a fake), else the model ``settings`` name, loaded now."""
    return keep(app, _ENGINE, engine if engine is not None else load_engine(settings))


def get_engine(app: Flask | None = None) -> Engine:
    """The app's engine."""
    return kept(_ENGINE, app)
