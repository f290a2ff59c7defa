"""How much of a prompt one engine iteration computes: a chunk that keeps other requests waiting little.

Each iteration of the engine prefills one chunk of one prompt, then advances
every running sequence by a token. A prompt chunk holds up everyone else for
as long as it computes: at Phi-3.5-mini's size a chunk of 64 tokens takes
1.3-1.8 s on two cores, against 0.1 s for a decode step.

- ``exact`` prefix reuse, and ``BATCH_INVARIANT``: whole chunks of ``chunk``
  tokens whatever the crowd, on a fixed grid (what makes reuse exact; see
  :mod:`engine.kv.reuse`), or, where cuts change no bits, from where the
  prompt resumed.
- Otherwise, when nothing else waits or runs: chunks of ``chunk`` tokens
  (fewer, larger steps compute a prompt fastest), on the grid (a request
  alone is cut the same way every time), or, where cuts change no bits
  (``free``: :attr:`engine.kv.reuse.ReusePolicy.free_cuts`), from where the
  prompt resumed (a conversation's next turn, resumed past its last answer,
  goes in one chunk rather than a few tokens up to the grid's line, each
  chunk a whole step of the model, then the rest); when something else waits or runs: as many tokens
  as fit in ``slice_seconds``, by the costs measured so far (a step's fixed
  cost, the time a 1-row decode step takes, plus a cost per prompt token),
  at least ``MIN_TOKENS``; a rest that fits in two slices goes in at once, so
  a short request is not held back by a decode step between its halves.

A long prompt's first chunk under LongRoPE (``first_chunk``) is never cut: its
keys must all be computed with the long factors.
"""

from __future__ import annotations

from phi_api.engine.kv.reuse import ReusePolicy
from phi_api.engine.sched.stepcost import MIN_TIMED_TOKENS, StepCosts

MIN_TOKENS = MIN_TIMED_TOKENS  # below this a chunk costs nearly a full step and computes almost nothing


class ChunkPlanner:
    """Chunk ends for prompts, planned from the engine's measured step costs (:mod:`engine.sched.stepcost`)."""

    def __init__(self, chunk: int, *, grid: bool, slice_seconds: float, costs: StepCosts, free: bool = False) -> None:
        self.chunk = max(1, chunk)
        self.grid = grid  # whole chunks whatever the crowd
        self.free = free  # whole chunks start where the prompt resumed, not on the grid's lines
        self.slice = slice_seconds
        self.costs = costs

    @classmethod
    def serving(cls, policy: ReusePolicy, *, invariant: bool, slice_seconds: float, costs: StepCosts) -> ChunkPlanner:
        """The planner a batch under ``policy`` takes: whole chunks whatever the crowd in ``exact`` mode and
        batch-invariant (``invariant``), on the grid unless cuts change no bits (:attr:`ReusePolicy.free_cuts`)."""
        return cls(policy.chunk, grid=policy.exact or invariant, slice_seconds=slice_seconds, costs=costs,
                   free=policy.free_cuts)

    def end(self, start: int, length: int, first_chunk: int, crowded: bool) -> int:
        """Where the chunk of a prompt of ``length`` tokens prefilled up to ``start`` ends."""
        if start < first_chunk:
            return min(length, first_chunk)
        bounded = self.bounded_tokens()
        if self.grid or not crowded or bounded >= self.chunk:  # a whole chunk (the slice may hold one)
            return min(length, start + self.chunk if self.free else (start // self.chunk + 1) * self.chunk)
        if length - start <= 2 * bounded:  # a short prompt's rest goes in at once: one wait of two slices at most
            return length
        return start + bounded

    def bounded_tokens(self) -> int:
        """Prompt tokens that fit in the time slice, by the costs measured so far."""
        floor, per_token = self.costs.step_floor, self.costs.per_token
        if floor is None or per_token is None:
            return self.chunk
        room = (self.slice - floor) / per_token
        return max(MIN_TOKENS, min(self.chunk, int(room + 1e-6)))  # 1e-6: 0.1 / 0.01 is 9.999...
