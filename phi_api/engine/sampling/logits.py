"""One sequence's choice of its next token: logits edits, masks, and sampling, all ours.

ONNX Runtime GenAI's sampler is not used: the engine runs the decoder graph
itself, rows of many requests in one step, so each row's logits go through
its own :class:`Sampler`, in this order:

1. log-probabilities are recorded from the raw logits (the model's own
   distribution, before any edit, as OpenAI reports them);
2. OpenAI's ``logit_bias``, ``presence_penalty`` and ``frequency_penalty``
   (over the completion so far), then the repetition penalty of ONNX Runtime
   GenAI and Hugging Face (over prompt and completion: a positive logit is
   divided by it, a negative one multiplied);
3. masks: end-of-sequence ids below ``min_tokens`` (always, with
   ``ignore_eos``), and a grammar's allowed tokens (:mod:`engine.sampling.guidance`);
4. vLLM's ``min_p`` at the request's temperature; then greedy (temperature
   0 or top-k 1: the most likely token) or sampling: temperature, top-k,
   top-p, drawn from the row's own seeded generator.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from phi_api.engine.params import SamplingParams, ThinkingBudget
from phi_api.engine.sampling.guidance import Guide

_TOP_P_CANDIDATES = 1024  # top-p usually keeps far fewer: sort these first, all only if they do not reach p
_DRAW_BLOCK = 256  # weights summed per block when drawing (49k tokens: 192 blocks)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability, and the most likely alternatives, in the model's own distribution."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class LogitsEditor:
    """Records log-probabilities and applies OpenAI's edits and the repetition penalty to one row's logits.

    Penalties as OpenAI defines them: for every token j already generated c[j]
    times, ``logit[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty``;
    ``logit_bias`` adds its value to each listed token's logit.
    """

    def __init__(self, params: SamplingParams, prompt: Iterable[int] = ()) -> None:
        self._presence = params.presence_penalty
        self._frequency = params.frequency_penalty
        self._repetition = params.repetition_penalty
        self._bias_ids = np.array([token for token, _ in params.logit_bias], dtype=np.int64)
        self._bias_values = np.array([value for _, value in params.logit_bias], dtype=np.float32)
        self._min_p_margin = (params.temperature * math.log(params.min_p)
                              if params.min_p > 0 and not params.greedy else None)
        self._top = params.logprobs
        self._counts: dict[int, int] = {}
        window = params.penalty_window
        if window == 0:  # Ollama's repeat_last_n 0: no repetition penalty
            self._repetition = 1.0
        # The last ``window`` tokens (prompt, then generated) when the penalty has a window; None: every token seen.
        self._recent: collections.deque[int] | None = None
        if self._repetition != 1.0 and window is not None and window > 0:
            self._recent = collections.deque((int(token) for token in prompt), maxlen=window)
        self._seen: set[int] = {int(token) for token in prompt} if self._repetition != 1.0 else set()
        if self._recent is not None:
            self._seen = set(self._recent)
        self._raw: np.ndarray | None = None
        self._normalizer = 0.0
        self._alternatives: tuple[tuple[int, float], ...] = ()

    def __call__(self, logits: np.ndarray) -> None:
        """Record, then apply the edits to ``logits`` (one step's vector) in place."""
        if self._top is not None:
            self._record(logits)
        if self._bias_ids.size:
            logits[self._bias_ids] += self._bias_values
        if self._counts and (self._presence or self._frequency):
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
            logits[ids] -= counts * self._frequency + self._presence
        if self._seen:
            ids = np.fromiter(self._seen, dtype=np.int64, count=len(self._seen))
            ids = ids[ids < logits.size]
            picked = logits[ids]
            with np.errstate(over="ignore", divide="ignore"):  # a vanishing penalty: +inf (drawn as the limit), quietly
                logits[ids] = np.where(picked > 0, picked / self._repetition, picked * self._repetition)

    def apply_min_p(self, logits: np.ndarray) -> None:
        """Drop the tokens whose probability at the request's temperature is below ``min_p`` times the most
        likely one's (after the masks, so the most likely allowed token is the reference)."""
        if self._min_p_margin is not None:
            logits[logits < logits.max() + self._min_p_margin] = -np.inf

    def observe(self, token: int) -> TokenLogprob | None:
        """Record the token that was chosen; its log-probability record when asked for."""
        self._counts[token] = self._counts.get(token, 0) + 1
        if self._recent is not None:
            self._recent.append(token)
            self._seen = set(self._recent)
        elif self._repetition != 1.0:
            self._seen.add(token)
        if self._top is None or self._raw is None:
            return None
        return TokenLogprob(token, float(self._raw[token] - self._normalizer), self._alternatives)

    def _record(self, logits: np.ndarray) -> None:
        self._raw = logits.copy()
        peak = float(self._raw.max())
        self._normalizer = peak + math.log(float(np.exp(self._raw - peak).sum()))
        top = min(self._top or 0, self._raw.size)
        if top > 0:
            best = np.argpartition(-self._raw, top - 1)[:top]
            best = best[np.argsort(-self._raw[best], kind="stable")]
            self._alternatives = tuple((int(token), float(self._raw[token] - self._normalizer)) for token in best)


def prompt_records(logits: np.ndarray, targets: np.ndarray, top: int) -> list[TokenLogprob]:
    """Log-probability records of ``targets[i]`` under ``logits[i]`` (``[positions, vocab]``), with the ``top`` most
    likely alternatives: the model's own distribution, as for generated tokens."""
    records = []
    for row, target in zip(logits, targets, strict=True):
        raw = row.astype(np.float64)
        peak = raw.max()
        normalizer = peak + math.log(float(np.exp(raw - peak).sum()))
        best = np.argpartition(-raw, top - 1)[:top] if 0 < top < raw.size else np.arange(raw.size)[:top]
        best = best[np.argsort(-raw[best], kind="stable")]
        records.append(TokenLogprob(int(target), float(raw[target] - normalizer),
                                    tuple((int(token), float(raw[token] - normalizer)) for token in best)))
    return records


class Sampler:
    """Chooses one sequence's tokens, step by step (see the module's docstring for the order)."""

    def __init__(self, params: SamplingParams, prompt: np.ndarray, eos_ids: frozenset[int], *,
                 guide: Guide | None = None, seed: int | None = None) -> None:
        self.params = params
        self._editor = LogitsEditor(params, prompt) if params.edits_logits else None
        self._eos = np.array(sorted(eos_ids), dtype=np.int64)
        self._guide = guide
        self._generated = 0
        chosen_seed = params.seed if params.seed is not None else seed
        self._rng = None if params.greedy else np.random.default_rng(_generator_seed(chosen_seed))
        self._scratch: np.ndarray | None = None  # sample()'s work buffer, made at the first draw
        self._budget = ThinkingCounter(params.thinking) if params.thinking is not None else None

    @property
    def plain_greedy(self) -> bool:
        """Whether the choice is the raw logits' argmax (what a batch can compute for all such rows at once)."""
        return (self.params.greedy and self._editor is None and self._guide is None and not self._masks_eos
                and self._budget is None)

    @property
    def guide_failure(self) -> str | None:
        """Why this sequence's grammar cannot continue, if it cannot."""
        return self._guide.failed if self._guide is not None else None

    @property
    def _masks_eos(self) -> bool:
        return self.params.ignore_eos or self._generated < self.params.min_tokens

    def choose(self, logits: np.ndarray) -> tuple[int, TokenLogprob | None]:
        """The next token from this step's ``logits`` (edited in place), and its log-probability record."""
        self._process(logits)
        token = self._pick(logits)
        return token, self.observe(token)

    def verify(self, rows: np.ndarray, drafts: list[int]) -> list[tuple[int, TokenLogprob | None]]:
        """Tokens chosen from ``rows`` (the logits after the pending token, then after each draft token, edited in
        place): each draft token kept while accepted, then one token of the model's own; at most
        ``len(drafts) + 1``.

        At each position the row chooses its token as it would without a draft, with its own next draw, and the
        draft token is kept when it is that token. For a draft that is one certain token this is the standard
        speculative-sampling rule (``x`` kept with probability ``p(x)``, else a token drawn from ``p`` without
        ``x``), and it draws exactly as decoding without drafts does, one draw a token: a seeded answer is the same
        with drafts on and off wherever a check's logits are a plain step's. Each position is processed after the
        tokens before it were accepted (penalties, masks and grammar see them), as without a draft.
        """
        chosen = []
        for position, logits in enumerate(rows):
            self._process(logits)
            token = self._pick(logits)
            chosen.append((token, self.observe(token)))
            if position >= len(drafts) or token != drafts[position]:
                break
        return chosen

    def _process(self, logits: np.ndarray) -> None:
        """Every logit processor, in the order of the module's docstring (before the choice itself)."""
        if self._editor is not None:
            self._editor(logits)
        if self._masks_eos and self._eos.size:
            logits[self._eos[self._eos < logits.size]] = -np.inf
        if self._guide is not None:
            self._guide.mask(logits)
        if self._editor is not None:
            self._editor.apply_min_p(logits)
        if self._budget is not None:
            self._budget.mask(logits)

    def observe(self, token: int) -> TokenLogprob | None:
        """Account for ``token`` (chosen here, or by a batch's argmax for a plain greedy row)."""
        self._generated += 1
        if self._budget is not None:
            self._budget.observe(token)
        if self._guide is not None:
            self._guide.consume(token)
        return self._editor.observe(token) if self._editor is not None else None

    def _pick(self, logits: np.ndarray) -> int:
        if not np.isfinite(logits).any():  # every token masked: end the sequence rather than pick garbage
            return int(self._eos[0]) if self._eos.size else 0
        if self._rng is None:
            return int(np.argmax(logits))
        if self._scratch is None or self._scratch.size != logits.size:
            self._scratch = np.empty(logits.size, dtype=np.float32)
        return sample(logits, self.params.temperature, self.params.top_k, self.params.top_p, self._rng,
                      self._scratch)


def _generator_seed(seed: int | None) -> int | None:
    """``seed`` as numpy's generators take it: they refuse negative seeds, which the APIs allow (int64; Ollama's
    clients send -1), so the seed is taken modulo 2**64, one-to-one over int64 and the identity on the
    non-negative seeds (whose streams stay what they were)."""
    return None if seed is None else seed % 2**64


class ThinkingCounter:
    """Counts a sequence's thinking tokens; once the budget is spent, the end marker is the only token left."""

    def __init__(self, budget: ThinkingBudget) -> None:
        self._budget = budget
        self._state = "thinking" if budget.inside else "before"  # before, thinking, over
        self._spent = 0

    def observe(self, token: int) -> None:
        if self._state == "before" and token == self._budget.start:
            self._state = "thinking"
        elif self._state == "thinking":
            self._state = "over" if token == self._budget.end else "thinking"
            self._spent += self._state == "thinking"

    def mask(self, logits: np.ndarray) -> None:
        if self._state == "thinking" and self._spent >= self._budget.tokens and self._budget.end < logits.size:
            end = logits[self._budget.end]
            logits.fill(-np.inf)
            logits[self._budget.end] = end if np.isfinite(end) else 0.0


_TINY = float(np.finfo(np.float32).tiny)  # the smallest temperature a float32 division takes (below: zero)


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator,
           scratch: np.ndarray | None = None) -> int:
    """Draw a token: logits at ``temperature``, restricted to the ``top_k`` most likely (0: all), then to the
    smallest set of those whose probability reaches ``top_p``. ``scratch`` (float32, as long as ``logits``)
    spares the allocations of the common case: every token finite, no ``top_k``, no ``top_p``.

    The weights are float32 (sums are float64): numpy's float64 ``exp`` has no
    vector code on AVX2 CPUs, and took 500 of the 790 microseconds a draw
    took on a 49k vocabulary; the draw itself is found block by block
    (:func:`_draw`) instead of through a running sum over the vocabulary.
    Measured side by side with ``timeit`` on this 2-core AVX2 machine: 790 ->
    231 us a row on average (top_p 0.9: 1655 -> 502 us); the best of 5 of
    ``python -m timeit -s "import numpy as np; from phi_api.engine.sampling.logits
    import sample; logits = (np.random.default_rng(0).standard_normal(49152)
    * 3).astype(np.float32); rng = np.random.default_rng(1)" "sample(logits,
    1.0, 0, 1.0, rng)"``, run on the previous version and on this one:
    553-571 -> 145-178 us. Every step of a batch draws
    each sampled row on the engine thread, between two model steps. The draws
    are the plain float64 definition's, but for one that lands within float
    rounding (about 1e-7) of a boundary between two tokens
    (tests/engine/sampling/test_logits.py).
    """
    logits = _capped(logits)
    # Shifted before the division: a tiny temperature (1e-40) sends every token but the most likely to -inf, its
    # limit, instead of overflowing them all to +inf.
    scaled = np.subtract(logits, logits.max(), out=scratch, dtype=np.float32)
    with np.errstate(over="ignore"):
        np.divide(scaled, max(temperature, _TINY), out=scaled)
    finite = np.isfinite(scaled)
    pool = None if finite.all() else np.flatnonzero(finite)  # None: every token
    if 0 < top_k < (scaled.size if pool is None else pool.size):
        pool = _top(scaled, top_k) if pool is None else pool[_top(scaled[pool], top_k)]
    weights = scaled if pool is None else scaled[pool]
    weights -= weights.max()
    np.exp(weights, out=weights)
    if top_p < 1.0:
        total = weights.sum(dtype=np.float64)
        head = _most_likely(weights, min(weights.size, _TOP_P_CANDIDATES))
        cumulative = np.cumsum(weights[head], dtype=np.float64) / total
        if cumulative[-1] < top_p and head.size < weights.size:  # rare: a very flat distribution
            head = _most_likely(weights, weights.size)
            cumulative = np.cumsum(weights[head], dtype=np.float64) / total
        cut = min(int(np.searchsorted(cumulative, top_p)) + 1, head.size)
        pool = head[:cut] if pool is None else pool[head[:cut]]
        weights = weights[head[:cut]]
    choice = _draw(weights, rng.random())
    return choice if pool is None else int(pool[choice])


def distribution(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens :func:`sample` may draw from ``logits`` and their probabilities (float64): the same pool (finite,
    ``top_k``, then ``top_p`` over the most likely first) and the same weights, as arrays a draft is checked
    against."""
    shifted = _capped(logits).astype(np.float64)
    shifted -= shifted.max()
    with np.errstate(over="ignore"):
        scaled = shifted / max(temperature, _TINY)
    pool = np.flatnonzero(np.isfinite(scaled))
    if 0 < top_k < pool.size:
        pool = pool[_top(scaled[pool], top_k)]
    weights = np.exp(scaled[pool] - scaled[pool].max())
    if top_p < 1.0:
        order = np.argsort(-weights, kind="stable")
        cumulative = np.cumsum(weights[order]) / weights.sum()
        order = order[:min(int(np.searchsorted(cumulative, top_p)) + 1, order.size)]
        pool, weights = pool[order], weights[order]
    return pool, weights / weights.sum()


def _capped(logits: np.ndarray) -> np.ndarray:
    """``logits``, unless a request's edits pushed some to +inf (a ``repetition_penalty`` of 1e-40 divides a
    positive logit by almost nothing): then those tokens, equally likely, are all that can be drawn (the limit)."""
    if logits.max() < np.inf:
        return logits
    return np.where(logits == np.inf, np.float32(0), np.float32(-np.inf)).astype(logits.dtype)


def _draw(weights: np.ndarray, fraction: float) -> int:
    """The index at which the running sum of ``weights`` passes ``fraction`` of their total (what
    ``searchsorted(cumsum(weights), fraction * total, side="right")`` finds): the sums of blocks of
    :data:`_DRAW_BLOCK` weights first, then the running sum within the one block the point falls in."""
    starts = np.arange(0, weights.size, _DRAW_BLOCK)
    blocks = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    target = fraction * blocks[-1]
    block = min(int(np.searchsorted(blocks, target, side="right")), blocks.size - 1)
    inner = np.cumsum(weights[starts[block]:starts[block] + _DRAW_BLOCK], dtype=np.float64)
    if block:
        inner += blocks[block - 1]
    return int(starts[block]) + min(int(np.searchsorted(inner, target, side="right")), inner.size - 1)


def _top(values: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` largest ``values``, in no particular order."""
    return np.argpartition(-values, count - 1)[:count]


def _most_likely(weights: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` largest ``weights``, largest first."""
    head = np.argpartition(-weights, count - 1)[:count] if count < weights.size else np.arange(weights.size)
    return head[np.argsort(-weights[head], kind="stable")]
