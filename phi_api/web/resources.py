"""The app's resources: built once by :func:`init_app`, kept on the Flask app, reached through one accessor each.

This is Flask's tutorial's ``init_app``/``get_db`` pattern, in one place for every
resource: the classes themselves (the limiter, the keys, the stores, the models,
...) know nothing of Flask; the app factory calls :func:`init_app`, and the web
layer reaches a resource with its accessor (``get_models()``, ``get_keys()``, ...),
which fails loudly when an app was built without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, current_app

from phi_api.engine import Engine, SharedBudget
from phi_api.engine.threads.native import give_back_memory
from phi_api.limits.keys import Keys, Usage, read_keys
from phi_api.limits.line import KeyCaps, WaitingLine
from phi_api.limits.slots import ConcurrencyLimiter
from phi_api.models.memory import ServerMemory, measured_here
from phi_api.models.registry import Models
from phi_api.models.specs import ModelSpec, declared
from phi_api.models.state import state_dir
from phi_api.settings import Settings
from phi_api.storage.batches import BatchStore
from phi_api.storage.database import sqlite_url
from phi_api.storage.files import Quota
from phi_api.storage.responses import ResponseStore
from phi_api.telemetry.metrics import Metrics
from phi_api.telemetry.tracing import Tracing
from phi_api.web.schemas import RequestValidator

_EXTENSION = "phi_api"


@dataclass
class Resources:
    """What one app holds: its settings and everything built from them."""

    settings: Settings
    validator: RequestValidator
    limiter: ConcurrencyLimiter
    keys: Keys
    responses: ResponseStore
    batches: BatchStore
    metrics: Metrics
    tracing: Tracing
    memory: ServerMemory
    caps: KeyCaps  # each key's cap on its running requests
    line: WaitingLine  # this worker's line of requests waiting for a slot
    models: Models | None = None  # set last: loading the declared models needs the rest
    document: dict[str, Any] = field(default_factory=dict)  # the OpenAPI document, once the routes are registered


def init_app(app: Flask, settings: Settings, load: Callable[[ModelSpec, SharedBudget], Engine]) -> Resources:
    """Build ``app``'s resources from ``settings``; ``load`` makes a model's engine, its keys and values in the
    worker's budget it is given; the declared models are loaded now.

    The slots' lock file and the model registry live in the server's state folder (one run's, shared by its
    processes); the keys' usage, the stored responses and the batches in the database (kept across restarts):
    ``DATABASE_URL``'s, or SQLite files in the data folder.
    The declared models must fit the memory budget with room for one request (else
    :class:`phi_api.errors.InsufficientMemoryError`: start-up stops); what this process then takes is measured.
    """
    folder = state_dir()
    resources = Resources(
        settings=settings, validator=RequestValidator(),
        limiter=ConcurrencyLimiter(settings.MAX_CONCURRENT_REQUESTS, os.path.join(folder, "slots.lock")),
        keys=Keys(read_keys(settings.API_KEYS_FILE, settings.api_keys), Usage(database_url(settings, "keys"))),
        responses=ResponseStore(database_url(settings, "responses"), settings.RESPONSES_STORE_MAX,
                                settings.RESPONSES_STORE_SECONDS),
        batches=BatchStore(database_url(settings, "batches"), settings.batch_dir, settings.BATCH_LEASE_SECONDS,
                           Quota(settings.FILES_MAX_PER_KEY, int(settings.FILES_MAX_MB_PER_KEY * 2**20))),
        metrics=Metrics(), tracing=Tracing(),
        memory=ServerMemory(settings.memory_limit_bytes, settings.workers,
                            shared=SharedBudget(0, settings.KV_IDLE_SECONDS)),
        caps=KeyCaps(folder), line=WaitingLine(settings.MAX_QUEUED_REQUESTS, settings.QUEUE_TIMEOUT))
    app.extensions[_EXTENSION] = resources

    def engine_of(spec: ModelSpec) -> Engine:
        engine = load(spec, resources.memory.shared)
        engine.observers.append(resources.metrics.observe_generation)
        return engine

    models = resources.models = Models(settings, folder, engine_of, resources.memory)
    models.declare(declared(settings))
    give_back_memory()  # what loading (a prepack, say) freed goes back to the system before it is measured
    resources.memory.master_private = measured_here()
    models.check_memory("the declared models")
    resources.memory.refresh(models.weights())  # the workers' first share, until each measures its own memory
    return resources


def database_url(settings: Settings, store: str) -> str:
    """Where ``store`` (keys, responses, batches) keeps its data: ``DATABASE_URL``, or its SQLite file of old."""
    if settings.DATABASE_URL:
        return settings.DATABASE_URL
    folder = settings.batch_dir if store == "batches" else settings.data_dir
    return sqlite_url(folder / f"{store}.sqlite3")


def get_resources(app: Flask | None = None) -> Resources:
    """Everything ``app`` (default: the current app) holds."""
    target = app if app is not None else current_app
    try:
        return target.extensions[_EXTENSION]
    except KeyError:
        raise RuntimeError("this app has no resources; build it with phi_api.app.create_app()") from None


def get_settings(app: Flask | None = None) -> Settings:
    return get_resources(app).settings


def get_validator(app: Flask | None = None) -> RequestValidator:
    return get_resources(app).validator


def get_limiter(app: Flask | None = None) -> ConcurrencyLimiter:
    return get_resources(app).limiter


def get_keys(app: Flask | None = None) -> Keys:
    return get_resources(app).keys


def get_caps(app: Flask | None = None) -> KeyCaps:
    return get_resources(app).caps


def get_line(app: Flask | None = None) -> WaitingLine:
    return get_resources(app).line


def get_store(app: Flask | None = None) -> ResponseStore:
    return get_resources(app).responses


def get_batches(app: Flask | None = None) -> BatchStore:
    return get_resources(app).batches


def get_metrics(app: Flask | None = None) -> Metrics:
    return get_resources(app).metrics


def get_tracing(app: Flask | None = None) -> Tracing:
    return get_resources(app).tracing


def get_memory(app: Flask | None = None) -> ServerMemory:
    return get_resources(app).memory


def get_models(app: Flask | None = None) -> Models:
    models = get_resources(app).models
    if models is None:
        raise RuntimeError("this app's models are not loaded yet")
    return models


def get_document(app: Flask | None = None) -> dict[str, Any]:
    return get_resources(app).document
