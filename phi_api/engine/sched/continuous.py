"""One engine's continuous batch: what one iteration of the engine thread does.

Each iteration (:meth:`ContinuousBatch.iterate`) is decided, then executed, then its
results applied, each by a module of its own:

1. the decisions (:mod:`engine.sched.scheduler`): the waiting requests start, in
   order, while the key/value budget has room for them (:mod:`engine.kv.cache`
   gives up kept prefixes to make it), each from the longest prefix any row
   holds; and one prompt chunk is planned;
2. execution (here): the chunk is computed, then every running sequence
   advances by one token in one batched step (rows with a draft check it in a
   step of their own first: :mod:`engine.sched.verify`), every step through
   :meth:`ContinuousBatch.step`, which times it into the cost model;
3. the results (:mod:`engine.sched.outputs`): tokens chosen, text streamed,
   generations ended and reported.

A sequence joins the running rows as soon as its prompt is in and leaves them
as soon as it finishes, is cancelled or times out; its row is then kept for
reuse, or freed (:mod:`engine.kv.rows`).

LongRoPE (Phi-3.5): the graph switches to its long rotary factors when a
step's attention mask is wider than ``original_max_position_embeddings``.
Rows still short and rows already long cannot share a step, so the running
rows are kept in two groups, each stepped on its own. A short row that
reaches the switch is prefilled again whole, in one step (as ONNX Runtime
GenAI's own generator does), and joins the long group. A prompt longer than
the switch is prefilled with a first chunk that already crosses it.

Everything here runs on the engine thread; it reports through ``publish``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from phi_api.engine.choice import PromptLogprobs
from phi_api.engine.kv.cache import KVCache
from phi_api.engine.kv.disk import PrefixStore
from phi_api.engine.kv.ledger import Ledger
from phi_api.engine.kv.reuse import ReusePolicy
from phi_api.engine.kv.sequence import Phase, Request, Sequence, row_of
from phi_api.engine.runtime.model import Model
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.session import ORT_ERRORS, Decoder
from phi_api.engine.sampling.logits import prompt_records
from phi_api.engine.sampling.lookup import Histories
from phi_api.engine.sched.drafts import DraftModel
from phi_api.engine.sched.endings import Endings
from phi_api.engine.sched.outputs import Outputs, Publish, trace
from phi_api.engine.sched.padding import PAD_TOKEN, Padding
from phi_api.engine.sched.prefill import ChunkPlanner
from phi_api.engine.sched.scheduler import Chunk, Scheduler
from phi_api.engine.sched.verify import Speculation


class ContinuousBatch:
    """The rows, the waiting and prefilling requests, and the steps that advance them."""

    def __init__(self, model: Model, decoder: Decoder, pool: KVPool, ledger: Ledger, policy: ReusePolicy,
                 planner: ChunkPlanner, publish: Publish, draft_max: int = 0, disk: PrefixStore | None = None,
                 invariant: bool = False, history_tokens: int = 0, drafts: DraftModel | None = None) -> None:
        """``planner``'s cost model (:mod:`engine.sched.stepcost`) is the batch's: every step is timed into it;
        ``disk``: the disk tier under the kept prefixes, if any (:mod:`engine.kv.disk`); ``invariant``: a row's numbers
        do not depend on the other rows of its steps (``BATCH_INVARIANT``, :mod:`engine.sched.padding`);
        ``history_tokens``: each key's earlier answers kept to draft from (:mod:`engine.sampling.lookup`); ``drafts``:
        the draft model, if any (:mod:`engine.sched.drafts`)."""
        self.invariant = invariant
        self.model = model
        self.decoder = decoder
        self.kv = KVCache(pool, ledger, policy, disk)
        self.rows = self.kv.rows
        self.ledger = ledger
        self.policy = policy
        self.planner = planner
        self.publish = publish
        # Where a check gives each token one-token steps' bits (row-wise operators; phi-api's attention with an even
        # number of token-rows a step, batch-invariant: engine.sched.padding), drafts change no answer: any source
        # drafts, checks are made where they pay. Elsewhere, batch-invariant, only the request's own tokens (and its
        # prediction) draft, and every draft is checked as alone: timings and other keys change no answer.
        paired = invariant and not decoder.spec.row_wise
        exact_checks = decoder.spec.row_wise or (paired and decoder.spec.multi_token_rows)
        histories = Histories(history_tokens if draft_max and (exact_checks or not invariant) else 0)
        self.outputs = Outputs(model.info.eos_token_ids, self.kv, publish, histories)
        self.scheduler = Scheduler(model, self.kv, planner, self.outputs, draft_max, drafts)
        self.waiting = self.scheduler.waiting  # the same queue and list: the loop adds to it, tests look at them
        self.prefilling = self.scheduler.prefilling
        self._switch = decoder.spec.rope_switch
        self.costs = planner.costs
        self.padding = Padding(self.rows, self._switch) if paired else None  # odd steps take a padding row
        self.endings = Endings(self.waiting, self.prefilling, self.kv, self.outputs, publish)
        self.speculation = Speculation(self.rows, policy, self.costs, self.outputs, self.endings, self.step,
                                       self._switch, invariant and not exact_checks, paired, drafts, exact_checks)
        # Drafts checked within the batched step where the graph allows, unless rows must check theirs as alone.
        self._checks_in_step = decoder.spec.multi_token_rows and not self.speculation.invariant

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.rows.running)

    def iterate(self, after_admission: Callable[[], None] = lambda: None) -> bool:
        """One iteration, decided then executed: the waiting requests that fit start, and one prompt chunk is planned
        (:mod:`engine.sched.scheduler`), the chunk is computed (:meth:`prefill`), then every running sequence advances
        (:meth:`decode`); the outputs of each step go through :class:`engine.sched.outputs.Outputs`. False when there
        was nothing to do."""
        self.kv.upkeep(time.monotonic())
        self.scheduler.admit()
        after_admission()
        worked = bool(self.prefilling)
        chunk = self.scheduler.plan_chunk() if self.prefilling else None
        if chunk is not None:
            self.prefill(chunk)
        if self.rows.running:  # a prompt just completed by the chunk runs in this iteration's step too
            self.decode()
            worked = True
        return worked

    def check(self) -> None:
        """Raise AssertionError unless the rows' layout and the budget's books hold (tests run this after every
        iteration)."""
        self.kv.check([*self.rows.group(0, self.rows.running), *(s for r in self.prefilling for s in r.sequences)])
        for request in self.prefilling:
            assert request.leader.phase is Phase.PREFILLING
            assert request.leader.slot is not None and request.leader.slot >= self.rows.running
            assert request.leader.length == request.prefilled
        assert self.rows.free >= self.scheduler.promised_rows(), "rows promised to prefilling requests are taken"

    # Prefill ----------------------------------------------------------------------------------------

    def prefill(self, chunk: Chunk) -> None:
        """Compute a planned prompt chunk; a prompt whose last chunk it was starts running. A bug of ours on the way
        ends this request only (:meth:`Endings.fail_request`)."""
        try:
            self._prefill(chunk)
        except Exception as error:
            self.endings.fail_request(chunk.request, trace(error))

    def _prefill(self, chunk: Chunk) -> None:
        request, start, end = chunk
        leader, prompt = request.leader, request.prompt
        every = request.prompt_logprobs is not None
        try:
            logits = self.step(row_of(leader), prompt[start:end][None, :], np.array([start]), prefill=True,
                               every_position=every)
            logits = logits[0] if every else logits
        except ORT_ERRORS as error:
            self.outputs.end_request(request, "error", trace(error))
            return
        if request.prompt_logprobs is not None:  # each position's logits give the next prompt token's logprob
            targets = prompt[start + 1:end + 1]
            request.prompt_records += prompt_records(logits[:len(targets)], targets, request.prompt_logprobs)
            logits = logits[-1:]
        leader.prefilled(start, end, self.policy)
        request.prefilled = end
        self.kv.store(request)
        if end < len(prompt):
            self.prefilling.append(request)
            return
        self.start_running(request, logits[0])

    def start_running(self, request: Request, logits: np.ndarray) -> None:
        """The prompt is in: give each choice its row, its first token, and a place among the running."""
        leader = request.leader
        for sequence in request.sequences[1:]:
            self.rows.place(sequence, self.rows.free_slot(self.rows.running))
            self.rows.pool.copy(row_of(leader), row_of(sequence), leader.length)
            sequence.copied_from(leader)
        shared = len(request.sequences) > 1
        scored = None  # the prompt's records, made once and shared by its choices
        if request.prompt_logprobs is not None:
            scored = ((int(request.prompt[0]), None), *((record.token, record) for record in request.prompt_records))
        for sequence in request.sequences:
            self.rows.join(sequence)
            if scored is not None:
                sequence.choice.emit(PromptLogprobs(scored, sequence.choice.index))
            if sequence.choice.cancelled:
                self.outputs.finish(sequence, "cancelled")
            elif sequence.choice.params.max_tokens == 0:  # the prompt's log-probabilities were all that was asked
                self.outputs.finish(sequence, "length")
            else:
                self.outputs.take_token(sequence, logits.copy() if shared else logits)

    # Execution ------------------------------------------------------------------------------------

    def step(self, first: int, ids: np.ndarray, past: np.ndarray, *, prefill: bool, every_position: bool = False,
             timed: bool = True) -> np.ndarray:
        """The one place the decoder runs (:meth:`Decoder.step`); a prompt chunk is timed into the cost model by its
        tokens here. A decode step and a draft's check are timed by their callers, with the choices of their tokens
        (sampling, penalties, grammars: per token, part of what a check costs against a batched step)."""
        started = self.costs.clock()
        logits = self.decoder.step(self.rows.pool, first, ids, past, prefill, every_position=every_position)
        if timed and prefill:
            self.costs.observe_prefill(ids.shape[1], self.costs.clock() - started)
        return logits

    # Decode -----------------------------------------------------------------------------------------

    def decode(self) -> None:
        """Advance every running sequence in one batched step per LongRoPE group, long first. Drafts are checked in
        that step where the graph allows (:meth:`Speculation.in_step`); elsewhere rows with a draft go first, by as
        many tokens as their draft keeps (:mod:`engine.sched.verify`), and a group whose every row advanced so is not
        stepped again."""
        if self._switch is not None:
            for row in [row for row in self.rows.group(0, self.rows.short) if row.length >= self._switch]:
                self._cross(row)
        advanced = set() if self._checks_in_step else self.speculation.advance()
        # The long group first: its rows leaving move only rows of its own group.
        for first, end in ((self.rows.short, self.rows.running), (0, self.rows.short)):
            if all(id(row) in advanced for row in self.rows.group(first, end)):
                continue  # no rows, or every row advanced by its draft
            if not (self._checks_in_step and self.speculation.in_step(first, end)):
                # Batch-invariant, a row a check advanced rides along and takes nothing, as alone it is not stepped.
                self._step_rows(first, end, advanced if self.invariant else set())

    def _step_rows(self, first: int, end: int, riding: set[int]) -> None:
        rows = self.rows.group(first, end)
        started = self.costs.clock()
        pad = self.padding.plan(first, end) if self.padding else None
        ids = [[row.pending] for row in rows] + ([[PAD_TOKEN]] if pad else [])
        past = [row.length for row in rows] + ([pad.past] if pad else [])
        try:
            logits = self.step(first, np.array(ids, dtype=np.int64), np.array(past, dtype=np.int64), prefill=False)
        except ORT_ERRORS as error:
            detail = trace(error)
            for row in rows:
                self.outputs.finish(row, "error", detail)
            return
        finally:
            if self.padding:
                self.padding.done(pad)
        taking = [(index, row) for index, row in enumerate(rows) if id(row) not in riding]
        for _, row in taking:  # every row holds its new key and value before any row moves
            row.fed(self.policy, len(rows))
        chosen = greedy_choices(logits, [index for index, row in taking if row.sampler.plain_greedy], len(rows))
        for index, row in taking:
            try:
                self.outputs.take_token(row, logits[index], chosen.get(index))
            except Exception as error:
                self.endings.fail_row(row, trace(error))
        self.costs.observe_step(len(rows), self.costs.clock() - started)

    def _cross(self, row: Sequence) -> None:
        """LongRoPE: the row reaches the switch; prefill it again whole, with the long factors."""
        assert row.pending is not None
        sequence = np.array([*row.tokens, row.pending], dtype=np.int64)
        try:
            logits = self.step(row_of(row), sequence[None, :], np.array([0]), prefill=True, timed=False)
        except ORT_ERRORS as error:
            self.outputs.finish(row, "error", trace(error))
            return
        row.prefilled_again(self.policy)
        self.rows.regroup(row)
        try:
            self.outputs.take_token(row, logits[0])
        except Exception as error:
            self.endings.fail_row(row, trace(error))


def greedy_choices(logits: np.ndarray, greedy: list[int], rows: int) -> dict[int, int]:
    """The argmax of the rows (indices ``greedy``) that want the raw argmax, taken for the whole step at once; no
    copy of the logits when every one of the step's ``rows`` does (a padding row's logits come after them)."""
    if len(greedy) == rows:
        return dict(enumerate(np.argmax(logits, axis=1)[:rows].tolist()))
    return dict(zip(greedy, np.argmax(logits[greedy], axis=1).tolist(), strict=True)) if greedy else {}
