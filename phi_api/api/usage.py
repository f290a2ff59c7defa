"""GET /v1/usage/keys: what each API key used and may still use (keys with ``"admin": true`` only)."""

from __future__ import annotations

import time

from flask import Blueprint, Response, jsonify

from phi_api.limits.keys import LIMITS
from phi_api.web.auth import require_admin
from phi_api.web.openapi import operation
from phi_api.web.resources import get_keys

bp = Blueprint("usage", __name__)


@bp.get("/v1/usage/keys")
@operation("Usage and limits by API key name", statuses=(401, 403))
def key_usage() -> Response:
    require_admin("read every key's usage")
    keys = get_keys()
    totals = keys.usage.totals()
    now = time.time()
    data = [{"name": item.name, "limits": {limit: getattr(item, limit) for limit in LIMITS},
             **{"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0},
             **totals.get(item.name, {}), "now": keys.usage.windows(item.name, now)}
            for item in keys.keys]
    return jsonify({"object": "list", "data": data})
