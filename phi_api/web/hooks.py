"""Request hooks of the app: an id and a log line per request, every request counted in the metrics, and its key's
rate-limit headers sent."""

from __future__ import annotations

import logging
import time
import uuid

from flask import Flask, Response, g, request

from phi_api.telemetry.logs import REQUEST_ID_HEADER, bind_request_id, reset_request_id, sane_request_id
from phi_api.telemetry.metrics import Metrics

log = logging.getLogger("phi_api.access")


# the methods counted by name: any other (a client may send any token) is "other", so no client adds series
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

def count_requests(app: Flask, metrics: Metrics) -> None:
    """Count every request: by route (the URL rule, not the raw path), method and status; and a key's requests
    answered with an error, by key name and status."""

    @app.before_request
    def _enter() -> None:
        metrics.in_flight.inc()
        g.metrics_counted = True
        g.metrics_started = time.perf_counter()

    @app.after_request
    def _leave(response: Response) -> Response:
        if not g.pop("metrics_counted", False):
            return response
        route = request.url_rule.rule if request.url_rule is not None else "unmatched"
        status = response.status_code
        method = request.method if request.method in METHODS else "other"  # any token is a method to gunicorn
        metrics.requests.labels(route, method, str(status)).inc()
        if status == 429:
            metrics.rate_limited.inc()
        key = g.get("api_key")
        if key is not None and status >= 400:
            metrics.ops.key_errors.labels(key.name, str(status)).inc()
        response.call_on_close(metrics.in_flight.dec)
        return response


def send_rate_headers(app: Flask) -> None:
    """Every answer to a request counted against a key carries its rate-limit headers (set by the admission)."""

    @app.after_request
    def _rate_headers(response: Response) -> Response:
        response.headers.update(g.get("rate_headers", {}))
        return response


def register_request_logging(app: Flask) -> None:
    """Give each request an id and log it once its response is fully sent."""

    @app.before_request
    def _start() -> None:
        g.request_id = sane_request_id(request.headers.get(REQUEST_ID_HEADER, ""))
        g.request_started = time.perf_counter()
        bind_request_id(g.request_id)

    @app.after_request
    def _finish(response: Response) -> Response:
        request_id = g.get("request_id") or uuid.uuid4().hex
        started = g.get("request_started", time.perf_counter())
        response.headers[REQUEST_ID_HEADER] = request_id
        method, path, status = request.method, request.path, response.status_code
        key = g.get("api_key")
        fields = {"method": method, "path": path, "status": status, "key": key.name if key is not None else None}

        def write_line() -> None:
            token = bind_request_id(request_id)
            try:
                elapsed = (time.perf_counter() - started) * 1000
                log.info("%s %s %d %.1fms", method, path, status, elapsed,
                         extra={"fields": {**fields, "duration_ms": round(elapsed, 1)}})
            finally:
                reset_request_id(token)

        response.call_on_close(write_line)
        return response
