"""Where the app factory keeps its resources (engine, limiter, metrics, ...) on the Flask app.

Each resource's module has an ``init_app`` and an accessor next to it, as
Flask's tutorial does with its database; they all keep their object under
their own key in ``app.extensions`` through these two functions, and the
accessors fail loudly when an app was built without it.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, current_app


def keep(app: Flask, key: str, value: Any) -> Any:
    """Keep ``value`` on ``app`` under ``key``; returns it."""
    app.extensions[key] = value
    return value


def kept(key: str, app: Flask | None = None) -> Any:
    """What ``app`` (default: the current app) keeps under ``key``."""
    target = app if app is not None else current_app
    try:
        return target.extensions[key]
    except KeyError:
        raise RuntimeError(f"{key} is not set up on this app; build it with phi_api.app.create_app()") from None
