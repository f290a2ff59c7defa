"""Our own edits to each step's logits: OpenAI's penalties and logit_bias."""

from __future__ import annotations

import numpy as np

from phi_api.engine.params import SamplingParams


class LogitsEditor:
    """Applies OpenAI's ``presence_penalty``, ``frequency_penalty`` and ``logit_bias``.

    As OpenAI defines them: for every token j already generated c[j] times,
    ``logit[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty``;
    ``logit_bias`` adds its value to the logit of each listed token. Only the
    completion counts, not the prompt.
    """

    def __init__(self, params: SamplingParams) -> None:
        self._presence = params.presence_penalty
        self._frequency = params.frequency_penalty
        self._bias_ids = np.array([token for token, _ in params.logit_bias], dtype=np.int64)
        self._bias_values = np.array([value for _, value in params.logit_bias], dtype=np.float32)
        self._counts: dict[int, int] = {}

    def __call__(self, logits: np.ndarray) -> None:
        """Edit ``logits`` (one step's vector) in place."""
        if self._bias_ids.size:
            logits[self._bias_ids] += self._bias_values
        if self._counts and (self._presence or self._frequency):
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            logits[ids] -= counts * self._frequency + self._presence

    def observe(self, token: int) -> None:
        """Record a generated token."""
        self._counts[token] = self._counts.get(token, 0) + 1
