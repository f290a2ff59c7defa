"""A choice in flight (one of a request's n): what the request side and the engine thread share.

The engine thread appends events and calls ``notify``; the request side
drains them and may ``cancel``. ``collections.deque`` appends and pops are
atomic, and the only other shared state is the ``cancelled`` flag.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from phi_api.engine.params import SamplingParams
from phi_api.engine.sampling.guidance import Guide
from phi_api.engine.sampling.lookup import Index


@dataclass(frozen=True)
class TextDelta:
    """New text for the client and, when asked for, the (text, TokenLogprob) of each token it came from."""

    text: str
    logprobs: tuple = ()
    index: int = 0  # which choice (of a request's n) this is


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt's tokens and, for each after the first, its log-probability record given the tokens before it
    (the first has none: ``None``); before any text of the choice."""

    records: tuple  # (token, TokenLogprob | None) per prompt token
    index: int = 0


@dataclass(frozen=True)
class Finished:
    """The generation is over; always the last event of a choice.

    ``reason`` is ``stop`` (end of sequence or a stop string), ``length``
    (``max_tokens``), ``cancelled``, ``timeout``, ``capacity`` (it could not fit the key/value budget as it
    stood when its turn came), ``grammar`` (its grammar has no way on with the model's tokens: it needs text the
    vocabulary cannot spell) or ``error``.
    """

    reason: str
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token: float | None
    decode_seconds: float
    error: str | None = None  # for the log only: never shown to clients
    cached_tokens: int = 0  # prompt tokens whose KV cache came from an earlier generation
    index: int = 0
    batch_rows: float = 0.0  # rows per batched step this generation was advanced in, on average
    stop_string: str | None = None  # the stop string that ended it (reason "stop"), if one did
    drafted_tokens: int = 0  # prompt-lookup draft tokens it verified ...
    accepted_tokens: int = 0  # ... and kept
    draft_checks: int = 0  # steps that checked a draft ...
    draft_checks_beside: int = 0  # ... of which batched steps with other rows in them
    # Per draft source (prompt, prediction, history: engine.sampling.draft): tokens checked, and kept.
    draft_sources: tuple[tuple[str, int, int], ...] = ()
    queue_seconds: float | None = None  # from submission until its request started (None: it never did)
    first_of_prompt: bool = True  # the first choice of its prompt: the prompt's tokens count with it

    @property
    def predicted_accepted(self) -> int:
        """Draft tokens from the request's prediction that were kept."""
        return sum(kept for source, _, kept in self.draft_sources if source == "prediction")

    @property
    def predicted_rejected(self) -> int:
        """Draft tokens from the request's prediction that were checked and refused."""
        return sum(checked - kept for source, checked, kept in self.draft_sources if source == "prediction")

    @property
    def ok(self) -> bool:
        """Whether the generation gave an answer (it ended by itself or at ``max_tokens``)."""
        return self.reason in ("stop", "length")

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Generated tokens after the first, per second of decoding."""
        if self.completion_tokens < 2 or self.decode_seconds <= 0:
            return None
        return (self.completion_tokens - 1) / self.decode_seconds


Event = TextDelta | PromptLogprobs | Finished


class Choice:
    """One choice of a generation request, handed to the engine loop."""

    def __init__(self, prompt: np.ndarray, params: SamplingParams, *, timeout: float,
                 notify: Callable[[], None], request_id: str = "-", index: int = 0, guide: Guide | None = None,
                 priority: int = 0, cache_key: str = "", first_of_prompt: bool = True,
                 prediction: Index | None = None) -> None:
        self.prompt = prompt
        self.first_of_prompt = first_of_prompt  # its prompt's tokens count with it (once per prompt)
        self.cache_key = cache_key  # whose prefixes it may reuse and leave: only those of the same key
        self.priority = priority  # lower is sooner (vLLM's); batch lines come after every live request
        self.params = params
        self.guide = guide  # this choice's grammar state (engine.sampling.guidance.Guide), when constrained
        self.prediction = prediction  # its predicted output's tokens, indexed (off the engine thread), if any
        self.request_id = request_id
        self.index = index
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None  # when its request was admitted (engine.sched.scheduler)
        self.deadline = self.submitted_at + timeout
        self.cancelled = False
        self._events: collections.deque[Event] = collections.deque()
        self._notify = notify
        # Told of its end by the engine's report, on the hub, once the request side has stopped listening
        # (phi_api.engine.Generation.close): what a choice did counts however it ends.
        self.on_report: Callable[[Finished], None] | None = None

    def emit(self, event: Event) -> None:
        """Engine side: publish ``event`` and wake the request side."""
        self._events.append(event)
        self._notify()

    def drain(self) -> list[Event]:
        """Request side: take every event published so far."""
        events = []
        while self._events:
            events.append(self._events.popleft())
        return events

    def cancel(self) -> None:
        """Request side: stop this generation at the engine's next step."""
        self.cancelled = True
