"""WSGI entry point for tests: the real app and model, with an engine fault on demand.

A request with ``seed`` = ``FAIL_SEED`` gets a sequence whose token choice
raises inside the engine thread after ``FAIL_AFTER_TOKENS`` tokens, as a
broken step would; the other sequences of the batch go on.
"""

from __future__ import annotations

from typing import Any

from phi_api.engine.sched import sequence
from phi_api.server.serving import build_wsgi_app
from tests.support.faults import FAIL_AFTER_TOKENS, FAIL_SEED


class FailingSampler(sequence.Sampler):
    def observe(self, token: int) -> Any:
        if self.params.seed == FAIL_SEED and self._generated >= FAIL_AFTER_TOKENS:
            raise RuntimeError("injected engine failure at /internal/path/model.onnx")
        return super().observe(token)


sequence.Sampler = FailingSampler
app = build_wsgi_app()
