"""The app's resources: made by the app factory (:mod:`phi_api.app`, the composition root), kept on the Flask app
(:func:`init_app`), reached through one accessor each, and released by :func:`teardown`.

This is Flask's tutorial's ``init_app``/``get_db``/``close_db`` pattern, for every
resource: the classes themselves (the limiter, the keys, the stores, the models,
...) know nothing of Flask, and the web layer reaches a resource with its accessor
(``get_models()``, ``get_keys()``, ...), which fails loudly when an app was built
without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flask import Flask, current_app

from phi_api.limits.keys import Keys
from phi_api.limits.line import KeyCaps, WaitingLine
from phi_api.limits.slots import ConcurrencyLimiter
from phi_api.models.memory import ServerMemory
from phi_api.models.registry import Models
from phi_api.settings import Settings
from phi_api.storage.background import BackgroundStore
from phi_api.storage.batches import BatchStore
from phi_api.storage.conversations import ConversationStore
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
    conversations: ConversationStore
    background: BackgroundStore
    batches: BatchStore
    metrics: Metrics
    tracing: Tracing
    memory: ServerMemory
    caps: KeyCaps  # each key's cap on its running requests
    line: WaitingLine  # this worker's line of requests waiting for a slot
    models: Models | None = None  # set last: loading the declared models needs the rest
    document: dict[str, Any] = field(default_factory=dict)  # the OpenAPI document, once the routes are registered

    def draining(self) -> bool:
        """Whether this worker is shutting down (its runners then claim no more work)."""
        return self.models is not None and self.models.draining


def init_app(app: Flask, resources: Resources) -> None:
    """Keep ``resources`` on ``app``: the accessors reach them there."""
    app.extensions[_EXTENSION] = resources


def teardown(app: Flask) -> None:
    """Release what ``app`` holds, each resource in turn, the last made first: its models' engines stop, its slots'
    lock file goes, its databases' connections close."""
    resources = get_resources(app)
    if resources.models is not None:
        resources.models.stop()
    resources.limiter.remove_file()
    for database in (resources.batches.database, resources.responses.database, resources.conversations.database,
                     resources.background.database, resources.keys.usage.database):
        database.close()


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


def get_conversations(app: Flask | None = None) -> ConversationStore:
    return get_resources(app).conversations


def get_background(app: Flask | None = None) -> BackgroundStore:
    return get_resources(app).background


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
