"""The Flask application factory."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider
from flask_cors import CORS

from phi_api.api import BLUEPRINTS, batches, playground
from phi_api.engine import Engine
from phi_api.errors import openai_body
from phi_api.limits import keys
from phi_api.limits import slots as limiter
from phi_api.models.registry import Loader, ModelSpec, state_dir
from phi_api.settings import load_settings
from phi_api.storage import responses as store
from phi_api.telemetry import metrics, tracing
from phi_api.telemetry.logs import configure_logging, register_request_logging
from phi_api.web import extensions, openapi, schemas
from phi_api.web.auth import register_auth
from phi_api.web.http import render_errors


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
    app.config.from_mapping(dataclasses.asdict(settings))
    app.config.from_mapping({key: value for key, value in (config or {}).items() if key not in app.config})
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json = _JSONProvider(app)

    extensions.init_settings(app, settings)
    schemas.init_app(app)
    folder = state_dir()  # shared by the server's processes: the slots' lock file and the model registry
    limiter.init_app(app, settings.MAX_CONCURRENT_REQUESTS, folder)
    store.init_app(app, folder, settings.RESPONSES_STORE_MAX, settings.RESPONSES_STORE_SECONDS)
    batches.init_app(app)
    tracing.init_app(app)
    observe = metrics.init_app(app).observe_generation
    memory = extensions.init_memory(app, settings)
    if loader is None:
        loader = (lambda spec: engine) if engine is not None else \
            functools.partial(extensions.load_engine, settings, memory=memory.shared)

    def load(spec: ModelSpec) -> Engine:
        loaded = loader(spec)
        loaded.observers.append(observe)
        return loaded

    extensions.init_models(app, settings, load, folder, memory)

    CORS(app, origins=settings.cors_origins, methods=["GET", "POST", "DELETE", "OPTIONS"],
         allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-Id", "anthropic-version",
                        "anthropic-beta"],
         expose_headers=["X-Request-Id"], supports_credentials=True, max_age=600)
    register_request_logging(app)
    register_auth(app, keys.init_app(app, settings.API_KEYS_FILE, settings.api_keys, folder))
    render_errors(app, openai_body)
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    if settings.PLAYGROUND:
        app.register_blueprint(playground.bp)
    openapi.init_app(app)
    return app
