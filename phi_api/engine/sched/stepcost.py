"""What steps cost on this machine, measured as they run: the one cost model of an engine, and its clock.

Every step the engine takes is timed into it: a batched decode step by its
rows and a draft's check by the draft's length, each with the choices of its
tokens (a sampled row's check draws at every position it reaches: on a small
model that is a good part of its price), and a prompt chunk by its tokens. Two
decisions read these running averages: how long a prompt chunk may be while
others wait (:mod:`engine.sched.prefill`, from a one-row step's cost and the
cost of a prompt token), and whether checking a draft pays (below).

Where the graph's attention takes several new tokens for each of several
rows (phi-api's operator), the drafts of a group's rows are checked in its
batched step: every row brings its pending token and as many draft tokens as
the step's common length, padded (:meth:`StepCosts.batch_check_length`). Such a
step is timed by its token-rows (rows times tokens a row): what it costs is
mostly that many rows' matrix products. The length chosen is the one whose
expected tokens per second (each row's expected kept tokens up to that
length, plus one token of every row) beat every other one's and the plain
step's; a length not yet timed at that many token-rows counts at the cost of
the widest narrower step timed (no step costs less than a narrower one), so it
is tried, once, where it could pay best: a step's cost is not smooth in its
token-rows (phi-api's kernels multiply 8 a pass), and each length's own time
decides.

Elsewhere (ONNX Runtime's attention takes several new tokens on top of past
context only for a batch of one) a drafting row checks its draft in a step of
its own (:mod:`engine.sched.verify`). Alone, a row's check replaces its decode
step and gives the kept tokens and one more for little more than a step's
price. Among many rows the batched step gives every row a token for far
less than that many one-row steps (at 8 rows, 2.4x to 3.5x one row's
tokens per second here), and a check costs time the whole batch waits.

So among several rows a draft is checked when the tokens it is expected to
give per second of its check (its row's recent acceptance,
:attr:`engine.sampling.draft.Drafter.expected`, plus the model's own token) beat what
the batched step of that many rows gives per second, and only as far as
pays best: a check's cost grows with its tokens (int4 kernels compute
several rows as a matrix product, not one as a matrix-vector one), so
tokens the row is not expected to keep are left out. Both costs are running
averages of the steps as they ran; until a batch size's step has been timed
no check is made at that size (the first step tells the price to beat), and
a draft length not yet timed is tried once.

The rows of a request alone always check their drafts (the drafter's back-off
alone decides, :class:`engine.sched.verify.Speculation`): a request alone then
takes the same steps every time, whatever the timings, so it gets the same
answer every time (docs/identical-answers.md). Where a check gives each token
one-token steps' bits (phi-api's row-wise operators), no length changes an
answer, and a request alone checks as far as pays too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

_WEIGHT = 0.2  # of a new measurement in the running averages
_TOKEN_WEIGHT = 0.3  # of a new prompt chunk's cost per token
MIN_TIMED_TOKENS = 8  # a shorter prompt chunk costs nearly a whole step and tells little of a token's cost


class StepCosts:
    """Seconds of a batched decode step by its rows, of a draft's check by the draft's length, and of a prompt token
    beyond a step's fixed cost; ``clock`` times them (a test's fake clock makes plans independent of the machine)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.steps: dict[int, float] = {}
        self.checks: dict[int, float] = {}
        self.wide: dict[int, float] = {}  # a batched step with drafts, by its token-rows
        self.per_token: float | None = None  # None until measured, then > 0

    @property
    def step_floor(self) -> float | None:
        """Seconds of a one-row decode step: the fixed cost of any step."""
        return self.steps.get(1)

    def observe_step(self, rows: int, seconds: float) -> None:
        _observe(self.steps, rows, seconds)

    def observe_check(self, drafted: int, seconds: float) -> None:
        _observe(self.checks, drafted, seconds)

    def observe_wide(self, token_rows: int, seconds: float) -> None:
        _observe(self.wide, token_rows, seconds)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """A prompt chunk of ``tokens`` took ``seconds``."""
        floor = self.step_floor
        if tokens < MIN_TIMED_TOKENS or floor is None or seconds <= floor:
            return  # a chunk timed no slower than a noisy floor says nothing of a token's cost (never 0: divided by)
        measured = (seconds - floor) / tokens
        self.per_token = measured if self.per_token is None else \
            self.per_token + _TOKEN_WEIGHT * (measured - self.per_token)

    def check_length(self, drafted: int, expected: float, rows: int) -> int:
        """How many of a draft's ``drafted`` tokens to check, ``expected`` of them kept, in a batch of ``rows``:
        the timed length that gives the most tokens per second, if that beats the batched step (0: none)."""
        step = self.steps.get(rows)
        if step is None:
            return 0
        if drafted not in self.checks:
            return drafted
        rate, best = max(((min(expected, k) + 1) / self.checks[k], k) for k in range(1, drafted + 1)
                         if k in self.checks)
        return best if rate > rows / step else 0

    def batch_check_length(self, drafts: list[tuple[int, float]], rows: int) -> int:
        """Draft tokens a row to check in the batched step of ``rows`` rows, ``drafts`` the (length, expected kept)
        of its drafting rows: the length that gives the most tokens per second, if that beats the plain step (0:
        none). A length not timed yet is taken at the cost of the widest narrower step timed (a step costs no less
        than a narrower one): where that could pay best it is tried, and timed. A step's cost is not smooth in its
        token-rows (phi-api's kernels multiply 8 a pass), so each length's own time decides."""
        step = self.steps.get(rows)
        longest = max((length for length, _ in drafts), default=0)
        if step is None or longest == 0:
            return 0
        best_rate, best, floor = rows / step, 0, step
        for k in range(1, longest + 1):
            seconds = self.wide.get(rows * (k + 1))
            floor = seconds if seconds is not None else floor
            rate = (rows + sum(min(expected, length, k) for length, expected in drafts)) / floor
            if rate > best_rate or (best and rate == best_rate):  # a tie goes to the longer check
                best_rate, best = rate, k
        return best


def model_draft_cost(costs: StepCosts, expected: float, limit: int, seconds_per_token: float | None) -> float | None:
    """What a draft model's draft of ``limit`` tokens, ``expected`` of them kept, at ``seconds_per_token`` of the
    draft model's (None: not timed yet), costs in checks of its length (0 untimed: a try times it), if it gives more
    tokens a second than a row's plain step (alone in it); else None. Its check is timed as the batched step's of
    that width (or one more: a paired step's), or a check's of its own; a row's plain step, where a row alone always
    drafted, as the narrowest batched step timed."""
    check = costs.wide.get(limit + 1) or costs.wide.get(limit + 2) or costs.checks.get(limit)
    step = costs.steps.get(1) or (costs.wide[min(costs.wide)] if costs.wide else None)
    if seconds_per_token is None or check is None or step is None:
        return 0.0
    drafting = limit * seconds_per_token
    return drafting / check if (min(expected, limit) + 1) / (check + drafting) > 1 / step else None


def _observe(averages: dict[int, float], key: int, seconds: float) -> None:
    current = averages.get(key)
    averages[key] = seconds if current is None else current + _WEIGHT * (seconds - current)
