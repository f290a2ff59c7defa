"""What the engine thread knows of each request: its prompt, its choices' rows, and the prefixes it keeps.

Three kinds of things occupy rows of the key/value pool (:mod:`engine.kv.rows`),
and each says which of its tokens' keys and values another request may reuse
(``reusable``; :mod:`engine.kv.reuse` sets it by the reuse mode):

- a :class:`Sequence`: one choice of a request, prefilling (its request's
  leader) or running;
- a :class:`Kept` prefix: the row of a finished sequence, kept for the next
  turn of its conversation or for requests that share its start.

A :class:`Request` groups the sequences of one submitted request: one prompt,
prefilled once into its leader's row, then ``n`` choices.
"""

from __future__ import annotations

import enum
import time

import numpy as np

from phi_api.engine.choice import Choice
from phi_api.engine.kv.reuse import Occupant, ReusePolicy
from phi_api.engine.runtime.model import Model
from phi_api.engine.sampling.draft import Drafter, DraftModelSource
from phi_api.engine.sampling.logits import Sampler
from phi_api.engine.sampling.lookup import Index
from phi_api.engine.sampling.text import TextAssembler

SHORT, LONG = "short", "long"  # LongRoPE regimes (every sequence is short in other models)


class Phase(enum.Enum):
    """Where a sequence is in its life (as llama.cpp's server's slot states)."""

    STARTING = "starting"  # made for an admitted request; a choice other than the leader has no row yet
    PREFILLING = "prefilling"  # the request's leader: its prompt goes into its row chunk by chunk
    RUNNING = "running"  # among the running rows: one token (or a draft's) per iteration
    FINISHED = "finished"  # ended; its row was kept for reuse or freed


def row_of(occupant: Occupant) -> int:
    """The row of an occupant that holds one (asking of one that holds none is a bug of the batch)."""
    assert occupant.slot is not None, f"{occupant!r} holds no row"
    return occupant.slot


class Sequence:
    """One choice of a request: its row in the pool, and how it chooses and spells its tokens."""

    def __init__(self, choice: Choice, model: Model, draft_max: int = 0, request: int = 0,
                 history: Index | None = None, drafts: DraftModelSource | None = None) -> None:
        self.choice = choice
        self.cache_key = choice.cache_key
        self.request = request  # the order of the request it is a choice of (its n choices share it)
        self.reserve = min(model.info.context_length, len(choice.prompt) + choice.params.max_tokens)
        self.booked = 0  # bytes of the key/value budget booked for it (engine.kv.ledger)
        self.tokens: list[int] = [int(token) for token in choice.prompt]  # prompt, then every fed token
        self.length = 0  # tokens whose keys and values the row holds
        self.reusable = 0  # of those, how many another request may reuse (see engine.kv.reuse)
        self.exact_upto = 0  # of those, how many were computed exactly as a cold prompt alone is
        self.slot: int | None = None
        self.pending: int | None = None  # chosen, not yet fed to the model
        self.generated = 0
        self.cached = 0
        self.first_token_at: float | None = None
        self.long = False
        self.phase = Phase.STARTING
        self.steps = 0  # batched steps this sequence was advanced in ...
        self.step_rows = 0  # ... and their rows, summed
        self.sampler = Sampler(choice.params, choice.prompt, model.info.eos_token_ids, guide=choice.guide)
        own = choice.params.draft_max
        self.drafter = Drafter(self.tokens, draft_max if own is None else own, choice.prediction, history,
                               min_tokens=choice.params.draft_min, model=drafts)
        self.stream = model.create_stream()
        self.text = TextAssembler(self.stream, choice.params.stop)

    @property
    def regime(self) -> str:
        return LONG if self.long else SHORT

    def prefix(self) -> np.ndarray:
        """The tokens whose keys and values may be reused."""
        return np.asarray(self.tokens[:self.reusable], dtype=np.int64)

    # How a sequence moves: these keep length, cached, exact_upto and reusable in agreement.

    def resume(self, point: int, exact_upto: int, policy: ReusePolicy) -> None:
        """Its row now holds its prompt's first ``point`` tokens, taken from another row (``exact_upto`` of them
        computed as a cold prompt alone is): they count as cached. The leader of a starting request begins its
        prefill so."""
        assert self.phase in (Phase.STARTING, Phase.PREFILLING), self.phase
        self.phase = Phase.PREFILLING
        self.length = self.cached = point
        self.exact_upto = exact_upto
        self.reusable = policy.prompt_reusable(point, exact_upto)

    def prefilled(self, start: int, end: int, policy: ReusePolicy) -> None:
        """A prompt chunk ``[start, end)`` is in its row."""
        assert self.phase is Phase.PREFILLING and start == self.length, (self.phase, start, self.length)
        self.length = end
        self.exact_upto = policy.exact_after(self.exact_upto, start, end, len(self.choice.prompt))
        self.reusable = policy.prompt_reusable(end, self.exact_upto)

    def copied_from(self, leader: Sequence) -> None:
        """Another choice of the same request: its row holds a copy of the leader's prompt."""
        self.length, self.cached, self.long = leader.length, leader.cached, leader.long
        self.exact_upto, self.reusable = leader.exact_upto, leader.reusable

    def fed(self, policy: ReusePolicy, rows_in_step: int = 1) -> None:
        """Its pending token is in: the step just taken (of ``rows_in_step`` rows) wrote its key and value."""
        assert self.pending is not None and self.phase is Phase.RUNNING
        self.tokens.append(self.pending)
        self.length += 1
        self.reusable = policy.decoded_reusable(self.length, self.exact_upto)
        self.steps += 1
        self.step_rows += rows_in_step

    def prefilled_again(self, policy: ReusePolicy) -> None:
        """LongRoPE: every token and the pending one were prefilled again whole, with the long factors (not on the
        grid: nothing of it is exact any more)."""
        assert self.pending is not None
        self.tokens.append(self.pending)
        self.length = len(self.tokens)
        self.exact_upto = 0
        self.reusable = policy.decoded_reusable(self.length, self.exact_upto)


class Kept:
    """A finished sequence's row, kept so that requests sharing its start reuse its keys and values."""

    def __init__(self, tokens: np.ndarray, regime: str, slot: int, used_at: int, exact_upto: int = 0,
                 cache_key: str = "") -> None:
        self.tokens = tokens
        self.cache_key = cache_key
        self.length = self.reusable = len(tokens)
        self.exact_upto = min(exact_upto, len(tokens))
        self.regime = regime
        self.slot: int | None = slot
        self.used_at = used_at  # for least-recently-used eviction, across the worker's engines
        self.touched = time.monotonic()  # when a request last used it: kept too long unused, it leaves

    def prefix(self) -> np.ndarray:
        return self.tokens


class Request:
    """The sequences of one submitted request: one prompt, prefilled once, then ``n`` choices."""

    def __init__(self, choices: list[Choice], model: Model, chunk: int, rope_switch: int | None, order: int) -> None:
        self.choices = choices
        self.prompt = np.asarray(choices[0].prompt, dtype=np.int64)
        self.cache_key = choices[0].cache_key
        self.sequences: list[Sequence] = []
        self.prefilled = 0
        self.order = order  # arrival order: of two requests sharing a prefix, the older computes it
        self.priority = choices[0].priority  # lower is sooner: admitted and prefilled before others
        self.arrived_ns = time.time_ns()  # the stored chunks of its prompt were last used then (engine.kv.disk)
        self.stored_chunks = 0  # chunks of its prompt stored on disk, or on their way there
        # Log-probabilities of the prompt's own tokens (echo): computed from every position of every chunk, so
        # such a request reuses no prefix.
        self.prompt_logprobs = choices[0].params.prompt_logprobs
        self.prompt_records: list = []
        self.reserve = min(model.info.context_length, len(self.prompt) + choices[0].params.max_tokens)
        self.regime, self.first_chunk = SHORT, 0
        if rope_switch is not None and len(self.prompt) > rope_switch:
            # A long prompt's first chunk must cross the switch: its first grid point past it. Reuse starts there.
            self.regime, self.first_chunk = LONG, (rope_switch // chunk + 1) * chunk

    @property
    def leader(self) -> Sequence:
        return self.sequences[0]

    @property
    def remaining(self) -> int:
        """Prompt tokens still to prefill."""
        return len(self.prompt) - self.prefilled

    def over(self) -> str | None:
        """Why the whole request ends before it runs (cancelled or timed out), if it does."""
        if all(choice.cancelled for choice in self.choices):
            return "cancelled"
        if time.monotonic() > self.choices[0].deadline:
            return "timeout"
        return None
