"""WSGI entry point for tests: the real app and model, with an engine fault on demand.

A request with ``seed`` = ``FAIL_SEED`` gets a sequence whose token choice
raises inside the engine thread after ``FAIL_AFTER_TOKENS`` tokens, as a
broken step would; the other sequences of the batch go on. One with
``FAIL_START_SEED`` raises as its prompt is in and its choices start running
(where a scheduling slip once failed the whole batch).
"""

from __future__ import annotations

from typing import Any

from phi_api.engine.kv import sequence
from phi_api.engine.sched import continuous
from phi_api.server.serving import build_wsgi_app
from tests.support.faults import FAIL_AFTER_TOKENS, FAIL_SEED, FAIL_START_SEED


class FailingSampler(sequence.Sampler):
    def observe(self, token: int) -> Any:
        if self.params.seed == FAIL_SEED and self._generated >= FAIL_AFTER_TOKENS:
            raise RuntimeError("injected engine failure at /internal/path/model.onnx")
        return super().observe(token)


_start_running = continuous.ContinuousBatch.start_running


def failing_start(self: continuous.ContinuousBatch, request: Any, logits: Any) -> None:
    if request.choices[0].params.seed == FAIL_START_SEED:
        raise RuntimeError("injected failure as a prompt's choices start, at /internal/path/rows.py")
    _start_running(self, request, logits)


sequence.Sampler = FailingSampler
continuous.ContinuousBatch.start_running = failing_start  # type: ignore[method-assign]
app = build_wsgi_app()
