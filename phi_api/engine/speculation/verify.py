"""Speculative decoding from the prompt: each drafting row checks its draft in one step of its own.

On a CPU one decode step of one row costs almost as much as checking a few
tokens of that row in one step: the step reads every weight whatever it
computes. A row with a draft (:mod:`engine.draft`) therefore feeds its pending
token and the ``k`` draft tokens in one step, gets the logits after each of
them, and keeps the longest accepted run plus one token of the model's own
(:meth:`engine.logits.Sampler.verify`): between 1 and ``k + 1`` tokens for
about the price of one step.

The attention kernel takes several new tokens on top of past context only
for a batch of one, so a drafting row's check is a step of its own, before the
batched step of every row; a LongRoPE group whose every row advanced this way
is not stepped again (:meth:`engine.batch.Batch.decode`). Among many rows a
check costs time the whole batch waits: a draft is checked only where and as
far as that pays (:mod:`engine.stepcost`), and otherwise scored against the tokens that
come (:meth:`engine.draft.Drafter.decline`); batch-invariant (``BATCH_INVARIANT``), every
row checks its drafts as it does alone, whatever the timings. Every token a check
keeps goes through the same checks as a token from the batched step (end of
sequence, stop strings, ``max_tokens``, grammar, cancellation), one at a
time, so a draft never carries a sequence past where it would have stopped.
The keys and values the check wrote past the kept tokens are overwritten by
the row's next step.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from phi_api.engine.kv.rows import RowTable
from phi_api.engine.runtime.session import ORT_ERRORS
from phi_api.engine.sched.outputs import Outputs, trace
from phi_api.engine.sched.sequence import Phase, Reuse, Sequence, row_of
from phi_api.engine.sched.stepcost import StepCosts


class Stepping(Protocol):
    """What speculation needs of a batch (:class:`engine.batch.Batch`): its rows, its decoder, the step costs and
    the clock that times them, the reuse mode (which of a row's tokens are reusable) and the output handling every
    kept token goes through."""

    rows: RowTable
    decoder: Any
    invariant: bool  # BATCH_INVARIANT: every row checks its drafts as when alone
    costs: StepCosts
    outputs: Outputs

    @property
    def policy(self) -> Reuse: ...

    def step(self, first: int, ids: np.ndarray, past: np.ndarray, *, prefill: bool, every_position: bool = False,
             timed: bool = True) -> np.ndarray: ...

    @property
    def endings(self) -> Any: ...


class Speculation:
    """The drafting part of a batch's decode."""

    def __init__(self, batch: Stepping) -> None:
        self.batch = batch

    def advance(self) -> set[int]:
        """Check every running row that has a draft; the ids of the rows that advanced and still run."""
        advanced = set()
        for row in list(self.batch.rows.group(0, self.batch.rows.running)):
            if row.phase is not Phase.RUNNING:  # an earlier row's step finished it (it timed out, say)
                continue
            draft = row.drafter.propose(self._room(row))
            if not draft:
                continue
            group = self._group(row)
            if self.batch.invariant or self._alone(group, row):
                length = len(draft)
            else:
                length = self.batch.costs.check_length(len(draft), row.drafter.expected, len(group))
            if not length:
                row.drafter.decline(draft)
            else:
                try:
                    going_on = self._verify(row, draft[:length])
                except Exception as error:  # a bug of ours with this row ends this row only
                    self.batch.endings.fail_row(row, trace(error))
                    continue
                if going_on:
                    advanced.add(id(row))
        return advanced

    def _group(self, row: Sequence) -> list[Sequence]:
        """The rows of the batched step ``row`` takes part in (its LongRoPE group)."""
        rows = self.batch.rows
        return rows.group(rows.short, rows.running) if row.long else rows.group(0, rows.short)

    @staticmethod
    def _alone(group: list[Sequence], row: Sequence) -> bool:
        """Whether only ``row``'s request runs: then every draft is checked, whatever the timings, so that a
        request alone takes the same steps every time (its answer, seeded samples too, is the same)."""
        return all(other.request == row.request for other in group)

    def _room(self, row: Sequence) -> int:
        """The most draft tokens a check may hold: room for them and one token more, in ``max_tokens``, in the
        row, and under LongRoPE's switch for a short row."""
        switch = self.batch.decoder.spec.rope_switch
        room = min(row.choice.params.max_tokens - row.generated - 1, self.batch.rows.pool.tokens - row.length - 2)
        if switch is not None and not row.long:
            room = min(room, switch - row.length - 1)
        return room

    def _verify(self, row: Sequence, draft: list[int]) -> bool:
        """Check ``draft`` in one step; act on the tokens it keeps. True while the row goes on."""
        batch, outputs = self.batch, self.batch.outputs
        ids = np.array([[row.pending, *draft]], dtype=np.int64)
        try:
            # not a prompt chunk: the same tokens as that many decode steps (the fake model tells them apart)
            logits = batch.step(row_of(row), ids, np.array([row.length]), prefill=False, every_position=True)
        except ORT_ERRORS as error:
            outputs.finish(row, "error", trace(error))
            return False
        row.fed(batch.policy)  # the pending token is in
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
                row.fed(batch.policy)
        return True
