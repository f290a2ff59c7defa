"""The settings and the models as app resources (``init_*`` and accessors), and how a model becomes an engine.

The registry (:mod:`phi_api.models.registry`) and the engine package know nothing of Flask; this module is where
the app meets them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from flask import Flask

from phi_api.engine import Engine, EngineConfig, SharedBudget
from phi_api.engine.threads.native import give_back_memory
from phi_api.errors import ModelLoadingError
from phi_api.models.memory import ServerMemory, measured_here
from phi_api.models.registry import Loader, Models, ModelSpec, declared
from phi_api.settings import Settings, engine_values
from phi_api.web.resources import keep, kept

_SETTINGS = "phi_api.settings"
_MODELS = "phi_api.models"
_MEMORY = "phi_api.memory"


def load_engine(settings: Settings, spec: ModelSpec, memory: SharedBudget | None = None) -> Engine:
    """Load the model ``spec`` names, with its own engine options over ``settings``, its keys and values in the
    worker's ``memory``; raises :class:`ModelLoadingError` with the model, its path and the cause."""
    from google.protobuf.message import DecodeError

    from phi_api.engine.runtime import oga
    from phi_api.engine.runtime.model import LanguageModel
    from phi_api.engine.runtime.session import ORT_ERRORS
    from phi_api.errors import GuidanceError, PrepackError
    from phi_api.settings import cache_root

    path = spec.path
    settings = dataclasses.replace(settings, **spec.options)
    if not os.path.isdir(path):
        raise ModelLoadingError(path, "no such directory", spec.id)
    if not os.path.isfile(os.path.join(path, "genai_config.json")):
        raise ModelLoadingError(path, "genai_config.json not found (not an ONNX Runtime GenAI model folder)",
                                spec.id)
    try:
        model = LanguageModel(path, cache_dir=cache_root() / "runtime", kv_dtype=settings.KV_CACHE_DTYPE)
    except (oga.OgaError, PrepackError, GuidanceError) as exc:
        raise ModelLoadingError(path, str(exc), spec.id) from exc
    except ORT_ERRORS + (DecodeError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadingError(path, f"unreadable model ({type(exc).__name__}: {exc})", spec.id) from exc
    return Engine(model, engine_config(settings, spec.id), memory)


def engine_config(settings: Settings, name: str = "") -> EngineConfig:
    """A model's engine configuration, from the server's settings with the model's own options applied."""
    return EngineConfig(name=name, **engine_values(settings))


def init_settings(app: Flask, settings: Settings) -> None:
    """Keep the app's settings."""
    keep(app, _SETTINGS, settings)


def get_settings(app: Flask | None = None) -> Settings:
    """The app's settings."""
    return kept(_SETTINGS, app)


def init_memory(app: Flask, settings: Settings) -> ServerMemory:
    """Keep the app's memory budget (``MEMORY_LIMIT_MB``) and this process's key/value share of it."""
    shared = SharedBudget(0, settings.KV_IDLE_SECONDS)
    return keep(app, _MEMORY, ServerMemory(settings.memory_limit_bytes, settings.workers, shared=shared))


def get_memory(app: Flask | None = None) -> ServerMemory:
    """The app's memory budget."""
    return kept(_MEMORY, app)


def init_models(app: Flask, settings: Settings, loader: Loader, folder: Path, memory: ServerMemory) -> Models:
    """Keep the app's models: the declared ones, loaded now (or those the server already serves); their
    registry in the server's state ``folder``. The declared models must fit ``memory`` with room for one request
    (else :class:`InsufficientMemoryError`: start-up stops); what this process then takes is measured."""
    models = keep(app, _MODELS, Models(settings, folder, loader, memory))
    models.declare(declared(settings))
    give_back_memory()  # what loading (a prepack, say) freed goes back to the system before it is measured
    memory.master_private = measured_here()
    models.check_memory("the declared models")
    memory.refresh(models.weights())  # the workers' first share, until each measures its own memory
    return models


def get_models(app: Flask | None = None) -> Models:
    """The app's models."""
    return kept(_MODELS, app)
