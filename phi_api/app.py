"""The Flask application factory, and the app's composition root: every resource is made here from the settings
(:func:`compose`), kept on the app (:func:`phi_api.web.resources.init_app`) and released by
:func:`phi_api.web.resources.teardown`."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider
from flask_cors import CORS

from phi_api.api import BLUEPRINTS, playground
from phi_api.engine import Engine, ServedEngine, SharedBudget
from phi_api.engine.threads.native import give_back_memory
from phi_api.errors import openai_body
from phi_api.limits.keys import Keys, Usage, read_keys
from phi_api.limits.line import KeyCaps, WaitingLine
from phi_api.limits.slots import ConcurrencyLimiter
from phi_api.models.loading import load_engine
from phi_api.models.memory import ServerMemory, measured_here
from phi_api.models.registry import Loader, Models
from phi_api.models.specs import ModelSpec, declared
from phi_api.models.state import state_dir
from phi_api.settings import Settings, load_settings
from phi_api.storage.background import BackgroundStore
from phi_api.storage.batches import BatchStore
from phi_api.storage.conversations import ConversationStore
from phi_api.storage.database import sqlite_url
from phi_api.storage.files import Quota
from phi_api.storage.responses import ResponseStore
from phi_api.telemetry.logs import configure_logging
from phi_api.telemetry.metrics import Metrics
from phi_api.telemetry.tracing import Tracing
from phi_api.web import openapi
from phi_api.web.auth import register_auth
from phi_api.web.errors import render_errors
from phi_api.web.hooks import count_requests, register_request_logging, send_rate_headers
from phi_api.web.resources import Resources, init_app
from phi_api.web.schemas import RequestValidator


class _JSONProvider(DefaultJSONProvider):
    """Flask's JSON, keeping the order fields are written in (OpenAI's) and non-ASCII text as it is."""

    sort_keys = False
    ensure_ascii = False


def create_app(config: Mapping[str, Any] | None = None, *, engine: Engine | None = None,
               loader: Loader | None = None) -> Flask:
    """Build the app: settings (defaults, environment, then ``config``), models, routes, error handlers.

    ``engine`` stands for every declared model, and ``loader`` turns a
    model spec into an engine, instead of loading models (tests pass small
    fakes). Loading failures raise :class:`phi_api.errors.ModelLoadingError`;
    bad settings raise :class:`phi_api.settings.ConfigError`.
    """
    settings = load_settings(overrides=config)
    configure_logging(settings.LOG_LEVEL, settings.LOG_FORMAT)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes  # the one setting Flask itself reads
    app.json = _JSONProvider(app)

    if loader is None and engine is not None:
        loader = lambda spec: engine  # noqa: E731

    def load(spec: ModelSpec, memory: SharedBudget) -> ServedEngine:
        return loader(spec) if loader is not None else load_engine(settings, spec, memory)

    resources = compose(settings, load)
    init_app(app, resources)
    count_requests(app, resources.metrics)
    # By the standard: any origin is answered "*" without credentials; only origins named get credentials (a gateway
    # in front that authenticates with cookies is not opened to every site).
    anyone = settings.cors_origins == "*"
    CORS(app, origins=settings.cors_origins, methods=["GET", "POST", "DELETE", "OPTIONS"],
         allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-Id", "anthropic-version",
                        "anthropic-beta"],
         expose_headers=["X-Request-Id"], supports_credentials=not anyone, send_wildcard=anyone, max_age=600)
    register_request_logging(app)
    send_rate_headers(app)
    register_auth(app, resources.keys, settings.ALLOW_QUERY_API_KEY)
    render_errors(app, openai_body)
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    if settings.PLAYGROUND:
        app.register_blueprint(playground.bp)
    resources.document = openapi.build(app)
    return app


def compose(settings: Settings, load: Callable[[ModelSpec, SharedBudget], ServedEngine]) -> Resources:
    """Every resource of an app, made from ``settings``; ``load`` makes a model's engine, its keys and values in the
    worker's budget it is given; the declared models are loaded now.

    The slots' lock file and the model registry live in the server's state folder (one run's, shared by its
    processes); the keys' usage, the stored responses and the batches in the database (kept across restarts):
    ``DATABASE_URL``'s, or SQLite files in the data folder. The declared models must fit the memory budget with room
    for one request (else :class:`phi_api.errors.InsufficientMemoryError`: start-up stops); what this process then
    takes is measured.
    """
    folder = state_dir()
    resources = Resources(
        settings=settings, validator=RequestValidator(),
        limiter=ConcurrencyLimiter(settings.MAX_CONCURRENT_REQUESTS, os.path.join(folder, "slots.lock")),
        keys=Keys(read_keys(settings.API_KEYS_FILE, settings.api_keys), Usage(database_url(settings, "keys"))),
        responses=ResponseStore(database_url(settings, "responses"), settings.RESPONSES_STORE_MAX,
                                settings.RESPONSES_STORE_SECONDS, int(settings.RESPONSES_STORE_MB_PER_KEY * 2**20),
                                settings.max_request_bytes),
        conversations=ConversationStore(database_url(settings, "responses"), settings.CONVERSATIONS_MAX_PER_KEY,
                                        settings.CONVERSATION_ITEMS_MAX,
                                        int(settings.CONVERSATIONS_MB_PER_KEY * 2**20), settings.max_request_bytes),
        background=BackgroundStore(database_url(settings, "responses"), max_active=settings.BACKGROUND_MAX_PER_KEY,
                                   max_ended=settings.BACKGROUND_ENDED_MAX_PER_KEY,
                                   max_events=settings.BACKGROUND_EVENTS_MAX,
                                   events_seconds=settings.BACKGROUND_EVENTS_SECONDS,
                                   max_age=settings.RESPONSES_STORE_SECONDS, lease=settings.BACKGROUND_LEASE_SECONDS),
        batches=BatchStore(database_url(settings, "batches"), settings.batch_dir, settings.BATCH_LEASE_SECONDS,
                           Quota(settings.FILES_MAX_PER_KEY, int(settings.FILES_MAX_MB_PER_KEY * 2**20)),
                           longest_line=settings.max_request_bytes),  # a line is one request's body
        metrics=Metrics(), tracing=Tracing(),
        memory=ServerMemory(settings.memory_limit_bytes, settings.workers,
                            shared=SharedBudget(0, settings.KV_IDLE_SECONDS)),
        caps=KeyCaps(folder), line=WaitingLine(settings.MAX_QUEUED_REQUESTS, settings.QUEUE_TIMEOUT))

    def engine_of(spec: ModelSpec) -> ServedEngine:
        engine = load(spec, resources.memory.shared)
        engine.observers.append(functools.partial(resources.metrics.observe_generation, spec.id))
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
