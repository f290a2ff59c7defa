"""WSGI entry point for tests: the real app and model, with an engine fault on demand.

A request with ``seed`` = ``FAIL_SEED`` gets a generator that raises inside the
engine after ``FAIL_AFTER_TOKENS`` tokens, as a broken model step would.
"""

from __future__ import annotations

from typing import Any

from phi_api.engine.oga import OgaError
from phi_api.serving import build_wsgi_app
from tests.support.faults import FAIL_AFTER_TOKENS, FAIL_SEED


class FailingGenerator:
    def __init__(self, real: Any) -> None:
        self._real = real
        self._tokens = 0

    def generate_next_token(self) -> int:
        if self._tokens >= FAIL_AFTER_TOKENS:
            raise OgaError("injected engine failure at /internal/path/model.onnx")
        self._tokens += 1
        return self._real.generate_next_token()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


app = build_wsgi_app()
_model = app.extensions["phi_api.engine"].model
_new_generator = _model.new_generator


def _maybe_failing(options: dict[str, Any], guidance: Any = None) -> Any:
    generator = _new_generator(options, guidance)
    return FailingGenerator(generator) if options.get("random_seed") == FAIL_SEED else generator


_model.new_generator = _maybe_failing
