"""The Flask application factory."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flask import Flask
from flask_cors import CORS

from phi_api import extensions, openapi
from phi_api.api import BLUEPRINTS
from phi_api.auth import register_auth
from phi_api.config import load_settings
from phi_api.engine import Engine
from phi_api.errors import register_error_handlers
from phi_api.limiter import ConcurrencyLimiter
from phi_api.logs import configure_logging, register_request_logging
from phi_api.metrics import Metrics
from phi_api.schemas import RequestValidator


def create_app(config: Mapping[str, Any] | None = None, *, engine: Engine | None = None) -> Flask:
    """Build the app: settings (defaults, environment, then ``config``), engine, routes, error handlers.

    ``engine`` replaces the model load (tests pass a small fake). Loading
    failures raise :class:`phi_api.errors.ModelLoadingError`; bad settings
    raise :class:`phi_api.config.ConfigError`.
    """
    settings = load_settings(overrides=config)
    configure_logging(settings.LOG_LEVEL)
    app = Flask(__name__)
    app.config.from_mapping(dataclasses.asdict(settings))
    app.config.from_mapping({key: value for key, value in (config or {}).items() if key not in app.config})
    app.config["MAX_CONTENT_LENGTH"] = settings.max_request_bytes
    app.json.sort_keys = False  # keep OpenAI's field order
    app.json.ensure_ascii = False

    app.extensions[extensions.SETTINGS] = settings
    app.extensions[extensions.VALIDATOR] = RequestValidator()
    app.extensions[extensions.LIMITER] = ConcurrencyLimiter(settings.MAX_CONCURRENT_REQUESTS)
    app.extensions[extensions.ENGINE] = engine if engine is not None else extensions.load_engine(settings)

    metrics = Metrics()
    app.extensions[extensions.METRICS] = metrics
    app.extensions[extensions.ENGINE].observers.append(metrics.observe_generation)

    CORS(app, origins=settings.cors_origins, methods=["GET", "POST", "OPTIONS"],
         allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-Id"],
         expose_headers=["X-Request-Id"], supports_credentials=True, max_age=600)
    register_request_logging(app)
    metrics.register(app)
    register_auth(app, settings.api_keys)
    register_error_handlers(app)
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    app.extensions[extensions.OPENAPI] = openapi.build(app)
    return app
