"""One request's inputs on their way through an encoder thread, shared by the request side (a greenlet) and the
thread: the thread fills its results and says when it has ended; the request side waits, or cancels."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from phi_api.engine.encoder.tokens import Tokens


class Encoding:
    """A request's inputs, and once ended its results: ``vectors`` (``[inputs, dims]``) or ``scores``
    (``[inputs]``), in the inputs' order. ``reason``: None while it runs, then ``stop`` (done), ``cancelled``,
    ``timeout`` or ``error``."""

    def __init__(self, inputs: list[Tokens], *, priority: int = 0, request_id: str = "-", timeout: float = 600.0,
                 notify: Callable[[], None] = lambda: None) -> None:
        self.inputs = inputs
        self.priority = priority
        self.request_id = request_id
        self.deadline = time.monotonic() + timeout
        self.submitted = time.monotonic()
        self.results: np.ndarray | None = None  # written by the encoder thread only
        self.reason: str | None = None
        self.error: str | None = None  # for the log only: never shown to clients
        self.seconds = 0.0  # from submission to the end
        self.done_tokens = 0  # tokens of the inputs encoded so far (what the key is charged, however it ends)
        self._left = len(inputs)
        self._notify = notify
        self._cancelled = False

    @property
    def tokens(self) -> int:
        """Tokens of every input, special tokens included (what the key is charged)."""
        return sum(len(one) for one in self.inputs)

    @property
    def ended(self) -> bool:
        return self.reason is not None

    def cancel(self) -> None:
        """Request side: stop it; the thread drops its inputs not yet encoded."""
        self._cancelled = True

    # The encoder thread's side ----------------------------------------------------------------------

    def dropped(self, now: float) -> str | None:
        """Why its waiting inputs are to be dropped (cancelled, timed out), if they are."""
        if self._cancelled:
            return "cancelled"
        return "timeout" if now > self.deadline else None

    def fill(self, index: int, result: np.ndarray) -> None:
        """Input ``index``'s result (a vector, or a row of scores); the last one ends the job."""
        if self.results is None:
            self.results = np.zeros((len(self.inputs), *result.shape), dtype=result.dtype)
        self.results[index] = result
        self.done_tokens += len(self.inputs[index])
        self._left -= 1
        if self._left == 0:
            self.end("stop")

    def end(self, reason: str, error: str | None = None) -> None:
        """It has ended (once: later ends are ignored)."""
        if self.reason is not None:
            return
        self.error, self.seconds = error, time.monotonic() - self.submitted
        self.reason = reason
        self._notify()
