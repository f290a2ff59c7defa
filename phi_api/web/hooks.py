"""Request hooks of the app: every request counted in the metrics, and its key's rate-limit headers sent."""

from __future__ import annotations

import time

from flask import Flask, Response, g, request

from phi_api.telemetry.metrics import Metrics


def count_requests(app: Flask, metrics: Metrics) -> None:
    """Count every request: by route (the URL rule, not the raw path), method and status."""

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
        metrics.requests.labels(route, request.method, str(status)).inc()
        if status == 429:
            metrics.rate_limited.inc()
        response.call_on_close(metrics.in_flight.dec)
        return response


def send_rate_headers(app: Flask) -> None:
    """Every answer to a request counted against a key carries its rate-limit headers (set by the admission)."""

    @app.after_request
    def _rate_headers(response: Response) -> Response:
        response.headers.update(g.get("rate_headers", {}))
        return response
