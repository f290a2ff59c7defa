"""Speculative decoding from the prompt: each drafting row checks its draft in one step of its own.

On a CPU one decode step of one row costs almost as much as checking a few
tokens of that row in one step: the step reads every weight whatever it
computes. A row with a draft (:mod:`engine.sampling.draft`) therefore feeds its pending
token and the ``k`` draft tokens in one step, gets the logits after each of
them, and keeps the longest accepted run plus one token of the model's own
(:meth:`engine.sampling.logits.Sampler.verify`): between 1 and ``k + 1`` tokens for
about the price of one step.

Where the graph's attention takes several new tokens for each of several rows
(phi-api's operator: :attr:`engine.runtime.spec.DecoderSpec.multi_token_rows`), the
drafts are checked in the batched step itself (:meth:`Speculation.in_step`):
every row of a LongRoPE group brings its pending token and its draft, padded to
the step's common length, chosen where it pays (:mod:`engine.sched.stepcost`),
for a request alone too where checks give one-token steps' bits (``exact``:
phi-api's kernels multiply 8 token-rows a pass, so at Phi-3.5-mini's shape a
lone check of 9 tokens costs ~1.18x one of 8: 2.38 against 2.02 one-token steps).
ONNX Runtime's attention takes several new tokens on top of past context only
for a batch of one: there a drafting row's check is a step of its own, before the
batched step of every row; a LongRoPE group whose every row advanced this way
is not stepped again (:meth:`engine.sched.continuous.ContinuousBatch.decode`). Among many rows a
check costs time the whole batch waits: a draft is checked only where and as
far as that pays (:mod:`engine.sched.stepcost`), and otherwise scored against the tokens that
come (:meth:`engine.sampling.draft.Drafter.decline`); batch-invariant (``BATCH_INVARIANT``) on a graph whose
checks do not give one-token steps' bits, every row checks its drafts as it does alone, whatever the timings
(where they do, a graph of row-wise operators, whether a check is made changes no answer). Every token a check
keeps goes through the same checks as a token from the batched step (end of
sequence, stop strings, ``max_tokens``, grammar, cancellation), one at a
time, so a draft never carries a sequence past where it would have stopped.
The keys and values the check wrote past the kept tokens are overwritten by
the row's next step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from phi_api.engine.kv.reuse import ReusePolicy
from phi_api.engine.kv.rows import RowTable
from phi_api.engine.kv.sequence import Phase, Sequence, row_of
from phi_api.engine.runtime.session import ORT_ERRORS
from phi_api.engine.sched.drafts import DraftModel
from phi_api.engine.sched.endings import Endings
from phi_api.engine.sched.outputs import Outputs, trace
from phi_api.engine.sched.padding import PAD_TOKEN
from phi_api.engine.sched.stepcost import StepCosts, model_draft_cost


@dataclass(frozen=True)
class Speculation:
    """The drafting part of a batch's decode, with what it uses of its batch: the rows, the reuse mode (which of a
    row's tokens are reusable), the step costs, the output handling every kept token goes through, the endings of a
    row that fails, the batch's one ``step`` (timed into the costs), LongRoPE's switch, whether every row
    checks its drafts as when alone (``BATCH_INVARIANT`` where checks are not one-token steps' bits), and whether every
    step holds an even number of token-rows (``paired``: ONNX Runtime's matrix kernels compute rows in pairs)."""

    rows: RowTable
    policy: ReusePolicy
    costs: StepCosts
    outputs: Outputs
    endings: Endings
    step: Callable[..., np.ndarray]
    switch: int | None
    invariant: bool
    paired: bool = False
    drafts: DraftModel | None = None
    exact: bool = False  # a check gives each token one-token steps' bits: no choice of length changes an answer

    def advance(self) -> set[int]:
        """Check every running row that has a draft; the ids of the rows that advanced and still run."""
        advanced = set()
        for row in list(self.rows.group(0, self.rows.running)):
            if row.phase is not Phase.RUNNING:  # an earlier row's step finished it (it timed out, say)
                continue
            group = self._group(row)
            alone = self._alone(group, row)
            draft = row.drafter.propose(self._room(row), self._model_cost(row, alone))
            if not draft:
                continue
            if self.invariant or alone:
                length = len(draft)
            else:
                length = self.costs.check_length(len(draft), row.drafter.expected, len(group))
            if length < max(1, row.drafter.min_tokens):  # not worth a check (the request's n_min)
                row.drafter.decline(draft)
            else:
                try:
                    going_on = self._verify(row, draft[:length])
                except Exception as error:  # a bug of ours with this row ends this row only
                    self.endings.fail_row(row, trace(error))
                    continue
                if going_on:
                    advanced.add(id(row))
        return advanced

    def in_step(self, first: int, end: int) -> bool:
        """The running rows ``[first, end)`` (a LongRoPE group) advanced in one step that checks their drafts: each
        row brings its pending token and its draft, padded to the longest (and to an even number of token-rows where
        the step must be ``paired``); the tokens past a row's draft are computed and dropped (their keys and values are
        overwritten by the row's next step). False, with nothing done, when no draft is worth it: the caller takes the
        plain step."""
        rows = self.rows.group(first, end)
        odd = self.paired and len(rows) % 2 == 1  # then an even number of tokens a row: one may be padding
        space = min(self._space(row) for row in rows) - odd  # every row holds the step's padded tokens
        alone = self._alone(rows, rows[0])
        drafts = [row.drafter.propose(min(space, self._room(row)), self._model_cost(row, alone)) for row in rows]
        if alone:
            length = max(map(len, drafts))
            if self.exact:  # no length changes an answer: the one whose tokens, all kept, come fastest
                length = self.costs.batch_check_length([(len(d), float(len(d))) for d in drafts], len(rows)) or length
        else:
            length = self.costs.batch_check_length([(len(d), row.drafter.expected)
                                                    for row, d in zip(rows, drafts, strict=True) if d], len(rows))
        checked = []
        for row, draft in zip(rows, drafts, strict=True):
            worth = len(draft[:length]) >= max(1, row.drafter.min_tokens)  # a shorter one is not (n_min)
            if draft and not worth:
                row.drafter.decline(draft)
            checked.append(draft[:length] if worth else [])
        width = 1 + max(map(len, checked))
        if width == 1:
            return False
        width += odd and width % 2
        ids = np.array([[row.pending, *draft] + [PAD_TOKEN] * (width - 1 - len(draft))
                        for row, draft in zip(rows, checked, strict=True)], dtype=np.int64)
        started = self.costs.clock()
        try:
            logits = self.step(first, ids, np.array([row.length for row in rows]), prefill=False,
                               every_position=True)
        except ORT_ERRORS as error:
            detail = trace(error)
            for row in rows:
                self.outputs.finish(row, "error", detail)
            return True
        for row in rows:  # every row holds its pending token's key and value before any row moves
            row.fed(self.policy, len(rows))
        # From the last row back: a row that ends has the group's last row take its place (a copy of its keys and
        # values as far as its length), and by then that row has counted every token of its own the step kept.
        for index in reversed(range(len(rows))):
            row, draft = rows[index], checked[index]
            try:
                if draft:
                    row.drafter.checks_beside += len(rows) > 1
                    self._keep(row, logits[index, :len(draft) + 1], draft)
                else:
                    self.outputs.take_token(row, logits[index, 0])
            except Exception as error:  # a bug of ours with this row ends this row only
                self.endings.fail_row(row, trace(error))
        self.costs.observe_wide(len(rows) * width, self.costs.clock() - started)
        return True

    def _model_cost(self, row: Sequence, alone: bool) -> float | None:
        """What the draft model's draft would cost ``row``, in checks (None: it may not draft).

        Only for a request alone in its step (beside others, its own draft steps would hold the batch up), and where
        its draft's expected tokens a second beat a plain step's by the times measured (now and then where not, to
        time it again). Where rows check as alone, it drafts as alone whatever runs beside and whatever the timings
        (a draft there changes the answer's last bits): it costs nothing, and drafts wherever no n-gram matches or
        it keeps more."""
        if self.drafts is None:
            return None
        if self.invariant:
            return 0.0
        if not alone:
            return None
        cost = model_draft_cost(self.costs, row.drafter.expected, row.drafter.limit, self.drafts.seconds_per_token)
        return 0.0 if cost is None and self.drafts.passed() else cost

    def _group(self, row: Sequence) -> list[Sequence]:
        """The rows of the batched step ``row`` takes part in (its LongRoPE group)."""
        rows = self.rows
        return rows.group(rows.short, rows.running) if row.long else rows.group(0, rows.short)

    @staticmethod
    def _alone(group: list[Sequence], row: Sequence) -> bool:
        """Whether only ``row``'s request runs: then every draft is checked, whatever the timings, so that a
        request alone takes the same steps every time (its answer, seeded samples too, is the same)."""
        return all(other.request == row.request for other in group)

    def _room(self, row: Sequence) -> int:
        """The most draft tokens a check may hold: room for them and one token more, in ``max_tokens``, and in the
        row's :meth:`_space`."""
        return min(row.choice.params.max_tokens - row.generated - 1, self._space(row))

    def _space(self, row: Sequence) -> int:
        """The most tokens past the pending one a step may bring the row: room for them and one token more in the
        row, and under LongRoPE's switch for a short row."""
        space = self.rows.pool.tokens - row.length - 2
        if self.switch is not None and not row.long:
            space = min(space, self.switch - row.length - 1)
        return space

    def _verify(self, row: Sequence, draft: list[int]) -> bool:
        """Check ``draft`` in one step; act on the tokens it keeps. True while the row goes on."""
        ids = np.array([[row.pending, *draft]], dtype=np.int64)
        started = self.costs.clock()
        try:
            # not a prompt chunk: the same tokens as that many decode steps (the fake model tells them apart)
            logits = self.step(row_of(row), ids, np.array([row.length]), prefill=False, every_position=True)[0]
        except ORT_ERRORS as error:
            self.outputs.finish(row, "error", trace(error))
            return False
        row.fed(self.policy)  # the pending token is in
        going_on = self._keep(row, logits, draft)
        # timed with its choices: a sampled row's check draws at each position it reaches
        self.costs.observe_check(len(draft), self.costs.clock() - started)
        return going_on

    def _keep(self, row: Sequence, logits: np.ndarray, draft: list[int]) -> bool:
        """Act on what the logits after the row's pending token and each token of ``draft`` (``[len(draft) + 1,
        vocab]``) keep of it, and on the model's own token after. True while the row goes on."""
        outputs = self.outputs
        if not outputs.still_wanted(row):
            return False
        try:
            chosen = row.sampler.verify(logits, draft)
        except Exception as error:  # one sequence's sampler or grammar failing ends that sequence only
            outputs.finish(row, "error", trace(error))
            return False
        accepted = len(chosen) - 1  # verify() stops at the first token of the model's own, which it always gives
        row.drafter.record(len(draft), accepted)
        for index, (token, record) in enumerate(chosen):
            if not outputs.accept(row, token, record):
                return False
            if index < accepted:  # a kept draft token: the check wrote its key and value
                row.fed(self.policy)
        return True
