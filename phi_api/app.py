"""The Flask application factory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider
from flask_cors import CORS

from phi_api.api import BLUEPRINTS, playground
from phi_api.engine import Engine, SharedBudget
from phi_api.errors import openai_body
from phi_api.models.loading import load_engine
from phi_api.models.registry import Loader
from phi_api.models.specs import ModelSpec
from phi_api.settings import load_settings
from phi_api.telemetry.logs import configure_logging
from phi_api.web import openapi
from phi_api.web.auth import register_auth
from phi_api.web.errors import render_errors
from phi_api.web.hooks import count_requests, register_request_logging, send_rate_headers
from phi_api.web.resources import init_app


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

    def load(spec: ModelSpec, memory: SharedBudget) -> Engine:
        return loader(spec) if loader is not None else load_engine(settings, spec, memory)

    resources = init_app(app, settings, load)
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
