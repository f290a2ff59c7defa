"""Our own work on each step's logits: log-probabilities, OpenAI's penalties and logit_bias, min_p.

ONNX Runtime GenAI applies temperature, top-k, top-p, its repetition penalty
and any guidance grammar after these edits, when it samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from phi_api.engine.params import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability, and the most likely alternatives, in the model's own distribution."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class LogitsEditor:
    """Applies one generation's logits edits and records log-probabilities.

    Penalties as OpenAI defines them: for every token j already generated c[j]
    times, ``logit[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty``;
    ``logit_bias`` adds its value to each listed token's logit. Only the
    completion counts, not the prompt. ``min_p`` (vLLM's) drops the tokens
    whose probability at the request's temperature is below ``min_p`` times
    the most likely one's. Log-probabilities are taken before any edit: they
    describe the model's distribution, not the sampler's.
    """

    def __init__(self, params: SamplingParams) -> None:
        self._presence = params.presence_penalty
        self._frequency = params.frequency_penalty
        self._bias_ids = np.array([token for token, _ in params.logit_bias], dtype=np.int64)
        self._bias_values = np.array([value for _, value in params.logit_bias], dtype=np.float32)
        self._min_p_margin = (params.temperature * math.log(params.min_p)
                              if params.min_p > 0 and not params.greedy else None)
        self._top = params.logprobs
        self._counts: dict[int, int] = {}
        self._raw: np.ndarray | None = None
        self._normalizer = 0.0
        self._alternatives: tuple[tuple[int, float], ...] = ()

    def __call__(self, logits: np.ndarray) -> None:
        """Edit ``logits`` (one step's vector) in place."""
        if self._top is not None:
            self._record(logits)
        if self._bias_ids.size:
            logits[self._bias_ids] += self._bias_values
        if self._counts and (self._presence or self._frequency):
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            logits[ids] -= counts * self._frequency + self._presence
        if self._min_p_margin is not None:
            logits[logits < logits.max() + self._min_p_margin] = -np.inf

    def observe(self, token: int) -> TokenLogprob | None:
        """Record the token that was sampled; its log-probability record when asked for."""
        self._counts[token] = self._counts.get(token, 0) + 1
        if self._top is None or self._raw is None:
            return None
        return TokenLogprob(token, float(self._raw[token] - self._normalizer), self._alternatives)

    def _record(self, logits: np.ndarray) -> None:
        self._raw = logits.copy()
        peak = float(self._raw.max())
        self._normalizer = peak + math.log(float(np.exp(self._raw - peak).sum()))
        top = min(self._top, self._raw.size)
        if top > 0:
            best = np.argpartition(-self._raw, top - 1)[:top]
            best = best[np.argsort(-self._raw[best], kind="stable")]
            self._alternatives = tuple((int(token), float(self._raw[token] - self._normalizer)) for token in best)
